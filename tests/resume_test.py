"""Resuming with another split of the same global batch: the same rows, the same losses, a step every step.

A checkpoint records its data position in rows of the epoch and the batch layout it was saved
with (t5_training.resume.continue_with_layout). These runs resume an uninterrupted run's step-2
checkpoint under another per-device batch, accumulation or number of processes, and compare
every later step's loss with the uninterrupted run's, on the CPU, where both are deterministic.
Pretraining draws each row's mask, prefix split and denoiser from (seed, the row's chunk id), so
its resumed runs repeat the losses too.
"""
import os
import subprocess
import sys
import tempfile

from absl.testing import absltest, parameterized
from safetensors.torch import load_file

import fine_tune_t5
import pre_train_t5
from t5_training import run_dir
from t5_training.errors import UsageError
from tests import fixtures

SCRIPT = os.path.join(fixtures.REPO, "fine_tune_t5.py")
COMMON = ["--max_steps", "4", "--save_steps", "1", "--save_total_limit", "0", "--dropout_rate", "0",
          "--lr_scheduler_type", "linear", "--warmup_steps", "1"]


def _losses(output_dir: str, step: int = 4) -> list[float]:
    return run_dir.read_losses(output_dir, step)


def _weights(output_dir: str, step: int) -> dict:
    return load_file(os.path.join(output_dir, f"step-{step:06d}", "model.safetensors"))


def _layout(batch: int, accumulation: int) -> list[str]:
    return ["--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", str(accumulation)]


def _assert_continues_exactly(test: absltest.TestCase, full: str, resumed: str) -> None:
    expected, got = _losses(full), _losses(resumed)
    test.assertLen(got, 4)
    test.assertEqual(got[:2], expected[:2])  # restored from the checkpoint
    for step in (2, 3):  # steps 3 and 4, trained after the resume
        test.assertAlmostEqual(got[step], expected[step], delta=2e-5 * abs(expected[step]), msg=f"step {step + 1}")
    # A step whose last micro-batch does not synchronise leaves the weights as they were.
    previous = _weights(full, 2)
    for step in (3, 4):
        weights = _weights(resumed, step)
        test.assertTrue(any(not (weights[k] == previous[k]).all() for k in weights), f"step {step} did not train")
        previous = weights


class ResumeWithAnotherSplitTest(fixtures.TempDirTestCase):

    @parameterized.named_parameters(
        ("8x2_to_4x4", (8, 2), (4, 4), []),
        ("8x2_to_4x4_group_by_length", (8, 2), (4, 4), ["--group_by_length"]),
        # accelerate would restore its micro-batch count as 2 x 2 = 4, not a multiple of 3.
        ("6x2_to_4x3", (6, 2), (4, 3), []),
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


class PretrainingResumeWithAnotherSplitTest(fixtures.TempDirTestCase):

    @parameterized.named_parameters(("span_corruption", "span_corruption"), ("prefix_lm", "prefix_lm"),
                                    ("ul2", "ul2"))
    def test_same_global_batch_continues_exactly(self, objective):
        def args(output_dir, *extra):
            return ["--config_name", fixtures.TINY_CONFIG, "--tokenizer_name", fixtures.tokenizer_dir(),
                    "--train_file", fixtures.corpus_files()[1], "--output_dir", output_dir, "--objective", objective,
                    "--max_seq_length", "32", "--max_eval_samples", "8", "--eval_steps", "0", "--warmup_steps", "1",
                    *COMMON, *extra]

        full, resumed = os.path.join(self.dir, "full"), os.path.join(self.dir, "resumed")
        pre_train_t5.main(args(full, *_layout(8, 1)))
        pre_train_t5.main(args(resumed, *_layout(4, 2), "--resume_from_checkpoint", os.path.join(full, "step-000002")))
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
