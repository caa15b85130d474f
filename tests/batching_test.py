"""Batches for teacher forcing (t5_training.batching): padding, its rounding on a GPU, shifted decoder inputs."""
from __future__ import annotations

import torch
from absl.testing import absltest, parameterized

from t5_training import batching, device
from t5_training.config import TrainingConfig
from t5_training.fine_tune_config import FineTuneConfig
from tests.simulated_gpu import gpu_host


class CollatorTest(parameterized.TestCase):

    def test_padding(self):
        collate = batching.Seq2SeqCollator(pad_token_id=0, decoder_start_token_id=0)
        rows = [{"input_ids": [5, 6, 1], "labels": [7, 1], "idx": 4, "source": "dropped"},
                {"input_ids": [5, 6, 7, 8, 9, 10, 11, 12, 1], "labels": [8, 9, 10, 11, 1], "idx": 0,
                 "source": "dropped"}]
        batch = collate(rows)
        self.assertEqual(sorted(batch), ["attention_mask", "decoder_input_ids", "idx", "input_ids", "labels"])
        self.assertEqual(batch["input_ids"].tolist(), [
            [5, 6, 1, 0, 0, 0, 0, 0, 0],
            [5, 6, 7, 8, 9, 10, 11, 12, 1],
        ])
        self.assertEqual(batch["attention_mask"].tolist(), [
            [1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 1, 1],
        ])
        self.assertEqual(batch["labels"].tolist(), [
            [7, 1, -100, -100, -100],
            [8, 9, 10, 11, 1],
        ])
        self.assertEqual(batch["decoder_input_ids"].tolist(), [
            [0, 7, 1, 0, 0],
            [0, 8, 9, 10, 11],
        ])
        self.assertEqual(batch["idx"].tolist(), [4, 0])
        for key in ("input_ids", "attention_mask", "labels", "decoder_input_ids"):
            self.assertEqual(batch[key].dtype, torch.int64, key)

    @parameterized.named_parameters(("one", 1, 8), ("eight", 8, 8), ("nine", 9, 16), ("sixteen", 16, 16),
                                    ("seventeen", 17, 24))
    def test_width_rounds_up_to_multiple(self, longest, width):
        collate = batching.Seq2SeqCollator(pad_token_id=0, decoder_start_token_id=0, pad_to_multiple_of=8)
        batch = collate([{"input_ids": [3] * longest, "labels": [4] * longest}, {"input_ids": [3], "labels": [4]}])
        self.assertEqual(tuple(batch["input_ids"].shape), (2, width))
        self.assertEqual(tuple(batch["labels"].shape), (2, width))
        self.assertEqual(int(batch["attention_mask"].sum()), longest + 1)
        self.assertEqual(int((batch["labels"] == -100).sum()), 2 * width - longest - 1)
        self.assertNotIn("idx", batch)

    def test_rounding_only_on_gpu(self):
        # CPU batches pad to the longest row only: rounding a 2-token target to 8 would cost 4x
        # the decoder work.
        self.assertEqual(batching.pad_multiple(), batching.GPU_PAD_MULTIPLE if torch.cuda.is_available() else 1)
        self.assertEqual(batching.GPU_PAD_MULTIPLE, 8)

    @parameterized.named_parameters(("gpu_process", {}, batching.GPU_PAD_MULTIPLE, True),
                                    ("cpu_process", {"ACCELERATE_USE_CPU": "1"}, 1, False))
    def test_padding_and_pinning_follow_the_device_in_use(self, env, multiple, pinned):
        # A CPU process on a GPU host (ACCELERATE_USE_CPU=1, as the Slurm scripts set on CPU nodes)
        # gains nothing from either.
        with gpu_host(**env):
            self.assertEqual(batching.pad_multiple(), multiple)
            self.assertEqual(device.loader_workers(TrainingConfig(output_dir="unused"))["pin_memory"], pinned)

    def test_decoder_inputs_are_shifted_labels(self):
        labels = torch.tensor([[11, 12, 13, 1], [21, 1, -100, -100]])
        shifted = batching.shift_right(labels, decoder_start_token_id=0, pad_token_id=0)
        self.assertEqual(shifted.tolist(), [[0, 11, 12, 13], [0, 21, 1, 0]])
        self.assertEqual(labels.tolist(), [[11, 12, 13, 1], [21, 1, -100, -100]])  # not modified


class CompileWidthsTest(parameterized.TestCase):
    @parameterized.parameters(
        (512, (8, 16, 32, 64, 128, 256, 512)),
        (100, (8, 16, 32, 64, 104)),  # the last, rounded up to 8, holds a row of max_length
        (8, (8,)),
        (3, (8,)),
    )
    def test_widths_double_up_to_the_max_length(self, max_length, widths):
        self.assertEqual(batching.compile_widths(max_length), widths)

    def test_compiled_training_on_a_gpu_pads_to_the_narrowest_width_that_fits(self):
        config = FineTuneConfig(output_dir="unused", torch_compile=True, max_source_length=100, max_target_length=8)
        with gpu_host():
            collate = batching.train_collator(config, pad_token_id=0, decoder_start_token_id=0)
            # 5 source widths x 1 target width, at the full batch and an epoch's last one.
            self.assertEqual(batching.compiled_shape_count(config), 10)
        for longest, width in [(1, 8), (8, 8), (9, 16), (33, 64), (65, 104), (100, 104)]:
            batch = collate([{"input_ids": [5] * longest, "labels": [7, 1]}, {"input_ids": [5], "labels": [1]}])
            self.assertEqual(batch["input_ids"].shape, (2, width))
            self.assertEqual(batch["attention_mask"].sum().item(), longest + 1)
            self.assertEqual(batch["labels"].tolist(), [[7, 1] + [-100] * 6, [1] + [-100] * 7])

    @parameterized.named_parameters(
        ("uncompiled_on_a_cpu", False, False), ("uncompiled_on_a_gpu", False, True),
        # On a CPU padding costs its full share: one graph for symbolic lengths instead.
        ("compiled_on_a_cpu", True, False),
    )
    def test_other_training_pads_to_the_longest_row(self, compiled, gpu):
        config = FineTuneConfig(output_dir="unused", torch_compile=compiled, max_source_length=100,
                                max_target_length=8)
        with gpu_host() if gpu else gpu_host(ACCELERATE_USE_CPU="1"):
            collate = batching.train_collator(config, 0, 0)
            self.assertIsNone(batching.compiled_shape_count(config))
        batch = collate([{"input_ids": [5] * 33, "labels": [7, 1]}])
        width = 40 if gpu else 33  # rounded up to 8 on a GPU (GPU_PAD_MULTIPLE)
        self.assertEqual((batch["input_ids"].shape, batch["labels"].shape), ((1, width), (1, 8 if gpu else 2)))


if __name__ == "__main__":
    absltest.main()
