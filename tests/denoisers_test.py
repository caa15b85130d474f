"""Tests for denoisers: UL2's mixture of denoisers, on random token ids and a vocabulary-only tokenizer."""

import os
import tempfile

from absl.testing import absltest, parameterized
import numpy as np
import torch
from transformers import T5TokenizerFast
import yaml

from t5_training import collators as dc
from t5_training import denoisers as dn
from t5_training import row_keys
from t5_training.errors import UsageError
from tests import fixtures

EOS, PAD = 1, 0
MODES = {"[NLU]": 700, "[NLG]": 701, "[S2S]": 702}
SENTINEL_0 = 999  # <extra_id_i> = 999 - i; text is drawn from [2, 700)
MODEL_KEYS = ["attention_mask", "decoder_input_ids", "input_ids", "labels"]
UL2 = {d.name: d for d in dn.UL2_DENOISERS}
KEYS = "name, kind, mean_noise_span_length, noise_density, mode_token, rate"  # a mixture entry's, as messages list them


class Vocabulary:
    """What the collator reads from a tokenizer: EOS, pad and the vocabulary's token -> id map."""

    eos_token_id, pad_token_id = EOS, PAD

    def __init__(self, sentinels: int = 200, modes: dict = MODES):
        self.sentinels, self.modes = sentinels, modes

    def get_vocab(self) -> dict:
        return {**{f"<extra_id_{i}>": SENTINEL_0 - i for i in range(self.sentinels)}, **self.modes}


def collator(input_length, names=tuple(UL2), rates=None, seed=0, vocabulary=None):
    return dn.DataCollatorForDenoiserMixture(vocabulary or Vocabulary(), input_length=input_length,
                                            denoisers=[UL2[n] for n in names], rates=rates or [1] * len(names),
                                            seed=seed)


def examples(raw_length, n, offset=0, seed=0):
    chunks = np.random.default_rng(seed).integers(2, 700, size=(n, raw_length))
    return [{"input_ids": chunk, "idx": offset + i} for i, chunk in enumerate(chunks)]


def is_sentinel(ids):
    return ids > SENTINEL_0 - 200


def rebuild(inputs, labels):
    """The chunk a span-corrupted row came from: each input sentinel replaced by its target span."""
    inputs, labels = [t for t in inputs if t != PAD], [t for t in labels if t != -100]
    assert inputs[-1] == EOS and labels[-1] == EOS, (inputs[-1], labels[-1])
    spans, current = {}, None
    for t in labels[:-1]:
        if is_sentinel(t):
            current = spans.setdefault(t, [])
        else:
            current.append(t)
    out = []
    for t in inputs[:-1]:
        out.extend(spans.pop(t) if is_sentinel(t) else [t])
    assert not spans
    return out


class _Rows(torch.utils.data.Dataset):
    def __init__(self, chunk, n, with_idx):
        self.chunk, self.n, self.with_idx = chunk, n, with_idx

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": self.chunk, "idx": i} if self.with_idx else {"input_ids": self.chunk}


