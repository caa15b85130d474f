"""Resuming with another split of the same global batch: the same rows, the same losses, a step every step.

A checkpoint records its data position in rows of the epoch and the batch layout it was saved
with (t5_training.resume.continue_with_layout). These runs resume an uninterrupted run's step-2
checkpoint under another per-device batch, accumulation or number of processes, and compare
every later step's loss with the uninterrupted run's, on the CPU, where both are deterministic.
"""
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest, parameterized
from safetensors.torch import load_file

import fine_tune_t5
import pre_train_t5
from t5_training import checkpoint
from t5_training.errors import UsageError
from tests import fixtures, kill_harness

SCRIPT = os.path.join(fixtures.REPO, "fine_tune_t5.py")
COMMON = ["--max_steps", "4", "--save_steps", "1", "--save_total_limit", "0", "--dropout_rate", "0",
          "--lr_scheduler_type", "linear", "--warmup_steps", "1"]


def _losses(output_dir: str, step: int = 4) -> list[float]:
    with open(os.path.join(output_dir, f"step-{step:06d}", "train_state.json")) as f:
        return json.load(f)["losses"]


def _weights(output_dir: str, step: int) -> dict:
    return load_file(os.path.join(output_dir, f"step-{step:06d}", "model.safetensors"))


def _layout(batch: int, accumulation: int) -> list[str]:
    return ["--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", str(accumulation)]


def _assert_continues_exactly(test: absltest.TestCase, full: str, resumed: str) -> None:
    expected, got = _losses(full), _losses(resumed)
    test.assertLen(expected, 4)
    test.assertLen(got, 4)
    test.assertEqual(got[:2], expected[:2])  # restored from the checkpoint
    for step in (2, 3):  # steps 3 and 4, trained after the resume
        test.assertAlmostEqual(got[step], expected[step], delta=2e-5 * abs(expected[step]), msg=f"step {step + 1}")
    _assert_trains_every_step(test, full, resumed)


def _assert_trains_every_step(test: absltest.TestCase, full: str, resumed: str) -> None:
    # A step whose last micro-batch does not synchronise leaves the weights as they were.
    previous = _weights(full, 2)
    for step in (3, 4):
        weights = _weights(resumed, step)
        test.assertTrue(any(not (weights[k] == previous[k]).all() for k in weights), f"step {step} did not train")
        previous = weights


class ResumeWithAnotherSplitTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name

    @parameterized.named_parameters(
        ("8x2_to_4x4", (8, 2), (4, 4), []),
        ("8x2_to_4x4_group_by_length", (8, 2), (4, 4), ["--group_by_length"]),
        # accelerate would restore its micro-batch count as 2 x 2 = 4, not a multiple of 3.
        ("6x2_to_4x3", (6, 2), (4, 3), []),
        # 40 rows: step 3 takes the epoch's last 8 rows and the next epoch's first 8.
        ("8x2_to_4x4_across_an_epoch_end", (8, 2), (4, 4), ["--max_train_samples", "40"]),
    )
    def test_same_global_batch_continues_exactly(self, before, after, flags):
        full, resumed = os.path.join(self.dir, "full"), os.path.join(self.dir, "resumed")
        fine_tune_t5.main(fixtures.fine_tune_args(full, *_layout(*before), *COMMON, *flags))
        fine_tune_t5.main(fixtures.fine_tune_args(resumed, *_layout(*after), *COMMON, *flags,
                                                  "--resume_from_checkpoint", os.path.join(full, "step-000002")))
        _assert_continues_exactly(self, full, resumed)

    def test_another_global_batch_is_refused_with_both_values(self):
        full = os.path.join(self.dir, "full")
        fine_tune_t5.main(fixtures.fine_tune_args(full, *_layout(8, 2), *COMMON, "--max_steps", "2"))
        before = fixtures.snapshot(self.dir)
        with self.assertRaisesRegex(UsageError, r"global batch of 16 \(8 per device x 2 accumulation x 1 processes\), "
                                                r"but this run has 8 \(4 per device x 2 accumulation x 1 processes\)"
                                    ) as raised:
            fine_tune_t5.main(fixtures.fine_tune_args(os.path.join(self.dir, "other"), *_layout(4, 2), *COMMON,
                                                      "--resume_from_checkpoint", os.path.join(full, "step-000002")))
        self.assertNotIn("\n", str(raised.exception))
        self.assertEqual(fixtures.snapshot(self.dir), before)  # nothing written, not even the new folder


    def test_an_epoch_of_short_last_batches_warns_and_trains(self):
        # 36 rows: 8 x 2 ends each epoch with a batch of 4 rows, 4 x 4 does not, so the step
        # across the epoch end differs from the uninterrupted run's; the others do not.
        full, resumed = os.path.join(self.dir, "full"), os.path.join(self.dir, "resumed")
        fine_tune_t5.main(fixtures.fine_tune_args(full, *_layout(8, 2), *COMMON, "--max_train_samples", "36"))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            fine_tune_t5.main(fixtures.fine_tune_args(resumed, *_layout(4, 4), *COMMON, "--max_train_samples", "36",
                                                      "--resume_from_checkpoint", os.path.join(full, "step-000002")))
        warnings = [line for line in printed.getvalue().splitlines() if line.startswith("warning:")]
        self.assertEqual(warnings, ["warning: the epoch's 36 rows are not a whole number of micro-batches of both 16 "
                                    "(8 per device x 2 accumulation x 1 processes) and 16 (4 per device x 4 "
                                    "accumulation x 1 processes): the step across each epoch end takes other rows "
                                    "than the uninterrupted run's (a short last batch), and --num_train_epochs may "
                                    "count a step more or fewer; every other step is the same"])
        _assert_trains_every_step(self, full, resumed)


