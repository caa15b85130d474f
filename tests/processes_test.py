"""The launcher of the multi-process tests: a hung pair is killed whole and its output reported."""
import os
import tempfile
import time
from unittest import mock

import psutil
from absl.testing import absltest

from tests import processes

# Each worker records its pid, says so, and then hangs as a worker stuck in a collective would.
HANGING = """import os, sys, time
with open(os.path.join(sys.argv[1], f"worker-{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
print("worker started", os.environ["ACCELERATE_USE_CPU"], flush=True)
time.sleep(600)
"""


class LaunchTwoTest(absltest.TestCase):
    def test_a_hung_pair_is_killed_with_its_workers_and_its_output_reported(self):
        with tempfile.TemporaryDirectory() as folder:
            script = os.path.join(folder, "hang.py")
            with open(script, "w") as f:
                f.write(HANGING)
            started = time.perf_counter()
            with self.assertRaisesRegex(AssertionError, r"(?s)hang.py still ran after 30 s.*worker started 1"):
                processes.launch_two(script, [folder], timeout=30)
            self.assertLess(time.perf_counter() - started, 60)
            pids = [int(name.split("-")[1]) for name in os.listdir(folder) if name.startswith("worker-")]
            self.assertLen(pids, 2)
            for pid in pids:  # no worker left behind to slow the tests after it
                self.assertFalse(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)

    def test_the_limit_stays_within_pytest_timeouts(self):
        with mock.patch.dict(os.environ, {"PYTEST_TIMEOUT": "90"}):
            self.assertEqual(processes.timeout_s(), 72)
        with mock.patch.dict(os.environ, {"PYTEST_TIMEOUT": ""}):
            self.assertEqual(processes.timeout_s(), 600)


if __name__ == "__main__":
    absltest.main()