class DenoisersTest(parameterized.TestCase):

    def test_ul2_default_is_the_papers_seven_denoisers_at_equal_rates(self):
        denoisers, rates = dn.parse_mixture("ul2")
        self.assertEqual([(d.kind, d.mean_noise_span_length, d.noise_density, d.mode_token) for d in denoisers], [
            ("span", 3.0, 0.15, "[NLU]"), ("span", 8.0, 0.15, "[NLU]"), ("prefix", None, 0.25, "[S2S]"),
            ("span", 3.0, 0.5, "[NLG]"), ("span", 8.0, 0.5, "[NLG]"), ("span", 64.0, 0.15, "[NLG]"),
            ("span", 64.0, 0.5, "[NLG]")])
        self.assertEqual(rates, (1 / 7,) * 7)

    @parameterized.named_parameters(
        # Span denoisers: T5's helper for input_length - 1 (the mode token takes one position);
        # the prefix denoiser reads input_length - 1 tokens, its targets at most half of them + EOS.
        ("128", 128, [140, 145, 127, 189, 224, 147, 248], [29, 26, 65, 126, 127, 24, 127], 0.297),
        ("512", 512, [567, 587, 511, 765, 906, 599, 1004], [114, 100, 257, 510, 511, 92, 511], 0.297),
    )
    def test_golden_lengths(self, input_length, raw_lengths, target_lengths, dropped):
        col = collator(input_length)
        self.assertEqual((col.raw_lengths, col.target_lengths), (raw_lengths, target_lengths))
        self.assertEqual((col.raw_length, col.target_length), (max(raw_lengths), max(target_lengths)))
        # The share of packed tokens the UL2 default leaves unread, as its docstring says.
        self.assertAlmostEqual(1 - np.dot(col.rates, raw_lengths) / col.raw_length, dropped, delta=0.0005)

    @parameterized.named_parameters(
        # name, realised noise density and mean noise span over 10k rows at input_length 128. Span
        # denoisers realise T5's exact counts (noise = round(r raw), spans = round(noise / mu), at
        # least 1), so X(mu=64) gets one span of 22 tokens, or two of 62: no chunk holds more.
        # The prefix denoiser's targets are uniform in 1..64 of its 127 tokens: 32.5 on average.
        ("R_3_0.15", "R_3_0.15", 21 / 140, 3.0),
        ("R_8_0.15", "R_8_0.15", 22 / 145, 22 / 3),
        ("S_0.25", "S_0.25", 32.5 / 127, 32.5),
        ("X_3_0.5", "X_3_0.5", 94 / 189, 94 / 31),
        ("X_8_0.5", "X_8_0.5", 0.5, 8.0),
        ("X_64_0.15", "X_64_0.15", 22 / 147, 22.0),
        ("X_64_0.5", "X_64_0.5", 0.5, 62.0),
    )
    def test_each_denoiser_lengths_statistics_and_reconstruction(self, name, density, mean_span):
        col = collator(128, [name], seed=1)
        rows = examples(col.raw_length, 10_000)
        batch = col(rows)
        raw, target, labels = col.raw_lengths[0], col.target_lengths[0], batch["labels"].numpy()
        self.assertEqual(sorted(batch), sorted(MODEL_KEYS + list(dn.BATCH_INFO_KEYS)))
        self.assertEqual(batch["input_ids"].shape, (10_000, 128))
        self.assertEqual(batch["labels"].shape, (10_000, target))
        self.assertTrue(all(v.dtype == torch.int64 for v in batch.values()))
        self.assertTrue(torch.all(batch["num_raw_tokens"] == raw) and torch.all(batch["denoiser_ids"] == 0))
        self.assertTrue(torch.equal(batch["decoder_input_ids"][:, 1:], batch["labels"][:, :-1].clamp(min=PAD)))
        # The mode token once, at the start; nothing else of the mode tokens anywhere.
        self.assertTrue(torch.all(batch["input_ids"][:, 0] == MODES[UL2[name].mode_token]))
        self.assertFalse(np.isin(batch["input_ids"][:, 1:].numpy(), list(MODES.values())).any())
        self.assertFalse(np.isin(labels, list(MODES.values())).any())
        # Realised noise: target tokens that are text, per raw token read and per span.
        noise = ((labels >= 2) & ~is_sentinel(labels)).sum()
        spans = len(labels) if UL2[name].kind == "prefix" else is_sentinel(labels).sum()
        self.assertAlmostEqual(noise / batch["num_raw_tokens"].sum().item(), density, delta=0.005)
        # 0.1 at a mean of 3, as the T5 collator's tests; the same share of longer means.
        self.assertAlmostEqual(noise / spans, mean_span, delta=max(0.1, mean_span / 30))
        self.assertAlmostEqual(density, UL2[name].noise_density, delta=0.01)
        # Inputs (mode token off) and targets give back the raw tokens read.
        inputs, attention = batch["input_ids"].numpy(), batch["attention_mask"].numpy()
        for row in range(64):
            chunk = rows[row]["input_ids"][:raw].tolist()
            if UL2[name].kind == "span":
                self.assertEqual(rebuild(inputs[row, 1:], labels[row]), chunk)
                self.assertEqual(attention[row].sum(), 128)
            else:
                split = attention[row].sum() - 2  # mode token + prefix + EOS
                self.assertEqual(inputs[row, split + 1], EOS)
                self.assertEqual(inputs[row, 1:split + 1].tolist() + labels[row, :raw - split].tolist(), chunk)
                self.assertTrue(np.all(inputs[row, split + 2:] == PAD))

    def test_mixture_batch(self):
        col = collator(128, seed=2)
        rows = examples(col.raw_length, 256, seed=2)
        batch = col(rows)
        ids = batch["denoiser_ids"].numpy()
        self.assertEqual(sorted(set(ids.tolist())), list(range(7)))
        self.assertEqual(batch["labels"].shape, (256, 127))  # the longest target drawn
        self.assertTrue(torch.equal(batch["num_raw_tokens"], torch.tensor(col.raw_lengths)[ids]))
        self.assertTrue(torch.equal(batch["input_ids"][:, 0], torch.from_numpy(col.mode_ids[ids])))
        for row in np.flatnonzero(ids != 2)[:40]:
            raw = col.raw_lengths[ids[row]]
            self.assertEqual(rebuild(batch["input_ids"][row, 1:].numpy(), batch["labels"][row].numpy()),
                             rows[row]["input_ids"][:raw].tolist())
        info = {key: batch.pop(key) for key in dn.BATCH_INFO_KEYS}
        self.assertEqual(sorted(batch), MODEL_KEYS)
        self.assertLen(info["denoiser_ids"], 256)
        # A batch with only R-denoisers pads its labels to their own longest target.
        only_r = collator(128, ["R_3_0.15", "R_8_0.15"])(examples(145, 32))
        self.assertEqual(only_r["labels"].shape, (32, 29))

    @parameterized.named_parameters(("ul2", None), ("uneven", [0.7, 0.2, 0.1]))
    def test_rates_within_one_percent(self, rates):
        names = tuple(UL2) if rates is None else ("R_3_0.15", "S_0.25", "X_64_0.5")
        col = collator(32, names, rates=rates)
        ids = np.concatenate([col(examples(col.raw_length, 1000, offset=1000 * b, seed=b))["denoiser_ids"].numpy()
                              for b in range(60)])
        realised = np.bincount(ids, minlength=len(names)) / len(ids)
        self.assertLess(np.abs(realised - col.rates).max(), 0.01, realised)

    def test_same_idx_same_batch_and_other_idx_or_seed_other_masks(self):
        rows = examples(248, 16, offset=40)
        first, again, fresh = collator(128, seed=3)(rows), collator(128, seed=3)(rows), collator(128, seed=3)(rows)
        for key in first:
            self.assertTrue(torch.equal(first[key], again[key]) and torch.equal(first[key], fresh[key]), key)
        shifted = [{**row, "idx": row["idx"] + 16} for row in rows]
        self.assertFalse(torch.equal(first["input_ids"], collator(128, seed=3)(shifted)["input_ids"]))
        self.assertFalse(torch.equal(first["input_ids"], collator(128, seed=4)(rows)["input_ids"]))

    def test_a_rows_draws_do_not_depend_on_the_rows_beside_it(self):
        # A resume under another split of the global batch puts a row beside other rows: it must draw the
        # same denoiser and mask whatever its micro-batch and its place in it. Labels are padded to the
        # batch's longest target, so rows compare up to their own.
        col = collator(128, seed=3)
        rows = examples(col.raw_length, 24, offset=40)
        together = col(rows)
        self.assertGreaterEqual(len(set(together["denoiser_ids"].tolist())), 5)
        for part in (rows[:8], rows[8:][::-1], rows[5:6], rows[::5]):
            apart = col(part)
            for i, row in enumerate(part):
                j = row["idx"] - 40
                for key in together:
                    ours, theirs = apart[key][i], together[key][j]
                    if key == "labels":
                        ours = torch.nn.functional.pad(ours, (0, len(theirs) - len(ours)), value=-100)
                    elif key == "decoder_input_ids":  # past the narrower batch: the row's shifted-out EOS
                        theirs = theirs[:len(ours)]
                    self.assertTrue(torch.equal(ours, theirs), (key, j))

    @parameterized.named_parameters(("with_idx", True), ("per_worker_fallback", False))
    def test_dataloader_workers_never_repeat_masks(self, with_idx):
        col = collator(32)
        # The same text in every row: equal batches can then only come from equal draws.
        dataset = _Rows(examples(col.raw_length, 1)[0]["input_ids"], 32, with_idx)
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=col,
                                             multiprocessing_context="fork")
        distinct = {batch["input_ids"].numpy().tobytes() for batch in loader}
        self.assertLen(distinct, 8)  # 8 batches, no two alike

    def test_density_half_short_input_is_padded(self):
        # As T5's helper: 51 non-mode positions take 74 raw tokens at density 0.5, which corrupt to 50.
        batch = dn.DataCollatorForDenoiserMixture(Vocabulary(), input_length=52, denoisers=[UL2["X_3_0.5"]],
                                                  rates=[1])(examples(74, 8))
        self.assertTrue(torch.all(batch["input_ids"][:, -2:] == torch.tensor([EOS, PAD])))
        self.assertTrue(torch.all(batch["attention_mask"].sum(1) == 51))

    def test_parse_a_yaml_mixture(self):
        spec = yaml.safe_load("""
            - {name: short, kind: span, mean_noise_span_length: 3, noise_density: 0.15, mode_token: "[NLU]", rate: 3}
            - {name: lm, kind: prefix, noise_density: 0.5, mode_token: "[S2S]", rate: 1}
        """)
        denoisers, rates = dn.parse_mixture(spec)
        self.assertEqual(denoisers, (dn.Denoiser("short", "span", 3, 0.15, "[NLU]"),
                                     dn.Denoiser("lm", "prefix", None, 0.5, "[S2S]")))
        col = dn.DataCollatorForDenoiserMixture(Vocabulary(), input_length=64, denoisers=denoisers, rates=rates)
        self.assertEqual(col.rates.tolist(), [0.75, 0.25])
        self.assertEqual(col(examples(col.raw_length, 4))["input_ids"].shape, (4, 64))

    @parameterized.named_parameters(
        ("unknown_kind", {"kind": "causal"}, "kind must be 'span' or 'prefix'"),
        ("zero_rate", {"rate": 0}, "rate must be a number > 0"),
        ("negative_rate", {"rate": -1}, "rate must be a number > 0"),
        ("density_one", {"noise_density": 1.0}, r"noise_density must be a number in \(0, 1\)"),
        ("density_zero", {"noise_density": 0}, r"noise_density must be a number in \(0, 1\)"),
        ("short_span", {"mean_noise_span_length": 0.5}, "mean_noise_span_length must be a number >= 1"),
        ("empty_mode_token", {"mode_token": ""}, "mode_token must be a non-empty string"),
        ("prefix_with_span", {"kind": "prefix"}, "leave mean_noise_span_length out"),
        ("prefix_over_half", {"kind": "prefix", "mean_noise_span_length": None, "noise_density": 0.6},
         r"noise_density must be a number in \(0, 0.5\]"),
        ("unknown_key", {"span": 3}, r"unknown keys \['span'\]"),
    )
    def test_parser_errors(self, change, message):
        entry = {"name": "x", "kind": "span", "mean_noise_span_length": 3.0, "noise_density": 0.15,
                 "mode_token": "[NLU]", "rate": 1.0, **change}
        with self.assertRaisesRegex(ValueError, message):
            dn.parse_mixture([entry])

    @parameterized.named_parameters(
        ("missing_mode_token", [{"name": "x", "kind": "span", "mean_noise_span_length": 3, "noise_density": 0.15,
                                 "rate": 1}], "missing mode_token"),
        ("unknown_name", "ul3", "unknown mixture 'ul3'; known: ul2"),
        ("empty", [], "non-empty list"),
        ("not_a_mapping", ["R"], "must be a mapping"),
        ("duplicate_names", [dict(name="a", kind="prefix", noise_density=0.5, mode_token="[S2S]", rate=1)] * 2,
         "names must be unique"),
    )
    def test_parser_errors_on_the_list(self, spec, message):
        with self.assertRaisesRegex(ValueError, message):
            dn.parse_mixture(spec)

    def test_tokenizer_without_mode_tokens_is_refused_and_the_fix_works(self):
        with self.assertRaisesRegex(ValueError, r"no single token for the mode tokens \['\[NLG\]'.*add_special_tokens"):
            collator(128, vocabulary=Vocabulary(modes={"[NLU]": 700}))
        pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(f"w{i}", -float(i)) for i in range(200)]
        tokenizer = T5TokenizerFast(vocab=pieces, extra_ids=100)
        with self.assertRaisesRegex(ValueError, "mode tokens"):
            collator(64, vocabulary=tokenizer)
        tokenizer.add_special_tokens({"additional_special_tokens": list(MODES)})
        col = collator(64, vocabulary=tokenizer)
        self.assertEqual(tokenizer.convert_ids_to_tokens(col.mode_ids.tolist()),
                         [d.mode_token for d in dn.UL2_DENOISERS])

    def test_too_few_sentinels_is_refused(self):
        # At 512, X(mu=3, r=0.5) puts 127 spans in a chunk: more than T5's 100 sentinels.
        with self.assertRaisesRegex(ValueError, "'X_3_0.5' puts 127 noise spans.*only 100 sentinels"):
            collator(512, vocabulary=Vocabulary(sentinels=100))
        self.assertEqual(collator(512, vocabulary=Vocabulary(sentinels=127)).raw_length, 1004)

    def test_prefix_split_matches_t5s_random_prefix_noise_mask(self):
        # Density 0.5 is T5's prefix_lm (uniform in 1..n-1); 0.25 keeps at least half of n - 1 as prefix.
        self.assertEqual(dc.min_prefix_length(127, 0.5), 1)
        self.assertEqual(dc.min_prefix_length(127, 0.25), 63)
        split = dc.random_prefix_split(np.random.default_rng(0), 20_000, 127, 0.25)
        self.assertEqual((split.min(), split.max()), (63, 126))

    def test_prefix_bound_rounds_in_float32_as_t5(self):
        # T5: round((1 - 2 * 0.15) * float32(45)) = round(31.5 in float32) = 32; float64 gives 31.499999999999996.
        self.assertEqual(dc.min_prefix_length(46, 0.15), 32)

    def test_span_rows_use_t5s_float32_counts_and_stay_input_length(self):
        # 173-token inputs: 172 after the mode token, 190 raw tokens by T5's helper, where its float32 mask
        # puts 29 noise tokens in 10 spans (Python floats: 28 in 9).
        col = collator(173, ["R_3_0.15"])
        self.assertEqual(col.raw_lengths, [190])
        rows = examples(190, 16)
        batch = col(rows)
        labels = batch["labels"].numpy()
        self.assertEqual(batch["input_ids"].shape, (16, 173))
        self.assertTrue(np.all(((labels >= 2) & ~is_sentinel(labels)).sum(1) == 29))
        self.assertTrue(np.all(is_sentinel(labels).sum(1) == 10))
        for row in range(16):
            self.assertEqual(rebuild(batch["input_ids"][row, 1:].numpy(), labels[row]), rows[row]["input_ids"].tolist())

    def test_replace_runs_rows_of_different_lengths(self):
        tokens = np.array([[5, 6, 7, 8, 9], [5, 6, 7, 8, 9]])
        runs = np.array([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]], dtype=bool)
        out = dc.replace_runs(tokens, runs, 6, -100, np.array([99, 98]), EOS)
        np.testing.assert_array_equal(out, [[5, 99, 8, 98, EOS, -100], [5, 99, 7, 8, 9, EOS]])
        # The same rows laid end to end, the second cut to 3 tokens; a run at a row's end stays its own.
        out = dc.replace_runs(tokens.reshape(-1)[:8], runs.reshape(-1)[:8], 6, -100, np.array([99, 98]), EOS,
                              lengths=np.array([5, 3]))
        np.testing.assert_array_equal(out, [[5, 99, 8, 98, EOS, -100], [5, 99, 7, EOS, -100, -100]])
        out = dc.replace_runs(np.arange(4), np.array([0, 1, 1, 1], dtype=bool), 3, -100, np.array([99, 98]), EOS,
                              lengths=np.array([2, 2]))
        np.testing.assert_array_equal(out, [[0, 99, EOS], [99, EOS, -100]])

    def test_ul2_entries_are_span_denoisers_unless_their_mean_is_none(self):
        # UL2_DENOISERS are built at import; ul2_denoiser itself, called here, is what builds them.
        self.assertEqual(dn.ul2_denoiser("r", 3.0, 0.15, "[NLU]"), dn.Denoiser("r", "span", 3.0, 0.15, "[NLU]"))
        self.assertEqual(dn.ul2_denoiser("s", None, 0.25, "[S2S]"), dn.Denoiser("s", "prefix", None, 0.25, "[S2S]"))

    @parameterized.named_parameters(
        ("unnamed", [{"kind": "span"}], "mixture entry 0 (unnamed): missing name, mean_noise_span_length, "
                                        "noise_density, mode_token, rate"),
        ("span_without_mean", [dict(name="a", kind="span", noise_density=0.15, mode_token="[NLU]", rate=1)],
         "mixture entry 0 (a): missing mean_noise_span_length"),
        ("unknown_only", [dict(name="a", kind="prefix", noise_density=0.5, mode_token="[S2S]", rate=1, span=3, x=1)],
         "mixture entry 0 (a): unknown keys ['span', 'x'] (the keys are " + KEYS + ")"),
        ("unknown_and_missing", [dict(name="a", kind="span", span=3)], "mixture entry 0 (a): unknown keys ['span'] "
         "(the keys are " + KEYS + "); missing mean_noise_span_length, noise_density, mode_token, rate"),
        ("rate_true", [dict(name="a", kind="prefix", noise_density=0.5, mode_token="[S2S]", rate=True)],
         "mixture entry 0 (a): rate must be a number > 0, got True"),
        ("rate_text", [dict(name="a", kind="prefix", noise_density=0.5, mode_token="[S2S]", rate="3")],
         "mixture entry 0 (a): rate must be a number > 0, got '3'"),
        ("unknown_name", "ul3", "unknown mixture 'ul3'; known: ul2, or a list of denoisers with the keys " + KEYS),
        ("empty", [], "a mixture is a name (ul2) or a non-empty list of denoisers, got []"),
        ("not_a_mapping", ["R"], "mixture entry 0 must be a mapping with the keys " + KEYS + ", got 'R'"),
    )
    def test_parser_messages_in_full(self, spec, message):
        with self.assertRaisesWithLiteralMatch(ValueError, message):
            dn.parse_mixture(spec)

    @parameterized.named_parameters(
        ("no_name", dict(name=5), "a denoiser needs a non-empty name, got 5"),
        ("empty_name", dict(name=""), "a denoiser needs a non-empty name, got ''"),
        ("density_text", dict(noise_density="0.5"),
         "denoiser 'x': noise_density must be a number in (0, 1), got '0.5'"),
        ("mean_text", dict(mean_noise_span_length="3"), "denoiser 'x': mean_noise_span_length must be a number >= 1, "
                                                        "got '3'"),
        ("prefix_density_zero", dict(kind="prefix", mean_noise_span_length=None, noise_density=0),
         "denoiser 'x': noise_density must be a number in (0, 0.5], got 0"),
    )
    def test_denoiser_refuses(self, change, message):
        fields = dict(name="x", kind="span", mean_noise_span_length=3.0, noise_density=0.15, mode_token="[NLU]")
        with self.assertRaisesWithLiteralMatch(ValueError, message):
            dn.Denoiser(**{**fields, **change})

    def test_denoiser_bounds_that_are_allowed(self):
        # A span denoiser may put more than half the chunk in noise, and have spans of one token on average.
        self.assertEqual(dn.Denoiser("x", "span", 1, 0.6, "[NLG]").mean_noise_span_length, 1)
        self.assertEqual(dn.Denoiser("x", "prefix", None, 0.5, "[S2S]").noise_density, 0.5)

    def test_read_mixture(self):
        self.assertEqual(dn.read_mixture(None), (dn.UL2_DENOISERS, dn.UL2_RATES))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "mix.yaml")
            with open(path, "w", encoding="utf-8") as f:
                f.write('- {name: "é", kind: prefix, noise_density: 0.5, mode_token: "[S2S]", rate: 2}\n')
            self.assertEqual(dn.read_mixture(path), ((dn.Denoiser("é", "prefix", None, 0.5, "[S2S]"),), (2.0,)))
            with fixtures.ascii_locale():  # read as UTF-8 also where the locale's codec is ASCII
                self.assertEqual(dn.read_mixture(path)[0][0].name, "é")
            with self.assertRaisesWithLiteralMatch(
                    UsageError, f"--denoisers {tmp}/none.yaml: No such file or directory; pass a YAML file that lists "
                    "the denoisers"):
                dn.read_mixture(os.path.join(tmp, "none.yaml"))
            with open(path, "w", encoding="utf-8") as f:
                f.write("[]\n")
            with self.assertRaisesWithLiteralMatch(
                    UsageError, f"--denoisers {path}: a mixture is a name (ul2) or a non-empty list of denoisers, "
                    "got []"):
                dn.read_mixture(path)
            with open(path, "w", encoding="utf-8") as f:
                f.write("- {name: a\n")
            with self.assertRaisesRegex(UsageError, rf"^--denoisers {path}: while parsing a flow mapping$"):
                dn.read_mixture(path)

    def test_denoiser_draws_of_given_rows_are_pinned(self):
        # A row's denoiser is draw 0 of its DENOISER stream: pinned, so that a change to which draw is read
        # (and to every UL2 run's data) shows here.
        col = collator(32)
        ids = col(examples(col.raw_length, 16))["denoiser_ids"]
        self.assertEqual(ids.tolist(), [5, 6, 5, 3, 0, 2, 3, 5, 5, 6, 4, 4, 1, 5, 2, 6])
        self.assertTrue(torch.equal(ids, collator(32, seed=0)(examples(col.raw_length, 16))["denoiser_ids"]))
        self.assertFalse(torch.equal(ids, collator(32, seed=1)(examples(col.raw_length, 16))["denoiser_ids"]))
        default_seed = dn.DataCollatorForDenoiserMixture(Vocabulary(), input_length=32, denoisers=dn.UL2_DENOISERS,
                                                         rates=dn.UL2_RATES)
        self.assertTrue(torch.equal(ids, default_seed(examples(col.raw_length, 16))["denoiser_ids"]))

    def test_collator_arguments_refused_in_full(self):
        r, s = UL2["R_3_0.15"], UL2["S_0.25"]
        for kw, message in (
                (dict(input_length=32, denoisers=[r, s], rates=[1]),
                 "give one rate per denoiser: 2 denoisers, 1 rates"),
                (dict(input_length=32, denoisers=[r, s], rates=[1, 0]), "rates must all be > 0, got [1.0, 0.0]"),
                (dict(input_length=3, denoisers=[r], rates=[1]),
                 "input_length must be at least 4 (mode token, text, EOS), got 3"),
                (dict(input_length=32, denoisers=[r], rates=[1], tokenizer=Vocabulary(modes={})),
                 "the tokenizer has no single token for the mode tokens ['[NLU]']; add them with "
                 "tokenizer.add_special_tokens({'additional_special_tokens': ['[NLU]']}), save it, and resize the "
                 "model's embeddings (model.resize_token_embeddings(len(tokenizer)))"),
                (dict(input_length=512, denoisers=dn.UL2_DENOISERS, rates=dn.UL2_RATES, tokenizer=Vocabulary(100)),
                 "denoiser 'X_3_0.5' puts 127 noise spans in a 512-token input, but the tokenizer has only 100 "
                 "sentinels (<extra_id_0>..<extra_id_99>); add more, shorten input_length, or drop that denoiser")):
            with self.assertRaisesWithLiteralMatch(ValueError, message):
                dn.DataCollatorForDenoiserMixture(kw.pop("tokenizer", Vocabulary()), **kw)
        # The shortest input: mode token, one token of text, EOS (a span row corrupts 2 raw tokens to 3).
        batch = dn.DataCollatorForDenoiserMixture(Vocabulary(), input_length=4, denoisers=[r, s],
                                                  rates=[1, 1])(examples(3, 8))
        self.assertEqual(batch["input_ids"].shape, (8, 4))

    def test_a_draw_on_a_rate_boundary_goes_to_the_later_denoiser(self):
        # Row idx -7749262743173450307 of seed 0 (found by inverting row_keys' SplitMix64 steps) draws exactly
        # 0.5: of two equal rates, draws in [0, 0.5) take the first denoiser and [0.5, 1) the second.
        col = collator(32, ["R_3_0.15", "S_0.25"])
        row = {"input_ids": examples(col.raw_length, 1)[0]["input_ids"], "idx": -7749262743173450307}
        key = row_keys.stream(row_keys.row_keys(0, [row["idx"]]), row_keys.DENOISER)
        self.assertEqual(row_keys.uniforms(key, 0).tolist(), [0.5])
        self.assertEqual(col([row])["denoiser_ids"].tolist(), [1])

    def test_a_prefix_only_mixture_needs_no_sentinels(self):
        col = dn.DataCollatorForDenoiserMixture(Vocabulary(sentinels=0), input_length=32, denoisers=[UL2["S_0.25"]],
                                                rates=[1])
        self.assertLen(col.sentinel_ids, 0)
        self.assertEqual(col(examples(col.raw_length, 4))["input_ids"].shape, (4, 32))