class OlderCheckpointTest(absltest.TestCase):
    """Checkpoints written before positions were counted in rows hold `batches_in_epoch` only."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.full = os.path.join(cls.tmp.name, "full")
        fine_tune_t5.main(fixtures.fine_tune_args(cls.full, *_layout(8, 2), *COMMON))
        # What the earlier version wrote at step 2: 4 micro-batches of 8 into the epoch.
        cls.legacy = os.path.join(cls.tmp.name, "legacy", "step-000002")
        shutil.copytree(os.path.join(cls.full, "step-000002"), cls.legacy)
        state_file = os.path.join(cls.legacy, checkpoint.STATE_FILE)
        with open(state_file) as f:
            state = json.load(f)
        assert (state.pop("samples_in_epoch"), state.pop("batch_layout")["per_device"]) == (32, 8), state
        state["batches_in_epoch"] = 4
        with open(state_file, "w") as f:
            json.dump(state, f)
        manifest = os.path.join(cls.legacy, checkpoint.MANIFEST)
        with open(manifest) as f:
            listed = json.load(f)
        listed["files"][checkpoint.STATE_FILE] = os.path.getsize(state_file)
        with open(manifest, "w") as f:
            json.dump(listed, f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    def test_resumes_with_the_batch_it_was_trained_with(self):
        resumed = os.path.join(self.tmp.name, "resumed")
        fine_tune_t5.main(fixtures.fine_tune_args(resumed, *_layout(8, 2), *COMMON, "--resume_from_checkpoint",
                                                  self.legacy))
        _assert_continues_exactly(self, self.full, resumed)

    def test_another_split_is_refused_in_one_line(self):
        for batch, accumulation, told in ((4, 4, "4 accumulation"), (16, 1, "2 accumulation"),
                                          (4, 2, "32 rows in 2 steps")):
            with self.subTest(batch=batch, accumulation=accumulation):
                with self.assertRaisesRegex(UsageError, rf"written before batch splits were recorded .*{told}") as raised:
                    fine_tune_t5.main(fixtures.fine_tune_args(
                        os.path.join(self.tmp.name, "other"), *_layout(batch, accumulation), *COMMON,
                        "--resume_from_checkpoint", self.legacy))
                self.assertNotIn("\n", str(raised.exception))
                self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "other")))


class PretrainingResumeTest(parameterized.TestCase):
    """Span corruption draws each row's noise from the row's own generator, whatever its batch."""

    @parameterized.named_parameters(("packed_in_memory", False), ("streamed", True))
    def test_4x2_resumes_as_2x4(self, streaming):
        with tempfile.TemporaryDirectory() as folder:
            args = list(kill_harness.pre_train_scenario(folder, streaming=streaming).args)
            full, resumed = os.path.join(folder, "full"), os.path.join(folder, "resumed")
            pre_train_t5.main(args + ["--output_dir", full, *_layout(4, 2), *COMMON])
            pre_train_t5.main(args + ["--output_dir", resumed, *_layout(2, 4), *COMMON,
                                      "--resume_from_checkpoint", os.path.join(full, "step-000002")])
            _assert_continues_exactly(self, full, resumed)


class ResumeOnFewerProcessesTest(absltest.TestCase):

    def test_two_processes_resume_as_one_with_twice_the_accumulation(self):
        with tempfile.TemporaryDirectory() as folder:
            two, one = os.path.join(folder, "two"), os.path.join(folder, "one")
            env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
            launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                      "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                      "--main_process_port", "0", SCRIPT]
            done = subprocess.run(launch + fixtures.fine_tune_args(two, *_layout(4, 1), *COMMON), env=env,
                                  capture_output=True, text=True, timeout=600)
            self.assertEqual(done.returncode, 0, done.stderr[-3000:])
            fine_tune_t5.main(fixtures.fine_tune_args(one, *_layout(4, 2), *COMMON,
                                                      "--resume_from_checkpoint", os.path.join(two, "step-000002")))
            _assert_continues_exactly(self, two, one)


if __name__ == "__main__":
    absltest.main()
