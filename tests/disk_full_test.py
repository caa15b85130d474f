"""A full disk is a bad input, not a lost run: a real ENOSPC on a small tmpfs, then a resume.

The output folder is a tmpfs of 1000 KiB that holds one checkpoint of a very small model
(about 680 KiB) but not two. The run saves at step 2, fails to write at step 4, and must end
with one line (exit code 2) that names the folder and the free space, leave the step-2
checkpoint complete and nothing half-written; after the tmpfs is enlarged, `auto` resumes from
step 2 and finishes with the losses of a run that never hit the full disk.
"""
import json
import os
import subprocess
import sys

from absl.testing import absltest

from t5_training import checkpoint, run_dir
from tests import fixtures

SCRIPT = os.path.join(fixtures.REPO, "fine_tune_t5.py")
# One layer each side, d_model 32: ~36k parameters, so a checkpoint is ~680 KiB.
MICRO = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"], "d_model": 32, "d_ff": 64, "d_kv": 16,
         "num_heads": 2, "num_layers": 1, "num_decoder_layers": 1, "relative_attention_num_buckets": 8,
         "dropout_rate": 0.0, "feed_forward_proj": "relu", "vocab_size": 1104, "pad_token_id": 0,
         "eos_token_id": 1, "decoder_start_token_id": 0}


def _mount(folder: str, size: str, remount: bool = False) -> subprocess.CompletedProcess:
    options = f"remount,size={size}" if remount else f"size={size}"
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", folder], capture_output=True, text=True)


class DiskFullTest(fixtures.TempDirTestCase):

    def setUp(self):
        super().setUp()
        self.disk = os.path.join(self.dir, "disk")
        os.makedirs(self.disk)
        # CI runs as root and sets T5_TRAINING_REQUIRE_TMPFS, so there a failed mount fails the test.
        if os.geteuid() != 0:
            self._cannot_mount("mounting a tmpfs needs root")
        mounted = _mount(self.disk, "1000k")
        if mounted.returncode != 0:
            self._cannot_mount(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
        self.addCleanup(subprocess.run, ["umount", self.disk], check=False)
        self.config = os.path.join(self.dir, "micro.json")
        with open(self.config, "w") as f:
            json.dump(MICRO, f)

    def _cannot_mount(self, reason: str) -> None:
        if os.environ.get("T5_TRAINING_REQUIRE_TMPFS") == "1":
            self.fail(reason)
        self.skipTest(reason)

    def _run(self, output_dir: str, *extra: str) -> subprocess.CompletedProcess:
        args = fixtures.fine_tune_args(output_dir, "--config_name", self.config, "--max_steps", "4",
                                       "--save_steps", "2", *extra)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=300)

    def test_a_full_disk_ends_in_one_line_and_the_run_resumes(self):
        out = os.path.join(self.disk, "run")
        failed = self._run(out)
        self.assertEqual(failed.returncode, 2, failed.stderr[-2000:])
        self.assertNotIn("Traceback", failed.stderr)
        last = failed.stderr.strip().splitlines()[-1]
        # At step 4 the run evaluates, exports best/ and saves: whichever write meets the full disk.
        self.assertRegex(last, r"^error: could not write .*run/(best|step-000004) \(No space left on device; "
                               r"\d+\.\d MiB free in .*run\); .*step-000002 is intact, and nothing half-written was "
                               r"left: free space and rerun with --resume_from_checkpoint auto$")
        # The earlier checkpoint is complete; what did not fit left nothing behind.
        names = os.listdir(out)
        self.assertEqual(sorted(n for n in names if n.startswith("step-")), ["step-000002"])
        self.assertEqual([n for n in names if "tmp" in n or n in ("best", "final")], [])
        self.assertTrue(checkpoint.is_complete(os.path.join(out, "step-000002")))

        self.assertEqual(_mount(self.disk, "16m", remount=True).returncode, 0)
        resumed = self._run(out, "--resume_from_checkpoint", "auto")
        self.assertEqual(resumed.returncode, 0, resumed.stderr[-2000:])
        self.assertIn("resumed from", resumed.stdout + resumed.stderr)
        self.assertIn("at step 2", resumed.stdout + resumed.stderr)

        reference = os.path.join(self.dir, "reference")  # never short of space
        self.assertEqual(self._run(reference).returncode, 0)
        self.assertEqual(run_dir.read_losses(out, 4), run_dir.read_losses(reference, 4))
        self.assertLen(run_dir.read_losses(out, 4), 4)
        self.assertTrue(os.path.isfile(os.path.join(out, "final", "model.safetensors")))


if __name__ == "__main__":
    absltest.main()
