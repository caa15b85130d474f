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
from t5_training.errors import EXIT_INTERRUPTED, EXIT_PREEMPTED
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


    def test_ctrl_c_saves_and_a_second_one_stops_at_once(self):
        # As a terminal leaves SIGINT, whatever the test runner set (pytest-xdist's workers ignore it).
        self.addCleanup(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, signal.default_int_handler))
        before = signal.getsignal(signal.SIGINT)
        said = []
        with interrupts.PreemptionHandler(said.append) as handler:
            os.kill(os.getpid(), signal.SIGINT)
            self.assertEqual(handler.received, "SIGINT")
            with self.assertRaises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        self.assertEqual(said, ["SIGINT received: stopping after this step and saving a checkpoint; press Ctrl-C "
                                "again to stop at once, without saving"])
        self.assertIs(signal.getsignal(signal.SIGINT), before)

    def test_a_run_that_ignores_sigint_keeps_ignoring_it(self):
        # As a run started in the background of a shell script does: Ctrl-C there is for the script.
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.addCleanup(signal.signal, signal.SIGINT, before)
        with interrupts.PreemptionHandler(lambda line: None) as handler:
            self.assertIs(signal.getsignal(signal.SIGINT), signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGINT)
            self.assertIsNone(handler.received)
        self.assertIs(signal.getsignal(signal.SIGINT), signal.SIG_IGN)


# The signal comes after step 3; the steps left are margin for a slow poll, and the resumed run's work.
STEPS = 50


class PreemptedRunTest(fixtures.TempDirTestCase):
    """A real fine_tune_t5.py process gets the signal a scheduler sends (or Ctrl-C), saves, exits, and resumes."""

    def _start(self, out):
        command = [sys.executable, "fine_tune_t5.py",
                   *fixtures.fine_tune_args(out, "--max_steps", str(STEPS), "--per_device_train_batch_size", "2",
                                            "--logging_steps", "1", "--max_eval_samples", "8")]
        log_path = os.path.join(self.dir, "stderr.txt")
        log = open(log_path, "w")
        self.addCleanup(log.close)
        # SIGINT as a terminal leaves it, whatever the test runner's process set (an ignored SIGINT is inherited).
        process = subprocess.Popen(command, cwd=fixtures.REPO, env=kill_runs.run_env(None), stdout=subprocess.PIPE,
                                   stderr=log, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
        self._wait_until_training(process, log_path)
        return command, process, log_path

    @parameterized.named_parameters(
        # SIGTERM, the signal every launcher and scheduler sends. SIGUSR1 takes the same handler
        # (checked for both signals above) and runs end to end in tests/slurm_test.py, as Slurm sends it.
        ("sigterm", "SIGTERM", EXIT_PREEMPTED, "preempted"),
        # Ctrl-C in a terminal: saved the same way, with the shell's code for SIGINT (nothing requeues it).
        ("ctrl_c", "SIGINT", EXIT_INTERRUPTED, "interrupted"))
    def test_the_signal_saves_exits_and_resume_finishes(self, name, code, prefix):
        out = os.path.join(self.dir, "run")
        command, process, log_path = self._start(out)
        process.send_signal(getattr(signal, name))
        stdout, _ = process.communicate(timeout=120)
        with open(log_path) as f:
            stderr = f.read()
        self.assertEqual(process.returncode, code, stderr[-2000:])
        self.assertIn(f"{name} received: stopping after this step", stdout)
        self.assertNotIn("Traceback", stderr)
        last = stderr.strip().splitlines()[-1]
        match = re.fullmatch(rf"{prefix}: {name} received: saved (\S+step-(\d+)) at step (\d+); rerun with "
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

    def test_a_second_ctrl_c_stops_at_once_in_one_line(self):
        out = os.path.join(self.dir, "run")
        _, process, log_path = self._start(out)
        process.send_signal(signal.SIGINT)
        # Two signals that arrive before Python's handler runs count as one: the second waits for the first's answer.
        for line in process.stdout:
            if "SIGINT received" in line:
                break
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)
        with open(log_path) as f:
            stderr = f.read()
        self.assertEqual(process.returncode, EXIT_INTERRUPTED, stderr[-2000:])
        self.assertNotIn("Traceback", stderr)
        self.assertEqual(stderr.strip().splitlines()[-1],
                         "interrupted: stopped at once (Ctrl-C), without saving; what was written before is intact, "
                         "and a training run continues from its newest checkpoint with --resume_from_checkpoint auto")
        self.assertFalse(os.path.exists(os.path.join(out, "final")))

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
