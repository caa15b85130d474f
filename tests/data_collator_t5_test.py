"""Tests for data_collator_t5 on English text (made_data.py) encoded with the fixture tokenizer."""

import os
from unittest import mock

from absl.testing import absltest, parameterized
import numpy as np
import torch
from transformers import AutoTokenizer, T5TokenizerFast

import data_collator_t5 as dc
from t5_training import row_keys
from tests import fixtures

EOS, PAD = 1, 0
SENTINEL_0 = 999  # <extra_id_0> of the 1000-token test tokenizer; <extra_id_i> = 999 - i


def _noise_spans(mask_row):
    """Number of runs of True in a 1-d bool array."""
    return int(np.sum(mask_row & ~np.concatenate([[False], mask_row[:-1]])))


class _IndexedChunks(torch.utils.data.Dataset):
    def __init__(self, chunks, with_idx):
        self.chunks, self.with_idx = chunks, with_idx

    def __len__(self):
        return len(self.chunks)

    def __getitem__(self, i):
        return {"input_ids": self.chunks[i], "idx": i} if self.with_idx else {"input_ids": self.chunks[i]}


class DataCollatorT5Test(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tok = AutoTokenizer.from_pretrained(fixtures.tokenizer_dir())
        with open(fixtures.corpus_files()[0], encoding="utf-8") as f:
            lines = [line.strip() for _, line in zip(range(1500), f) if line.strip()]
        ids = cls.tok(lines, add_special_tokens=False).input_ids
        cls.stream = np.fromiter((t for row in ids for t in row), dtype=np.int64)
        assert len(cls.stream) > 40 * 568, len(cls.stream)

    def chunks(self, raw_length, n, offset=0):
        """n consecutive raw_length chunks of real text (wrapping round the stream if needed)."""
        pos = (offset + np.arange(n * raw_length)) % len(self.stream)
        return self.stream[pos].reshape(n, raw_length)

    def examples(self, raw_length, n, offset=0, with_idx=True):
        return [{"input_ids": c.tolist(), "idx": offset + i} if with_idx else {"input_ids": c.tolist()}
                for i, c in enumerate(self.chunks(raw_length, n, offset))]

    def collator(self, input_length, **kw):
        return dc.DataCollatorForT5MLM(self.tok, input_length=input_length, **kw)

    @staticmethod
    def splice(input_row, label_row):
        """Put each target span back at its sentinel in the input: the original chunk."""
        inputs = [t for t in input_row.tolist() if t != PAD]
        labels = [t for t in label_row.tolist() if t != -100]
        assert inputs[-1] == EOS and labels[-1] == EOS
        spans, current = {}, None
        for t in labels[:-1]:
            if t > SENTINEL_0 - 100:
                current = spans.setdefault(t, [])
            else:
                current.append(t)
        out = []
        for t in inputs[:-1]:
            out.extend(spans.pop(t) if t > SENTINEL_0 - 100 else [t])
        assert not spans
        return out

    @parameterized.named_parameters(("512", 512, 568, 114), ("256", 256, 284, 58), ("128", 128, 141, 29))
    def test_golden_lengths_and_shapes(self, input_length, raw_length, target_length):
        self.assertEqual(dc.compute_input_and_target_lengths(input_length, 0.15, 3.0), (raw_length, target_length))
        col = self.collator(input_length)
        self.assertEqual((col.input_length, col.raw_length, col.target_length),
                         (input_length, raw_length, target_length))
        batch = col(self.examples(raw_length, 6))
        self.assertEqual(batch["input_ids"].shape, (6, input_length))
        self.assertEqual(batch["attention_mask"].shape, (6, input_length))
        self.assertEqual(batch["labels"].shape, (6, target_length))
        self.assertEqual(batch["decoder_input_ids"].shape, (6, target_length))
        for v in batch.values():
            self.assertEqual(v.dtype, torch.int64)
        self.assertTrue(torch.all(batch["input_ids"][:, -1] == EOS))
        self.assertTrue(torch.all(batch["labels"][:, -1] == EOS))
        self.assertTrue(torch.all(batch["attention_mask"] == 1))
        self.assertFalse(torch.any(batch["labels"] == -100))
        self.assertTrue(torch.all(batch["decoder_input_ids"][:, 0] == PAD))
        self.assertTrue(torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1]))

    def test_density_half_keeps_t5_special_case(self):
        # T5 trims one raw token so targets are no longer than the inputs.
        raw, target = dc.compute_input_and_target_lengths(512, 0.5, 3.0)
        self.assertEqual((raw, target), (766, 512))

    def test_density_half_pads_when_t5_lengths_fall_short(self):
        # As T5's random_spans_helper: 75 raw tokens corrupt to 37 + round(38 / 3) = 13 spans + EOS = 51
        # inputs and 38 + 13 + 1 = 52 targets; the density-0.5 rule then drops one raw token and one
        # target: (74, 51). 74 tokens give 37 + round(37 / 3) = 12 spans + EOS = 50 on each side,
        # so both are padded by one, masked out of attention and loss.
        col = self.collator(51, noise_density=0.5)
        self.assertEqual((col.raw_length, col.target_length), (74, 51))
        batch = col(self.examples(col.raw_length, 4))
        self.assertEqual(batch["input_ids"].shape, (4, 51))
        self.assertTrue(torch.all(batch["input_ids"][:, -2:] == torch.tensor([EOS, PAD])))
        self.assertTrue(torch.all(batch["attention_mask"][:, :-1] == 1))
        self.assertTrue(torch.all(batch["attention_mask"][:, -1] == 0))
        self.assertEqual(batch["labels"].shape, (4, 51))
        self.assertTrue(torch.all(batch["labels"][:, -2:] == torch.tensor([EOS, -100])))

    def test_sentinel_order(self):
        col = self.collator(128)
        self.assertEqual(col.sentinel_ids[:3].tolist(), [999, 998, 997])
        batch = col(self.examples(col.raw_length, 8))
        for inp, lab in zip(batch["input_ids"].numpy(), batch["labels"].numpy()):
            in_sentinels = inp[inp > SENTINEL_0 - 100]
            lab_sentinels = lab[lab > SENTINEL_0 - 100]
            self.assertEqual(in_sentinels.tolist(), list(range(SENTINEL_0, SENTINEL_0 - len(in_sentinels), -1)))
            self.assertEqual(lab_sentinels.tolist(), in_sentinels.tolist())
            self.assertLen(in_sentinels, col.num_spans)
            self.assertEqual(lab[0], SENTINEL_0)
            self.assertEqual(self.tok.convert_ids_to_tokens(int(lab[0])), "<extra_id_0>")

    @parameterized.named_parameters(
        ("128_d15_m3_s0", 128, 0.15, 3.0, 0),
        ("512_d15_m3_s1", 512, 0.15, 3.0, 1),
        ("64_d30_m2_s2", 64, 0.3, 2.0, 2),
        ("256_d50_m3_s3", 256, 0.5, 3.0, 3),
        ("256_d50_m5_s4", 256, 0.5, 5.0, 4),
        ("51_d50_m3_s7", 51, 0.5, 3.0, 7),  # T5's 0.5 hack leaves inputs and targets one short: padded
        ("100_d15_m5_s5", 100, 0.15, 5.0, 5),
        ("32_d30_m1_s6", 32, 0.3, 1.0, 6),
    )
    def test_reconstruction(self, input_length, density, mean_span, seed):
        col = self.collator(input_length, noise_density=density, mean_noise_span_length=mean_span, seed=seed)
        chunks = self.chunks(col.raw_length, 16, offset=seed * 1000)
        batch = col([{"input_ids": c, "idx": i} for i, c in enumerate(chunks)])
        self.assertEqual(batch["input_ids"].shape, (16, input_length))
        self.assertEqual(batch["labels"].shape, (16, col.target_length))
        for row, chunk in enumerate(chunks):
            self.assertEqual(self.splice(batch["input_ids"][row].numpy(), batch["labels"][row].numpy()),
                             chunk.tolist())
        # Padding, when T5's lengths need it, is masked out of attention and loss.
        pad = batch["attention_mask"] == 0
        self.assertTrue(torch.all(batch["input_ids"][pad] == PAD))
        self.assertTrue(torch.all(batch["attention_mask"].sum(1) == batch["attention_mask"].sum(1)[0]))

    def test_noise_mask_statistics(self):
        rng = np.random.default_rng(0)
        mask = dc.random_spans_noise_mask(10_000, 568, 0.15, 3.0, rng)
        self.assertEqual(mask.shape, (10_000, 568))
        self.assertEqual(mask.dtype, bool)
        self.assertFalse(mask[:, 0].any())
        starts = mask & ~np.pad(mask[:, :-1], ((0, 0), (1, 0)))
        self.assertTrue(np.all(mask.sum(1) == 85))  # round(568 * 0.15)
        self.assertTrue(np.all(starts.sum(1) == 28))  # round(85 / 3)
        self.assertAlmostEqual(mask.mean(), 0.15, delta=0.005)
        self.assertAlmostEqual(mask.sum() / starts.sum(), 3.0, delta=0.1)
        # Positions are spread over the chunk, not clustered: every quarter gets a fair share.
        quarters = mask.reshape(10_000, 4, 142).mean((0, 2))
        self.assertTrue(np.all(np.abs(quarters - 0.15) < 0.03), quarters)

    @parameterized.named_parameters(
        # T5's random_spans_noise_mask: noise = round(200 * density), spans = max(1, round(noise / mean)).
        ("d15_m3", 0.15, 3.0, 30, 10),
        ("d30_m2", 0.3, 2.0, 60, 30),
        ("d50_m3", 0.5, 3.0, 100, 33),
        ("d60_m3", 0.6, 3.0, 120, 40),  # the scarcer-side rule gave round(80 / 3) = 27 spans: mean 4.4
        ("d80_m8", 0.8, 8.0, 160, 20),
        # round(160 / 3) = 53 noise spans cannot alternate with 40 non-noise tokens (T5's own
        # segmentation fails there): capped at 40, one non-noise token between noise spans.
        ("d80_m3", 0.8, 3.0, 160, 40),
        ("tiny_mean", 0.1, 100.0, 20, 1),
    )
    def test_noise_mask_counts_golden(self, density, mean_span, num_noise, num_spans):
        self.assertEqual(dc.span_counts(200, density, mean_span), (num_noise, 200 - num_noise, num_spans))
        mask = dc.random_spans_noise_mask(500, 200, density, mean_span, np.random.default_rng(1))
        self.assertTrue(np.all(mask.sum(1) == num_noise))
        self.assertTrue(all(_noise_spans(row) == num_spans for row in mask))
        self.assertFalse(mask[:, 0].any())

    @parameterized.named_parameters(
        # float32(190) * float32(0.15) = 28.500001 -> 29 noise tokens, 29 / 3 -> 10 spans; Python's floats
        # give 190 * 0.15 = 28.5 -> 28 (half to even) and 9. T5's mask (tf.round in float32) has 29 and 10.
        ("190_d15_m3", 190, 0.15, 3.0, 29, 10),
        ("190_d15_m1", 190, 0.15, 1.0, 29, 29),
        ("45_d70_m3", 45, 0.7, 3.0, 32, 11),  # 31.5 in float32; 31.499999999999996 in float64
        ("568_d15_m3", 568, 0.15, 3.0, 85, 28),
    )
    def test_counts_round_in_float32_as_t5s_mask(self, length, density, mean_span, num_noise, num_spans):
        self.assertEqual(dc.span_counts(length, density, mean_span), (num_noise, length - num_noise, num_spans))
        mask = dc.random_spans_noise_mask(50, length, density, mean_span, np.random.default_rng(0))
        self.assertTrue(np.all(mask.sum(1) == num_noise))
        self.assertTrue(all(_noise_spans(row) == num_spans for row in mask))

    def test_counts_over_a_sweep_are_t5s_float32_arithmetic(self):
        # T5's random_spans_noise_mask: round(float32(length) * density), round(float32(noise) / mean),
        # half to even, noise in [1, length - 1], spans at least 1 (and here at most the kept tokens).
        f32 = np.float32
        for density in (0.1, 0.15, 0.3, 0.5, 0.7):
            for mean in (1.0, 3.0, 8.0):
                for length in range(2, 1025):
                    noise = min(max(int(np.round(f32(length) * f32(density))), 1), length - 1)
                    spans = min(max(int(np.round(f32(noise) / f32(mean))), 1), length - noise)
                    self.assertEqual(dc.span_counts(length, density, mean), (noise, length - noise, spans),
                                     (length, density, mean))

    @parameterized.named_parameters(
        # T5's random_spans_helper counts without clamping: 4 raw tokens at 0.15 are 1 noise token
        # (round(0.6)) in round(1 / 1) = 1 span: inputs 3 + 1 + 1 = 5 > 4, so 3 raw tokens: 0 noise, 0 spans.
        ("4_d15_m1", 4, 0.15, 1.0, (3, 1)),
        ("8_d15_m3", 8, 0.15, 3.0, (8, 2)),
        ("172_d15_m3", 172, 0.15, 3.0, (190, 38)),
    )
    def test_lengths_are_t5s_helper_at_every_length(self, input_length, density, mean_span, expected):
        self.assertEqual(dc.compute_input_and_target_lengths(input_length, density, mean_span), expected)

    def test_batch_keeps_every_token_where_t5s_mask_outgrows_its_helper(self):
        # 172-token inputs: T5's helper gives 190 raw tokens and 38 targets (28 noise in 9 spans, in Python
        # floats); its float32 mask puts 29 noise tokens in 10 spans there: 40 targets. T5 trims them to 38
        # (losing a noise token and EOS); the batch widens instead, and every chunk is rebuilt.
        col = self.collator(172)
        self.assertEqual((col.raw_length, col.target_length), (190, 38))
        rows = self.examples(col.raw_length, 8)
        batch = col(rows)
        self.assertEqual(batch["input_ids"].shape, (8, 172))
        self.assertEqual(batch["labels"].shape, (8, 40))
        self.assertTrue(torch.all(batch["labels"][:, -1] == EOS) and torch.all(batch["attention_mask"] == 1))
        for i, row in enumerate(rows):
            self.assertEqual(self.splice(batch["input_ids"][i], batch["labels"][i]), row["input_ids"])

    @parameterized.named_parameters(("d15", 0.15, 3.0), ("d50", 0.5, 3.0), ("d60", 0.6, 3.0), ("d80_m8", 0.8, 8.0))
    def test_realised_mean_span_length_is_the_one_asked_for(self, density, mean_span):
        # End to end through the collator, noise tokens per sentinel in the targets (256-token
        # inputs: at 512, density 0.5 needs 128 noise spans, more than the 100 sentinels).
        col = self.collator(256, noise_density=density, mean_noise_span_length=mean_span)
        batch = col(self.examples(col.raw_length, 64))
        labels = batch["labels"].numpy()
        sentinels = (labels > SENTINEL_0 - 100).sum()
        noise = ((labels != -100) & (labels != EOS) & (labels <= SENTINEL_0 - 100)).sum()
        self.assertAlmostEqual(noise / sentinels, mean_span, delta=0.1)
        self.assertAlmostEqual(noise / (64 * col.raw_length), density, delta=0.005)
        self.assertEqual(batch["input_ids"].shape, (64, 256))
        self.assertTrue(torch.all(batch["attention_mask"].sum(1) >= 255))

    def test_above_the_feasible_density_spans_are_separated_by_single_tokens(self):
        # Density 0.8 at mean 3 over 568 tokens: 454 noise, 114 non-noise, so 114 spans of 3.98 on average.
        mask = dc.random_spans_noise_mask(2_000, 568, 0.8, 3.0, np.random.default_rng(3))
        starts = mask & ~np.pad(mask[:, :-1], ((0, 0), (1, 0)))
        self.assertAlmostEqual(mask.sum() / starts.sum(), 454 / 114, places=9)
        nonnoise_runs = ~mask & np.pad(mask[:, 1:], ((0, 0), (0, 1)), constant_values=True)
        self.assertTrue(np.all((~mask).sum(1) == nonnoise_runs.sum(1)))  # every non-noise run is 1 token

    def test_segmentation_is_uniform(self):
        # 5 items in 3 non-empty parts: C(4, 2) = 6 compositions, each equally likely.
        mask = dc.random_spans_noise_mask(60_000, 10, 0.5, 5 / 3, np.random.default_rng(2))
        _, counts = np.unique(mask, axis=0, return_counts=True)
        self.assertLen(counts, 36)  # 6 noise x 6 non-noise segmentations
        self.assertLess(np.abs(counts / 60_000 - 1 / 36).max(), 0.005)

    def test_same_idx_same_masks(self):
        col = self.collator(128, seed=3)
        examples = self.examples(col.raw_length, 8, offset=40)
        first = col(examples)
        again = col(examples)
        fresh = self.collator(128, seed=3)(examples)
        for key in first:
            self.assertTrue(torch.equal(first[key], again[key]))
            self.assertTrue(torch.equal(first[key], fresh[key]))
        other_seed = self.collator(128, seed=4)(examples)
        self.assertFalse(torch.equal(first["input_ids"], other_seed["input_ids"]))

    def test_draws_take_row_keys_or_a_generator(self):
        # A Generator stands for the row keys it draws: the same splits either way.
        keys = row_keys.keys_for(np.random.default_rng(6), 3)
        np.testing.assert_array_equal(dc.random_prefix_split(np.random.default_rng(6), 3, 10),
                                      dc.random_prefix_split(keys, 3, 10))
        with self.assertRaisesRegex(ValueError, "Generator or 3 uint64 row keys"):
            dc.random_prefix_split(np.arange(3), 3, 10)  # row ids, not their keys

    @parameterized.named_parameters(("span_corruption", False), ("prefix_lm", True))
    def test_a_rows_draws_do_not_depend_on_the_rows_beside_it(self, prefix_lm):
        # A resume under another split of the global batch puts a row beside other rows: it must get
        # the same mask (or prefix split) whatever its micro-batch and its place in it.
        col = dc.DataCollatorForPrefixLM(self.tok, raw_length=64, seed=5) if prefix_lm else self.collator(128, seed=5)
        rows = self.examples(col.raw_length, 8)
        together = col(rows)
        for part in (rows[:4], rows[4:][::-1], rows[2:3], rows[::3]):
            apart = col(part)
            for i, row in enumerate(part):
                for key in together:
                    self.assertTrue(torch.equal(apart[key][i], together[key][row["idx"]]), (key, row["idx"]))

    def test_different_idx_different_masks(self):
        col = self.collator(128)
        chunks = self.chunks(col.raw_length, 8)
        a = col([{"input_ids": c, "idx": i} for i, c in enumerate(chunks)])
        b = col([{"input_ids": c, "idx": i + 8} for i, c in enumerate(chunks)])
        self.assertFalse(torch.equal(a["input_ids"], b["input_ids"]))

    def test_mixed_idx_raises(self):
        col = self.collator(128)
        examples = self.examples(col.raw_length, 2)
        del examples[1]["idx"]
        with self.assertRaisesRegex(ValueError, "idx"):
            col(examples)

    @parameterized.named_parameters(("with_idx", True), ("per_worker_fallback", False))
    def test_dataloader_workers_never_repeat_masks(self, with_idx):
        col = self.collator(32)
        # The same text in every row: equal batches can then only come from equal masks.
        chunk = self.chunks(col.raw_length, 1)[0]
        dataset = _IndexedChunks([chunk] * 32, with_idx)
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=col,
                                             multiprocessing_context="fork")
        batches = [b["input_ids"] for b in loader]
        self.assertLen(batches, 8)
        for i in range(len(batches)):
            for j in range(i):
                self.assertFalse(torch.equal(batches[i], batches[j]), (i, j))

    def test_fallback_differs_per_rank(self):
        chunk = self.chunks(141, 1)[0]
        examples = [{"input_ids": chunk}] * 4
        outs = []
        for rank in ("0", "1"):
            with mock.patch.dict(os.environ, {"RANK": rank}):
                outs.append(self.collator(128)(examples)["input_ids"])
        self.assertFalse(torch.equal(*outs))

    def test_tokenizer_without_sentinels_raises(self):
        vocab = [(self.tok.convert_ids_to_tokens(i), -float(i)) for i in range(900)]
        plain = T5TokenizerFast(vocab=vocab, extra_ids=0)
        with self.assertRaisesRegex(ValueError, "<extra_id_0>"):
            dc.DataCollatorForT5MLM(plain, input_length=128)

    def test_too_few_sentinels_raises(self):
        with self.assertRaisesRegex(ValueError, "sentinels"):
            self.collator(128, num_sentinels=5)  # 141-token chunks have 7 spans
        self.assertEqual(self.collator(128, num_sentinels=7).num_spans, 7)

    @parameterized.named_parameters(("short", -1), ("long", 1))
    def test_wrong_length_raises(self, delta):
        col = self.collator(128)
        examples = self.examples(col.raw_length + delta, 2)
        with self.assertRaisesRegex(ValueError, rf"{col.raw_length + delta}.*expected exactly {col.raw_length}"):
            col(examples)

    def test_prefix_lm(self):
        raw = 64
        col = dc.DataCollatorForPrefixLM(self.tok, raw_length=raw, seed=5)
        chunks = self.chunks(raw, 32)
        batch = col([{"input_ids": c, "idx": i} for i, c in enumerate(chunks)])
        for key in ("input_ids", "attention_mask", "labels", "decoder_input_ids"):
            self.assertEqual(batch[key].shape, (32, raw))
            self.assertEqual(batch[key].dtype, torch.int64)
        for row, chunk in enumerate(chunks):
            inp, att = batch["input_ids"][row].numpy(), batch["attention_mask"][row].numpy()
            lab, dec = batch["labels"][row].numpy(), batch["decoder_input_ids"][row].numpy()
            split = int(att.sum()) - 1
            self.assertBetween(split, 1, raw - 1)
            self.assertEqual(inp[split], EOS)
            self.assertTrue(np.all(inp[split + 1:] == PAD))
            self.assertTrue(np.all(att[:split + 1] == 1) and np.all(att[split + 1:] == 0))
            n_labels = raw - split + 1
            self.assertEqual(lab[n_labels - 1], EOS)
            self.assertTrue(np.all(lab[n_labels:] == -100))
            self.assertEqual(inp[:split].tolist() + lab[:n_labels - 1].tolist(), chunk.tolist())
            self.assertEqual(dec.tolist(), [PAD] + [t if t != -100 else PAD for t in lab[:-1].tolist()])
        again = col([{"input_ids": c, "idx": i} for i, c in enumerate(chunks)])
        self.assertTrue(torch.equal(batch["input_ids"], again["input_ids"]))

    def test_prefix_lm_split_is_uniform(self):
        raw = 141
        col = dc.DataCollatorForPrefixLM(self.tok, raw_length=raw)
        batch = col(self.examples(raw, 5000, with_idx=False))
        splits = batch["attention_mask"].sum(1).numpy() - 1
        self.assertEqual((splits.min(), splits.max()), (1, raw - 1))
        self.assertAlmostEqual(splits.mean(), raw / 2, delta=0.05 * raw / 2)
        hist = np.bincount(splits, minlength=raw)[1:]
        self.assertLess(hist.max(), 3 * 5000 / (raw - 1))

    def test_prefix_lm_wrong_length_raises(self):
        col = dc.DataCollatorForPrefixLM(self.tok, raw_length=64)
        with self.assertRaisesRegex(ValueError, "expected exactly 64"):
            col(self.examples(63, 1))


if __name__ == "__main__":
    absltest.main()
