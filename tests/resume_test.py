"""Resuming with another split of the same global batch: the same rows, the same losses, a step every step.

A checkpoint records its data position in rows of the epoch and the batch layout it was saved
with (t5_training.resume.continue_with_layout). These runs resume an uninterrupted run's step-2
checkpoint under another per-device batch, accumulation or number of processes, and compare
every later step's loss with the uninterrupted run's, on the CPU, where both are deterministic.
Pretraining draws each row's mask, prefix split and denoiser from (seed, the row's chunk id), so
its resumed runs repeat the losses too.
"""
import os
import tempfile
import types

from absl.testing import absltest, parameterized
from safetensors.torch import load_file

import fine_tune_t5
import pre_train_t5
from t5_training import loop, resume, run_dir
from t5_training.errors import UsageError
from tests import fixtures, processes

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
        test.assertAlmostEqual(got[step], expected[step], delta=fixtures.same_computation(2e-5) * abs(expected[step]),
                               msg=f"step {step + 1}")
    # A step whose last micro-batch does not synchronise leaves the weights as they were.
    previous = _weights(full, 2)
    for step in (3, 4):
        weights = _weights(resumed, step)
        test.assertTrue(any(not (weights[k] == previous[k]).all() for k in weights), f"step {step} did not train")
        previous = weights


def _accelerator(processes: int):
    # continue_with_layout reads the number of processes and sets the micro-batch counter, nothing else.
    return types.SimpleNamespace(num_processes=processes, step=None)


def _split(batch: int, accumulation: int):
    return types.SimpleNamespace(per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation)


def _layout_of(batch: int, accumulation: int, processes: int) -> dict:
    return {"per_device": batch, "accumulation": accumulation, "processes": processes}


def _saved(layout: dict, step: int, rows: int, epoch: int = 0, **legacy) -> loop.TrainState:
    # As a checkpoint's train_state.json is loaded (loop.TrainState.load_state_dict).
    state = loop.TrainState()
    state.load_state_dict({"step": step, "epoch": epoch, "samples_in_epoch": rows, "batch_layout": layout, **legacy})
    return state


class LayoutTest(parameterized.TestCase):
    """continue_with_layout in-process, on the layouts a checkpoint records: what it accepts, sets and refuses."""

    def test_a_layout_and_its_sizes(self):
        layout = resume.batch_layout(_split(4, 3), 2)
        self.assertEqual(layout, _layout_of(4, 3, 2))
        self.assertEqual(resume.global_batch(layout), 24)  # 4 rows x 3 micro-batches x 2 processes
        self.assertEqual(resume.micro_batch_rows(layout), 8)  # 4 rows on each of 2 processes

    @parameterized.named_parameters(
        # (saved layout, this run's per-device batch and accumulation, processes, step, rows into the epoch)
        ("another_split", _layout_of(8, 2, 1), (4, 4), 1, 3, 32),
        ("fewer_processes", _layout_of(4, 1, 2), (4, 2), 1, 5, 0),
        ("more_processes", _layout_of(4, 4, 1), (2, 2), 4, 2, 24),
        ("the_same_layout", _layout_of(2, 3, 1), (2, 3), 1, 7, 2),
        ("no_layout_recorded", {}, (2, 3), 1, 7, 2))
    def test_the_same_global_batch_continues(self, saved, split, processes, step, rows):
        accelerator, state = _accelerator(processes), _saved(saved, step, rows, epoch=1)
        resume.continue_with_layout(accelerator, _split(*split), state, "ckpt")
        # accelerate counts micro-batches: step x this run's accumulation, so every window ends on a sync.
        self.assertEqual(accelerator.step, step * split[1])
        self.assertEqual((state.step, state.epoch, state.samples_in_epoch), (step, 1, rows))
        self.assertEqual(state.batch_layout, saved)  # the checkpoint's record is left as it was

    def test_a_position_in_batches_is_converted_to_rows_of_this_runs_layout(self):
        # Saved before positions were rows: 3 micro-batches, taken as this run's 4 rows x 2 processes.
        state = _saved({}, 6, 0, batches_in_epoch=3)
        resume.continue_with_layout(_accelerator(2), _split(4, 2), state, "ckpt")
        self.assertEqual(state.samples_in_epoch, 24)
        self.assertIsNone(state.legacy_batches_in_epoch)  # converted once
        resume.continue_with_layout(_accelerator(2), _split(4, 2), state, "ckpt")
        self.assertEqual(state.samples_in_epoch, 24)

    def test_another_global_batch_is_refused_with_both_layouts(self):
        state = _saved(_layout_of(8, 2, 1), 2, 16)
        with self.assertRaises(UsageError) as raised:
            resume.continue_with_layout(_accelerator(1), _split(4, 2), state, "ck/step-2")
        self.assertEqual(str(raised.exception), (
            "checkpoint ck/step-2 was trained with a global batch of 16 (8 per device x 2 accumulation x 1 processes), "
            "but this run has 8 (4 per device x 2 accumulation x 1 processes); resume with the same global batch (any "
            "split of it), or start a new run from its weights with --model_name_or_path"))

    def test_a_stream_is_refused_on_another_number_of_processes(self):
        state = _saved(_layout_of(4, 1, 2), 2, 8)
        with self.assertRaises(UsageError) as raised:
            resume.continue_with_layout(_accelerator(1), _split(4, 2), state, "ck/step-2", streaming=True)
        self.assertEqual(str(raised.exception), (
            "checkpoint ck/step-2 streamed its corpus over 2 processes, this run has 1: each process reads its own "
            "share of a stream, so the position does not carry over; resume with 2 processes"))
        # The same processes under another split carry a stream's position over.
        accelerator = _accelerator(2)
        resume.continue_with_layout(accelerator, _split(2, 2), state, "ck/step-2", streaming=True)
        self.assertEqual(accelerator.step, 4)

    @parameterized.named_parameters(("mid_micro_batch", 6), ("less_than_one", 2))
    def test_a_position_between_micro_batches_is_refused(self, rows):
        # 2 rows x 4 micro-batches saved; this run's micro-batch is 4 rows on its 1 process.
        state = _saved(_layout_of(2, 4, 1), 3, rows, epoch=1)
        with self.assertRaises(UsageError) as raised:
            resume.continue_with_layout(_accelerator(1), _split(4, 2), state, "ck/step-3")
        self.assertEqual(str(raised.exception), (
            f"checkpoint ck/step-3 stopped {rows} rows into epoch 1, which is not a whole number of this run's 4 x "
            "1-row micro-batches; resume with 8 (2 per device x 4 accumulation x 1 processes)"))


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
        with tempfile.TemporaryDirectory() as folder, processes.on_the_cpu():
            two, one = os.path.join(folder, "two"), os.path.join(folder, "one")
            processes.run_two(SCRIPT, fixtures.fine_tune_args(two, *_layout(4, 1), *COMMON))
            fine_tune_t5.main(fixtures.fine_tune_args(one, *_layout(4, 2), *COMMON,
                                                      "--resume_from_checkpoint", os.path.join(two, "step-000002")))
            _assert_continues_exactly(self, two, one)


if __name__ == "__main__":
    absltest.main()
