"""Preemption with real signals, and the kill points the resume tests crash runs with."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from absl.testing import absltest, parameterized

from t5_training import checkpoint, interrupts, kill_runs
from t5_training.errors import EXIT_PREEMPTED
from tests import fixtures


class PreemptionHandlerTest(parameterized.TestCase):

    @parameterized.parameters(signal.SIGTERM, signal.SIGUSR1)
    def test_records_the_signal_and_restores_the_previous_handler(self, sig):
        before = signal.getsignal(sig)
        said = []
        with interrupts.PreemptionHandler(said.append) as handler:
            os.kill(os.getpid(), sig)
            os.kill(os.getpid(), sig)  # a second one changes nothing
            self.assertEqual(handler.received, signal.Signals(sig).name)
        self.assertEqual(said, [f"{signal.Signals(sig).name} received: stopping after this step and saving a "
                                "checkpoint"])
        self.assertIs(signal.getsignal(sig), before)


# The signal comes after step 3; the steps left are margin for a slow poll, and the resumed run's work.
STEPS = 50


class PreemptedRunTest(fixtures.TempDirTestCase):
    """A real fine_tune_t5.py process gets the signal a scheduler sends, saves, exits 75, and resumes."""

    def test_sigterm_saves_exits_75_and_resume_finishes(self):
        # SIGTERM, the signal every launcher and scheduler sends. SIGUSR1 takes the same handler
        # (checked for both signals above) and runs end to end in tests/slurm_test.py, as Slurm sends it.
        name = "SIGTERM"
        out = os.path.join(self.dir, "run")
        command = [sys.executable, "fine_tune_t5.py",
                   *fixtures.fine_tune_args(out, "--max_steps", str(STEPS), "--per_device_train_batch_size", "2",
                                            "--logging_steps", "1", "--max_eval_samples", "8")]
        log_path = os.path.join(self.dir, "stderr.txt")
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, cwd=fixtures.REPO, env=kill_runs.run_env(None),
                                       stdout=subprocess.PIPE, stderr=log, text=True)
            self._wait_until_training(process, log_path)
            process.send_signal(getattr(signal, name))
            stdout, _ = process.communicate(timeout=120)
        with open(log_path) as f:
            stderr = f.read()
        self.assertEqual(process.returncode, EXIT_PREEMPTED, stderr[-2000:])
        self.assertIn(f"{name} received: stopping after this step", stdout)
        last = stderr.strip().splitlines()[-1]
        match = re.fullmatch(rf"preempted: {name} received: saved (\S+step-(\d+)) at step (\d+); rerun with "
                             r"--resume_from_checkpoint auto to continue", last)
        self.assertIsNotNone(match, last)
        saved, step = match.group(1), int(match.group(3))
        self.assertLess(step, STEPS)
        self.assertTrue(checkpoint.is_complete(saved))
        self.assertEqual(checkpoint.list_checkpoints(out)[-1], saved)
        self.assertFalse(os.path.exists(os.path.join(out, "final")))

        resumed = subprocess.run(command + ["--resume_from_checkpoint", "auto"], cwd=fixtures.REPO,
                                 env=kill_runs.run_env(None), capture_output=True, text=True, timeout=300)
        self.assertEqual(resumed.returncode, 0, resumed.stderr[-2000:])
        self.assertIn(f"resumed from {saved} at step {step}", resumed.stdout)
        self.assertTrue(os.path.isdir(os.path.join(out, "final")))

    def _wait_until_training(self, process, log_path, timeout=120):
        """Until the progress bar shows a few finished steps (so the handler is installed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(log_path) as f:
                steps = re.findall(rf"\| *(\d+)/{STEPS} ", f.read())
            if steps and int(steps[-1]) >= 3:
                return
            if process.poll() is not None:
                self.fail(f"the run ended before it could be signalled (exit {process.returncode})")
            time.sleep(0.05)
        self.fail("the run did not start training in time")


class KillPointTest(parameterized.TestCase):

    @parameterized.parameters(
        ("micro:5:2", ("micro", 5, 2)),
        ("eval:8", ("eval", 8, None)),
        ("save:10", ("save", 10, None)),
        ("", None),
        (None, None),
    )
    def test_parse(self, value, expected):
        self.assertEqual(interrupts.parse_kill_at(value), expected)

    @parameterized.parameters("micro:5", "eval:8:1", "train:3", "save:x")
    def test_malformed_is_refused(self, value):
        with self.assertRaises(ValueError):
            interrupts.parse_kill_at(value)


if __name__ == "__main__":
    absltest.main()
