"""The sbatch scripts in slurm/, submitted for real to the Slurm cluster on this machine.

CI starts a one-node cluster (`slurm/local_cluster.sh start` in .ci/run) and sets
T5_TRAINING_REQUIRE_SLURM=1, so that there these tests fail rather than skip when Slurm does
not answer. Elsewhere they skip without `sbatch` or a controller. The node has no GPU, so the
jobs ask for none (`--gpus-per-node=0`) and train on CPU processes.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

from absl.testing import absltest, parameterized

from tests import fixtures

SLURM = os.path.join(fixtures.REPO, "slurm")
REQUIRE_ENV = "T5_TRAINING_REQUIRE_SLURM"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}


def _slurm_missing() -> str | None:
    """Why no job can be submitted here, or None."""
    if shutil.which("sbatch") is None:
        return "Slurm is not installed (no sbatch on PATH); CI starts a cluster with slurm/local_cluster.sh"
    try:
        subprocess.run(["sinfo"], check=True, capture_output=True, text=True, timeout=30)
    except subprocess.CalledProcessError as err:
        return f"no Slurm controller answers (sinfo: {err.stderr.strip()}); start one with slurm/local_cluster.sh start"
    except subprocess.TimeoutExpired:
        return "no Slurm controller answers (sinfo timed out); start one with slurm/local_cluster.sh start"
    return None


class SlurmJobTest(fixtures.TempDirTestCase):
    """Each test submits a script and waits for the job; the logs go to the test's folder."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        reason = _slurm_missing()
        if reason and os.environ.get(REQUIRE_ENV):
            raise AssertionError(f"{REQUIRE_ENV} is set, but {reason}")
        if reason:
            raise unittest.SkipTest(reason)

    def _submit(self, script: str, sbatch_flags: list[str], script_args: list[str]) -> tuple[str, str]:
        """Submits slurm/<script>; returns the job id and the path of its log."""
        log = os.path.join(self.dir, f"{script}.log")
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
                   WANDB_MODE="offline", HF_DATASETS_CACHE=os.path.join(self.dir, "hf_cache"),
                   # the job's `accelerate` and `python` are this test's
                   PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        submitted = subprocess.run(
            ["sbatch", "--parsable", "--chdir", fixtures.REPO, "--output", log, "--gpus-per-node=0", *sbatch_flags,
             os.path.join(SLURM, script), *script_args],
            cwd=fixtures.REPO, env=env, capture_output=True, text=True, timeout=60, check=True)
        job = submitted.stdout.strip().split(";")[0]
        self.addCleanup(subprocess.run, ["scancel", job], capture_output=True)
        return job, log

    def _job(self, job: str) -> dict[str, str]:
        shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True,
                               timeout=30, check=True).stdout
        return dict(word.split("=", 1) for word in shown.split() if "=" in word)

    def _log(self, path: str) -> str:
        if not os.path.exists(path):
            return ""
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def _steps_done(self, log: str, total: int) -> int:
        """The last step the progress bar shows."""
        steps = re.findall(rf"\| *(\d+)/{total} ", self._log(log))
        return int(steps[-1]) if steps else 0

    def _wait(self, job: str, log: str, until, what: str, timeout: float = 180) -> dict[str, str]:
        """Polls the job until `until(job_fields)`; fails with the log's tail after `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self._job(job)
            if until(fields):
                return fields
            if fields["JobState"] in FINISHED:
                break
            time.sleep(0.3)
        self.fail(f"job {job} ({fields['JobState']}, reason {fields.get('Reason')}) did not {what}; its log "
                  f"ends:\n{self._log(log)[-3000:]}")

    def _wait_until_finished(self, job: str, log: str) -> None:
        fields = self._wait(job, log, lambda f: f["JobState"] in FINISHED, "finish")
        self.assertEqual((fields["JobState"], fields["ExitCode"]), ("COMPLETED", "0:0"), self._log(log)[-3000:])

    def _assert_trained_with_two_processes(self, out: str, steps: int) -> None:
        self.assertTrue(os.path.isfile(os.path.join(out, "final", "model.safetensors")))
        self.assertTrue(os.path.isfile(os.path.join(out, "eval_results.json")))
        with open(os.path.join(out, "train_results.json")) as f:
            epoch = json.load(f)["epoch"]
        # Two processes take 8 rows each per step: an epoch of 100 rows is 7 steps, not 13.
        self.assertEqual(epoch, round(steps / math.ceil(100 / (2 * 8)), 4))

    def test_single_node_trains_with_two_processes(self):
        out = os.path.join(self.dir, "run")
        job, log = self._submit("single_node.sbatch", ["--cpus-per-task=2"],
                                fixtures.fine_tune_args(out, "--max_steps", "4"))
        self._wait_until_finished(job, log)
        self.assertIn("start 1: 2 process(es), 0 GPU(s)", self._log(log))
        self._assert_trained_with_two_processes(out, 4)

    def test_two_tasks_train_as_two_machines(self):
        out = os.path.join(self.dir, "run")
        job, log = self._submit("multi_node.sbatch", ["--nodes=1", "--ntasks-per-node=2"],
                                fixtures.fine_tune_args(out, "--max_steps", "4"))
        self._wait_until_finished(job, log)
        self.assertIn("start 1: 2 machine(s) x 1 process(es)", self._log(log))
        self._assert_trained_with_two_processes(out, 4)

    def test_usr1_saves_requeues_and_the_job_resumes(self):
        out = os.path.join(self.dir, "run")
        job, log = self._submit("single_node.sbatch", ["--cpus-per-task=2"],
                                fixtures.fine_tune_args(out, "--max_steps", "60", "--per_device_train_batch_size", "2",
                                                        "--max_eval_samples", "8"))
        # A few finished steps on the progress bar: the workers' handlers are installed.
        self._wait(job, log, lambda f: self._steps_done(log, 60) >= 2, "start training")
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, timeout=30)
        self._wait(job, log, lambda f: f["JobState"] == "PENDING" and f["Restarts"] == "1", "requeue itself")
        # Slurm holds a requeued job back for two minutes (Reason=BeginTime); let it start sooner,
        # but not at once: restarted within about a second of being killed, the job is refused by
        # slurmd ("Job credential revoked") and ends FAILED.
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now+10"], check=True, timeout=30)
        self._wait_until_finished(job, log)

        text = self._log(log)
        saved = re.search(r"preempted: SIGUSR1 received: saved (\S+) at step (\d+);", text)
        self.assertIsNotNone(saved, text[-3000:])
        path, step = saved.group(1), int(saved.group(2))
        self.assertEqual(path, os.path.join(out, f"step-{step:06d}"))
        self.assertLess(step, 60)
        self.assertIn("preemption: USR1 received", text)
        self.assertIn(f"requeueing job {job}", text)
        self.assertIn("start 2: 2 process(es)", text)
        self.assertEqual(text.count(f"resumed from {path} at step {step}"), 1)
        self.assertEqual(self._job(job)["Restarts"], "1")
        self.assertTrue(os.path.isfile(os.path.join(out, "final", "model.safetensors")))

    @parameterized.parameters(
        ("single_node.sbatch", [], []),
        ("multi_node.sbatch", [], []),
        ("sweep_agent.sbatch", ["--array=0-9"], ["entity/project/sweepid"]),
    )
    def test_directives_are_accepted_by_slurm(self, script, flags, args):
        """Every #SBATCH line is checked by the controller (--test-only submits nothing)."""
        checked = subprocess.run(["sbatch", "--test-only", "--gpus-per-node=0", "--nodes=1", *flags,
                                  os.path.join(SLURM, script), *args],
                                 cwd=fixtures.REPO, capture_output=True, text=True, timeout=60)
        self.assertEqual(checked.returncode, 0, checked.stderr)
        self.assertIn("to start at", checked.stderr)


