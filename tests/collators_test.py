"""Tests for data_collator_t5 on English text (made_data.py) encoded with the fixture tokenizer."""

import os
from unittest import mock

from absl.testing import absltest, parameterized
import numpy as np
import torch
from transformers import AutoTokenizer, T5TokenizerFast

from t5_training import collators as dc
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
        # round(199.8) = 200 noise tokens leave none to keep: T5 caps the noise at length - 1.
        ("d999_m3", 0.999, 3.0, 199, 1),
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
        # Density 0.5 with targets exactly as long as the inputs: nothing to trim (only longer ones are).
        ("10_d50_m3", 10, 0.5, 3.0, (14, 10)),
        ("17_d50_m3", 17, 0.5, 3.0, (24, 17)),
        # A mean span below 1 (more spans than noise tokens): the first raw length tried, inputs_length - 1,
        # already corrupts to more than the inputs hold, and is kept.
        ("32_d15_m05", 32, 0.15, 0.5, (31, 16)),
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

    @parameterized.named_parameters(
        # A side of one token is one segment, with no gap to cut: (length, density, mean, mask).
        ("two_tokens", 2, 0.5, 3.0, [0, 1]),
        ("one_noise_token", 4, 0.15, 3.0, [0, 0, 0, 1]),  # round(0.6) = 1 noise token
        ("one_kept_token", 4, 0.7, 3.0, [0, 1, 1, 1]),  # round(2.8) = 3 noise tokens
    )
    def test_a_one_token_side_is_one_span(self, length, density, mean_span, expected):
        mask = dc.random_spans_noise_mask(8, length, density, mean_span, np.random.default_rng(0))
        np.testing.assert_array_equal(mask, np.tile(np.array(expected, dtype=bool), (8, 1)))

    def test_a_row_after_one_whose_draws_all_fall_on_one_gap_keeps_its_mask(self):
        # 6 tokens at density 0.5, mean 1.5: 3 noise tokens in 2 spans, one of 2 gaps cut. Row key 13169
        # draws gap 0 in all 14 of its noise draws: the rows after it, whose smallest draw is that same
        # gap, still take their own first draw, as they do alone.
        keys = np.array([13169, 1, 13169, 4, 13169, 8], dtype=np.uint64)
        together = dc.random_spans_noise_mask(6, 6, 0.5, 1.5, keys)
        for row in range(6):
            alone = dc.random_spans_noise_mask(1, 6, 0.5, 1.5, keys[row:row + 1])
            np.testing.assert_array_equal(together[row], alone[0])
        self.assertEqual(together[1].astype(int).tolist(), [0, 0, 1, 0, 1, 1])  # key 1 draws gap 0 first

    def test_a_row_whose_first_draws_fall_short_draws_again(self):
        # 26 tokens at density 0.5, mean 13 / 7: 13 noise tokens in 7 spans, 6 of their 12 gaps cut. Row key
        # 6312622 finds only 5 distinct gaps in its first 27 noise draws: it draws more, and every row
        # still gets exact counts and the mask it gets alone.
        keys = np.array([6312622, 1, 2, 3], dtype=np.uint64)
        mask = dc.random_spans_noise_mask(4, 26, 0.5, 13 / 7, keys)
        np.testing.assert_array_equal(mask.sum(1), [13] * 4)
        self.assertEqual([_noise_spans(row) for row in mask], [7] * 4)
        for row in range(4):
            alone = dc.random_spans_noise_mask(1, 26, 0.5, 13 / 7, keys[row:row + 1])
            np.testing.assert_array_equal(mask[row], alone[0])

    @parameterized.named_parameters(
        # T5's random_prefix_noise_mask: min(length - 1, max(1, round((1 - 2 r) * float32(length - 1)))).
        ("float32_half_up", 46, 0.15, 32),  # 0.7 * 45 = 31.5 in float32
        ("quarter", 127, 0.25, 63),
        ("half", 127, 0.5, 1),
        ("nearly_all", 10, 0.01, 9),
        ("two_tokens", 2, 0.5, 1),
        ("one_token", 1, 0.5, 0),  # T5's min(0, max(1, 0)): no prefix to give
    )
    def test_min_prefix_length_is_t5s(self, length, density, expected):
        self.assertEqual(dc.min_prefix_length(length, density), expected)

    def test_prefix_split_is_uniform_above_the_densitys_bound(self):
        # Density 0.25 over 11 tokens: prefixes of round(0.5 * 10) = 5 to 10 tokens, each as likely.
        split = dc.random_prefix_split(np.random.default_rng(4), 6_000, 11, 0.25)
        self.assertEqual(split.shape, (6_000, 1))
        counts = np.bincount(split[:, 0], minlength=11)
        self.assertEqual(np.flatnonzero(counts).tolist(), list(range(5, 11)))
        self.assertLess(np.abs(counts[5:] / 6_000 - 1 / 6).max(), 0.02)

    def test_prefix_splits_of_given_keys_are_pinned(self):
        # A row's split is draw 0 of its PREFIX_SPLIT stream: pinned, so that a change to which draw is
        # read (and to every run's data) shows here.
        keys = np.arange(1, 9, dtype=np.uint64)
        self.assertEqual(dc.random_prefix_split(keys, 8, 64)[:, 0].tolist(), [63, 59, 41, 8, 9, 52, 27, 34])
        self.assertEqual(dc.random_prefix_split(keys, 8, 11, 0.25)[:, 0].tolist(), [10, 10, 8, 5, 5, 9, 7, 8])

    def test_default_seed_is_zero(self):
        rows = self.examples(141, 4)
        for make in (lambda **kw: self.collator(128, **kw),
                     lambda **kw: dc.DataCollatorForPrefixLM(self.tok, raw_length=141, **kw)):
            default, zero, one = make()(rows), make(seed=0)(rows), make(seed=1)(rows)
            self.assertTrue(torch.equal(default["input_ids"], zero["input_ids"]))
            self.assertFalse(torch.equal(default["input_ids"], one["input_ids"]))

    def test_prefix_lm_takes_two_token_chunks_and_refuses_one(self):
        batch = dc.DataCollatorForPrefixLM(self.tok, raw_length=2)([{"input_ids": [5, 6], "idx": 0}])
        self.assertEqual(batch["input_ids"].tolist(), [[5, EOS]])
        self.assertEqual(batch["labels"].tolist(), [[6, EOS]])
        with self.assertRaisesWithLiteralMatch(ValueError, "raw_length must be at least 2 to split a chunk, got 1"):
            dc.DataCollatorForPrefixLM(self.tok, raw_length=1)

    def test_sentinel_ids_by_name_and_their_errors(self):
        np.testing.assert_array_equal(dc.sentinel_ids(self.tok, 3), [999, 998, 997])
        self.assertEqual(dc.sentinel_ids(self.tok, 3).dtype, np.int64)
        self.assertLen(dc.sentinel_ids(self.tok), 100)
        with self.assertRaisesWithLiteralMatch(
                ValueError, "num_sentinels=101 but the tokenizer only has <extra_id_0>..<extra_id_99>"):
            dc.sentinel_ids(self.tok, 101)
        no_sentinels = mock.Mock(get_vocab=lambda: {"<pad>": 0, "</s>": 1})
        with self.assertRaisesWithLiteralMatch(
                ValueError, "tokenizer has no sentinel token <extra_id_0>; span corruption needs <extra_id_0>, "
                "<extra_id_1>, ... in its vocabulary"):
            dc.sentinel_ids(no_sentinels)
        with self.assertRaisesWithLiteralMatch(
                ValueError, "chunks of 141 tokens get 7 noise spans, but only 5 sentinels (<extra_id_0>..<extra_id_4>) "
                "are available"):
            self.collator(128, num_sentinels=5)

    def test_stack_chunks_gives_int64_and_names_bad_rows(self):
        tokens = dc.stack_chunks([{"input_ids": np.arange(4, dtype=np.int32)}] * 2, 4)
        self.assertEqual((tokens.dtype, tokens.shape), (np.int64, (2, 4)))
        with self.assertRaisesWithLiteralMatch(ValueError, "cannot collate an empty batch"):
            dc.stack_chunks([], 4)
        with self.assertRaisesWithLiteralMatch(  # rows of different lengths: numpy cannot stack them
                ValueError, "example 1 has input_ids of shape (3,); expected exactly 4 token ids (a packed chunk "
                "of raw_length tokens, without EOS or padding)"):
            dc.stack_chunks([{"input_ids": [1, 2, 3, 4]}, {"input_ids": [1, 2, 3]}], 4)
        with self.assertRaisesWithLiteralMatch(ValueError, "input_ids must be 4 integer token ids per example"):
            dc.stack_chunks([{"input_ids": ["a", "b", "c", "d"]}], 4)

    def test_replace_runs_rows_keeping_different_numbers_of_tokens(self):
        # Rows of one width whose runs leave 4, 6 and 1 tokens: each row EOS-terminated, then padded.
        runs = np.array([[1, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=bool)
        out = dc.replace_runs(np.tile(np.arange(10, 16), (3, 1)), runs, 8, -100, np.array([99, 98]), EOS)
        np.testing.assert_array_equal(out, [[99, 12, 13, 98, EOS, -100, -100, -100],
                                            [10, 11, 12, 13, 14, 15, EOS, -100],
                                            [99, EOS, -100, -100, -100, -100, -100, -100]])


if __name__ == "__main__":
    absltest.main()
