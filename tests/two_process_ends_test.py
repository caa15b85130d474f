"""tools/two_process_ends.py: runs two-process pairs and counts how each ended (docs/development.md)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import uuid

import psutil
from absl.testing import absltest, parameterized

from tests import fixtures

TOOL = os.path.join(fixtures.REPO, "tools", "two_process_ends.py")
_MARK = "TWO_PROCESS_ENDS_TEST"  # in the environment of every process a test's run starts


def _marked(process: psutil.Process, mark: str) -> bool:
    try:
        return process.environ().get(_MARK) == mark
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def _tool():
    """tools/ is no package: the script is loaded from its path, as `python tools/two_process_ends.py` runs it."""
    spec = importlib.util.spec_from_file_location("two_process_ends", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ClassifyTest(parameterized.TestCase):
    @parameterized.parameters(
        (0, "", "ended"),
        (-6, "", "aborted"),
        (1, "terminate called without an active exception\n", "aborted"),
        (1, "exitcode  : -6 (pid: 12)\nerror_file: <N/A>\ntraceback : Signal 6 (SIGABRT) received by PID 12", "aborted"),
        (1, "error: --learning_rte is not a flag", "failed"),
    )
    def test_outcome(self, returncode, stderr, outcome):
        self.assertEqual(_tool().classify(returncode, stderr), outcome)


class ParseArgsTest(absltest.TestCase):
    def test_a_folder_that_is_no_checkout_is_refused(self):
        with tempfile.TemporaryDirectory() as folder, self.assertRaises(SystemExit) as exit_:
            _tool().parse_args(["--repo", folder])
        self.assertEqual(exit_.exception.code, 2)

    def test_no_runs_is_refused(self):
        with self.assertRaises(SystemExit):
            _tool().parse_args(["--runs", "0"])


class RunTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.mark = uuid.uuid4().hex

    def _run(self, *flags: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
        with tempfile.TemporaryDirectory() as folder:
            log = os.path.join(folder, "ends.jsonl")
            done = subprocess.run([sys.executable, TOOL, "--runs", "1", "--streams", "1", "--log", log, *flags],
                                  capture_output=True, text=True, timeout=300, env={**os.environ, _MARK: self.mark})
            with open(log, encoding="utf-8") as f:
                return done, [json.loads(line) for line in f]

    def test_a_pair_that_ends_is_counted_as_ended(self):
        done, records = self._run()
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        self.assertIn("1 ended, 0 hung, 0 aborted, 0 failed", done.stdout)
        self.assertEqual([r["outcome"] for r in records], ["ended"])

    def test_a_pair_past_its_limit_is_killed_and_counted_as_hung(self):
        with tempfile.TemporaryDirectory() as checkout:
            # A checkout whose script never ends: both workers start, print, and sleep.
            with open(os.path.join(checkout, "fine_tune_t5.py"), "w", encoding="utf-8") as f:
                f.write("import time\nprint('started', flush=True)\ntime.sleep(3600)\n")
            done, records = self._run("--repo", checkout, "--limit", "20")
        self.assertEqual(done.returncode, 1)
        self.assertIn("0 ended, 1 hung", done.stdout)
        self.assertEqual(records[0]["outcome"], "hung")
        # Launcher and workers killed (torch's agent starts the workers in sessions of their own):
        # none of the processes started under this test's mark outlives the run.
        self.assertEqual([p for p in psutil.process_iter() if _marked(p, self.mark)], [])

if __name__ == "__main__":
    absltest.main()