class BadUsageTest(parameterized.TestCase):
    """Mistakes end with one line before anything starts; no Slurm is needed to see it."""

    @parameterized.named_parameters(
        ("missing_sweep_id", "sweep_agent.sbatch", fixtures.REPO, {}, "usage: sbatch [--array=0-9] "
         "slurm/sweep_agent.sbatch ENTITY/PROJECT/SWEEP_ID (the id `wandb sweep` printed)"),
        ("unknown_script", "single_node.sbatch", fixtures.REPO, {"SCRIPT": "train.py"},
         "error: training script train.py not found in " + fixtures.REPO
         + "; set SCRIPT=fine_tune_t5.py or pre_train_t5.py"),
        ("outside_the_repository", "multi_node.sbatch", "/", {},
         "error: submit from the repository root (slurm/preemption.sh not found in /)"),
    )
    def test_one_line(self, script, cwd, env, expected):
        ran = subprocess.run(["bash", os.path.join(SLURM, script)], cwd=cwd, env=dict(os.environ, **env),
                             capture_output=True, text=True, timeout=60)
        self.assertEqual((ran.returncode, ran.stderr), (2, expected + "\n"))

    @parameterized.parameters("single_node.sbatch", "multi_node.sbatch", "sweep_agent.sbatch", "preemption.sh",
                              "local_cluster.sh")
    def test_bash_parses(self, script):
        checked = subprocess.run(["bash", "-n", os.path.join(SLURM, script)], capture_output=True, text=True)
        self.assertEqual(checked.returncode, 0, checked.stderr)


if __name__ == "__main__":
    absltest.main()
