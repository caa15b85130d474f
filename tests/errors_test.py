"""Tests for t5_training.errors.run_cli: one line, the exit code, and the process group at exit."""
import contextlib
import gc
import io
import os
import signal
import socket
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import torch.distributed as dist

from t5_training.errors import DivergedError, Preempted, UsageError, first_line, run_cli
from tests import fixtures


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FirstLineTest(absltest.TestCase):

    def test_the_first_line_or_the_kind(self):
        self.assertEqual(first_line(ValueError("  bad value \nmore detail")), "bad value")
        self.assertEqual(first_line(ValueError("\nbad value")), "bad value")
        self.assertEqual(first_line(OSError()), "OSError")  # indexing an empty message's lines raised IndexError
        self.assertEqual(first_line(KeyError("")), "''")  # str() of a KeyError quotes its key, even an empty one


class RunCliTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        # A one-process gloo group stands in for the group `accelerate launch` opens.
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        self.addCleanup(lambda: dist.is_initialized() and dist.destroy_process_group())

    @parameterized.named_parameters(
        # Every process stops after the same step: the group is closed, so that no process
        # aborts at exit (exit code 134 instead of 75) over a group left open.
        ("preempted", Preempted("saved"), 75, "preempted: saved", False),
        ("diverged", DivergedError("nan"), 3, "diverged: nan", False),
        # Bad input may stop one process while another waits in a collective, where closing hangs.
        ("usage", UsageError("bad flag"), 2, "error: bad flag", True),
    )
    def test_exit_code_one_line_and_the_process_group(self, error, code, line, still_open):
        def main(argv):
            raise error

        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            self.assertEqual(run_cli(main, []), code)
        self.assertEqual(stderr.getvalue(), line + "\n")
        self.assertEqual(dist.is_initialized(), still_open)

    @parameterized.parameters(None, UsageError("bad flag"))
    def test_the_objects_left_at_exit_are_frozen_out_of_the_last_collection(self, error):
        # Without it, every script's exit spends ~2 s of CPU in the interpreter's last collection.
        def main(argv):
            if error:
                raise error

        self.addCleanup(gc.unfreeze)
        gc.unfreeze()
        with contextlib.redirect_stderr(io.StringIO()):
            run_cli(main, [])
        self.assertGreater(gc.get_freeze_count(), 0)


class AnotherProcessLeavesAfterTheMainTest(absltest.TestCase):
    """A bad flag on every process of a launch: the main process prints it, and its exit ends the launch."""

    # Process 1 of 2 meets the error before any process group exists (as a bad flag is).
    CODE = ("import sys; from t5_training.errors import UsageError, run_cli\n"
            "def main(argv): raise UsageError('--learning_rate must be positive')\n"
            "sys.exit(run_cli(main, []))")

    def _start(self, **env):
        return subprocess.Popen([sys.executable, "-c", self.CODE], cwd=fixtures.REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **env})

    def test_it_waits_silently_until_the_launcher_stops_it(self):
        worker = self._start(RANK="1", WORLD_SIZE="2")
        # Still there after the main process would long have printed and left...
        with self.assertRaises(subprocess.TimeoutExpired):
            worker.wait(timeout=3)
        # ...until the launcher's SIGTERM, which ends it at once.
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=10)
        self.assertEqual((worker.returncode, out, err), (-signal.SIGTERM, "", ""))

    def test_alone_it_leaves_at_once_with_the_usage_code(self):
        worker = self._start(RANK="1", WORLD_SIZE="1")
        out, err = worker.communicate(timeout=30)
        self.assertEqual((worker.returncode, out, err), (2, "", ""))


if __name__ == "__main__":
    absltest.main()