class ResumeCheckTest(parameterized.TestCase):
    """A checkpoint resumes only into the mixture of denoisers (or the absence of one) it was made with."""

    UL2 = dn.denoiser_record(dn.UL2_DENOISERS, [1.0] * len(dn.UL2_DENOISERS), 512)

    def test_the_same_mixture_or_none_on_both_sides_resumes(self):
        dn.check_same_denoisers(self.UL2, dn.denoiser_record(dn.UL2_DENOISERS, [1.0] * len(dn.UL2_DENOISERS), 512), "ckpt")
        dn.check_same_denoisers({}, {}, "ckpt")

    def test_uneven_rates_are_shown_as_shares(self):
        saved = dn.denoiser_record(dn.UL2_DENOISERS[:2], [3.0, 1.0], 64)
        with self.assertRaisesWithLiteralMatch(
                UsageError, "checkpoint ckpt was pretrained on another mixture of denoisers (R_3_0.15 75%, "
                "R_8_0.15 25% at 64 tokens) than this run's (R_3_0.15 50%, R_8_0.15 50% at 64 tokens); resume with "
                "its --denoisers file (unchanged) and --max_seq_length, or start a new run from its weights with "
                "--model_name_or_path"):
            dn.check_same_denoisers(saved, dn.denoiser_record(dn.UL2_DENOISERS[:2], [1.0, 1.0], 64), "ckpt")

    @parameterized.named_parameters(
        ("ul2_resumed_as_another_objective", UL2, {}, r"pretrained with --objective ul2 \(R_3_0.15 14%.* at 512 "
                                                     r"tokens\) and this run has another objective; resume with "
                                                     r"--objective ul2"),
        ("another_objective_resumed_as_ul2", {}, UL2, r"pretrained with another objective than this run's --objective "
                                                     r"ul2 \(R_3_0.15 14%.*\); resume with the checkpoint's --objective"),
        ("another_input_length", UL2, dn.denoiser_record(dn.UL2_DENOISERS, [1.0] * len(dn.UL2_DENOISERS), 256),
         r"pretrained on another mixture of denoisers .* at 512 tokens\) than this run's \(.* at 256 tokens\)"),
    )
    def test_another_mixture_is_one_line(self, saved, now, said):
        with self.assertRaisesRegex(UsageError, "checkpoint ckpt was " + said) as cm:
            dn.check_same_denoisers(saved, now, "ckpt")
        self.assertNotIn("None", str(cm.exception))
        self.assertIn("--model_name_or_path", str(cm.exception))


if __name__ == "__main__":
    absltest.main()
