"""Mixing rates (T5 §3.5.2), the mixture's sampler, its shards, and the trained-rows file, on hand-computed cases."""
from __future__ import annotations

import csv
import json
import os
import re
import tempfile

import torch
from absl.testing import absltest, parameterized
from accelerate.data_loader import prepare_data_loader

from t5_training.registry import GLUE
from t5_training import mixture
from t5_training.errors import UsageError
from tests import fixtures

# T5's GLUE mixture weights (t5/data/glue_utils.py, get_glue_weight_mapping): the training split sizes.
GLUE_TRAIN_ROWS = {"cola": 8551, "sst2": 67349, "mrpc": 3668, "qqp": 363849, "stsb": 5749, "mnli": 392702,
                   "qnli": 104743, "rte": 2490, "wnli": 635}


class RatesTest(parameterized.TestCase):

    def test_examples_proportional_is_the_share_of_training_rows(self):
        rates = mixture.mixing_rates({"a": 100, "b": 300, "c": 600}, "examples_proportional")
        self.assertEqual(rates, {"a": 0.1, "b": 0.3, "c": 0.6})

    def test_the_cap_limits_each_size(self):
        rates = mixture.mixing_rates({"a": 100, "b": 300, "c": 600}, "examples_proportional", cap=200)
        self.assertEqual(rates, {"a": 0.2, "b": 0.4, "c": 0.4})

    def test_the_cap_comes_before_the_temperature(self):
        # min(n, K) ** (1/T), as seqio.mixing_rate_num_examples: 100, 400 -> (100, 400) -> (10, 20). The
        # other order, min(n ** (1/T), K), would give (10, 30) for 900.
        rates = mixture.mixing_rates({"a": 100, "b": 900}, "temperature", cap=400, temperature=2)
        self.assertAlmostEqual(rates["a"], 10 / 30)
        self.assertAlmostEqual(rates["b"], 20 / 30)

    def test_temperature_flattens_towards_equal(self):
        sizes = {"a": 16, "b": 256}
        self.assertAlmostEqual(mixture.mixing_rates(sizes, "temperature", temperature=4)["a"], 2 / (2 + 4))
        self.assertAlmostEqual(mixture.mixing_rates(sizes, "temperature", temperature=1)["a"], 16 / 272)

    def test_equal_ignores_sizes(self):
        self.assertEqual(mixture.mixing_rates({"a": 1, "b": 10, "c": 1000}, "equal"),
                         {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})

    def test_glue_at_t5s_limit(self):
        # K = 2^16 caps QQP, MNLI, QNLI and SST-2 at 65,536; the rest keep their sizes.
        rates = mixture.mixing_rates(GLUE_TRAIN_ROWS, "examples_proportional", cap=2 ** 16)
        total = 4 * 65536 + 8551 + 3668 + 5749 + 2490 + 635
        self.assertAlmostEqual(rates["mnli"], 65536 / total)
        self.assertAlmostEqual(rates["rte"], 2490 / total)
        self.assertAlmostEqual(sum(rates.values()), 1.0)

    def test_apportion_gives_the_remainder_to_the_largest_fraction(self):
        # 3 x (0.8, 0.2) = (2.4, 0.6): floors (2, 0), and the one row left goes to the second task's 0.6.
        self.assertEqual(mixture.apportion([0.8, 0.2], 3), [2, 1])
        # Without an epoch, the first: 10 x 1/3 each, its spare row to the first task.
        self.assertEqual(mixture.epoch_counts([1 / 3] * 3, 10), [4, 3, 3])

    def test_epoch_counts_split_rows_exactly(self):
        self.assertEqual(mixture.epoch_counts([0.5, 0.25, 0.25], 8), [4, 2, 2])
        # 10 x (1/3, 1/3, 1/3) = 3.33 each: the one row left goes to the first of the tied tasks, and
        # the next epochs' to the others, so that no task falls behind its share.
        self.assertEqual([mixture.epoch_counts([1 / 3] * 3, 10, e) for e in range(3)],
                         [[4, 3, 3], [3, 4, 3], [3, 3, 4]])
        rates = list(mixture.mixing_rates(GLUE_TRAIN_ROWS, "temperature", temperature=2).values())
        totals = [0] * len(rates)
        for epoch in range(50):
            counts = mixture.epoch_counts(rates, 997, epoch)
            self.assertEqual(sum(counts), 997)
            totals = [t + c for t, c in zip(totals, counts)]
            for rate, total in zip(rates, totals):
                self.assertLess(abs(total - rate * 997 * (epoch + 1)), 1)


def _sampler(sizes, rates, epoch_rows=960, seed=0, **kwargs):
    return mixture.MixtureSampler(list(sizes), list(rates), epoch_rows, seed, **kwargs)


class SamplerTest(parameterized.TestCase):

    # Scaled-down GLUE sizes: from 635 rows to 39k, a 60-fold spread.
    SIZES = {name: max(rows // 10, 60) for name, rows in GLUE_TRAIN_ROWS.items()}

    @parameterized.named_parameters(
        ("examples_proportional", "examples_proportional", None, None),
        ("proportional_capped", "examples_proportional", 2000, None),
        ("temperature", "temperature", 3000, 2.0),
        ("equal", "equal", None, None),
    )
    def test_realised_rates_within_one_percent_of_configured(self, mode, cap, temperature):
        rates = mixture.mixing_rates(self.SIZES, mode, cap, temperature)
        sampler = _sampler(self.SIZES.values(), rates.values(), epoch_rows=20000, seed=5)
        # 240,000 rows, 12 whole epochs: even the smallest share (WNLI's) is drawn over 150 times.
        tasks, _ = sampler.task_rows(sampler.trained(12, 0))
        counts = torch.bincount(tasks, minlength=len(rates))
        for (name, rate), count in zip(rates.items(), counts.tolist()):
            realised = count / 240000
            self.assertLess(abs(realised - rate), 0.01 * rate, f"{name}: {realised:.5f} vs {rate:.5f}")

    def test_an_order_is_a_function_of_seed_and_epoch(self):
        a = _sampler([50, 70], [0.3, 0.7], seed=1)
        b = _sampler([50, 70], [0.3, 0.7], seed=1)
        b.order(3)  # what b drew before does not matter
        self.assertTrue(torch.equal(a.order(2), b.order(2)))
        self.assertFalse(torch.equal(a.order(2), a.order(3)))
        self.assertFalse(torch.equal(a.order(2), _sampler([50, 70], [0.3, 0.7], seed=2).order(2)))
        # Before any set_epoch, as the first epoch's loader sees it: epoch 0.
        self.assertEqual(list(_sampler([50, 70], [0.3, 0.7], seed=1)), a.order(0).tolist())
        a.set_epoch(4)
        self.assertEqual(list(a), a.order(4).tolist())

    @parameterized.named_parameters(
        ("rates_for_other_tasks", [5, 5], [1.0], 10, "sizes [5, 5], rates [1.0], 10 rows"),
        ("empty_task", [0, 5], [0.5, 0.5], 10, "sizes [0, 5], rates [0.5, 0.5], 10 rows"),
        # 0.25 x 3 rows: the small task would get no row in some epochs.
        ("share_under_one_row", [5, 5], [0.75, 0.25], 3, "sizes [5, 5], rates [0.75, 0.25], 3 rows"),
    )
    def test_bad_mixture_is_refused(self, sizes, rates, epoch_rows, said):
        with self.assertRaisesRegex(ValueError, "^bad mixture: " + re.escape(said) + " per epoch$"):
            _sampler(sizes, rates, epoch_rows=epoch_rows)

    def test_the_smallest_good_mixture(self):
        # A task of one row, and a share of exactly one row an epoch (0.25 x 4).
        sampler = _sampler([1, 5], [0.25, 0.75], epoch_rows=4)
        tasks, rows = sampler.task_rows(sampler.order(0))
        self.assertEqual((tasks == 0).sum().item(), 1)
        self.assertEqual(rows[tasks == 0].tolist(), [0])

    def test_an_epoch_in_which_a_task_draws_no_row(self):
        # A share of 1.11 rows an epoch: epoch 3's cumulative apportionment gives the third task none
        # (3.33 rounds up to 4 after epoch 2, 4.44 down to 4 after epoch 3).
        sampler = _sampler([7, 7, 7], [4 / 9, 4 / 9, 1 / 9], epoch_rows=10)
        self.assertEqual(mixture.epoch_counts(sampler.rates, 10, 3), [5, 5, 0])
        tasks, rows = sampler.task_rows(sampler.order(3))
        self.assertEqual(torch.bincount(tasks, minlength=3).tolist(), [5, 5, 0])
        # The other tasks' draws are whole rows of their own, not left-over or shared slots.
        self.assertEqual(sampler.order(3).dtype, torch.int64)
        for task in (0, 1):
            self.assertEqual(len(set(rows[tasks == task].tolist())), 5)

    def test_lengths_without_batch_size_group_one_row_batches(self):
        lengths = [(i * 37) % 61 + 1 for i in range(120)]
        grouped = _sampler([50, 70], [0.3, 0.7], lengths=lengths)
        self.assertEqual(grouped.batch_size, 1)
        self.assertTrue(torch.equal(grouped.order(0),
                                    _sampler([50, 70], [0.3, 0.7], lengths=lengths, batch_size=1).order(0)))

    def test_a_tasks_rows_change_with_seed_and_epoch(self):
        # Not only where a task's rows sit (the slots' shuffle): which rows, and in what order.
        def rows_of_task_0(seed, epoch):
            sampler = _sampler([50, 70], [0.3, 0.7], seed=seed)
            tasks, rows = sampler.task_rows(sampler.order(epoch))
            return rows[tasks == 0].tolist()

        self.assertNotEqual(rows_of_task_0(1, 0), rows_of_task_0(1, 1))
        self.assertNotEqual(rows_of_task_0(1, 0), rows_of_task_0(2, 0))

    def test_tasks_of_one_size_draw_different_rows(self):
        # Each task has a stream of its own: two tasks of 50 rows do not walk the same permutation.
        sampler = _sampler([50, 50], [0.5, 0.5], epoch_rows=100, seed=3)
        tasks, rows = sampler.task_rows(sampler.order(0))
        self.assertNotEqual(rows[tasks == 0].tolist(), rows[tasks == 1].tolist())

    def test_global_rng_untouched(self):
        torch.manual_seed(0)
        expected = torch.rand(3)
        torch.manual_seed(0)
        list(_sampler([50, 70], [0.3, 0.7], lengths=list(range(120)), batch_size=8))
        self.assertTrue(torch.equal(torch.rand(3), expected))

    def test_a_task_repeats_no_row_before_it_has_used_them_all(self):
        # Task 0 has 50 rows and takes 0.7 x 960 = 672 draws an epoch: 13 whole passes and 22 rows.
        sampler = _sampler([50, 70], [0.7, 0.3])
        tasks, rows = sampler.task_rows(sampler.order(0))
        mine = rows[tasks == 0]
        self.assertLen(mine, 672)
        for start in range(0, 650, 50):
            self.assertEqual(sorted(mine[start:start + 50].tolist()), list(range(50)))
        self.assertLen(set(mine[650:].tolist()), 22)
        # Indices are the tasks' rows laid end to end: task 1 starts at 50.
        order = sampler.order(0)
        self.assertTrue(torch.equal(order[tasks == 1] - 50, rows[tasks == 1]))

    def test_group_by_length_keeps_the_epochs_rows_and_pads_less(self):
        sizes, rates = [300, 200], [0.5, 0.5]
        lengths = [(i * 37) % 61 + 1 for i in range(500)]
        plain = _sampler(sizes, rates, epoch_rows=480, seed=3)
        grouped = _sampler(sizes, rates, epoch_rows=480, seed=3, lengths=lengths, batch_size=16)
        for epoch in (0, 1):
            self.assertEqual(sorted(grouped.order(epoch).tolist()), sorted(plain.order(epoch).tolist()))

        def padded(order):
            widths = [max(lengths[i] for i in order[k:k + 16]) for k in range(0, len(order), 16)]
            return 16 * sum(widths)

        self.assertLess(padded(grouped.order(0).tolist()), 0.7 * padded(plain.order(0).tolist()))

    def test_two_processes_share_each_global_batch_without_a_row_twice(self):
        # accelerate deals a prepared loader's batches to the processes, as fine_tune_t5.py runs it.
        sampler = _sampler([90, 40, 200], [0.5, 0.2, 0.3], epoch_rows=96, seed=4)
        rows = list(range(330))
        seen = []
        for rank in (0, 1):
            loader = torch.utils.data.DataLoader(rows, batch_size=4, sampler=sampler)
            shard = prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False,
                                        use_seedable_sampler=False)
            shard.set_epoch(1)
            seen.append([i for batch in shard for i in batch.tolist()])
        self.assertLen(seen[0], 48)
        self.assertLen(seen[1], 48)
        # Each micro-batch of 8 rows: the first 4 to process 0, the next 4 to process 1.
        # So every position of the epoch's order went to exactly one process (a row recurs only where
        # the mixture drew it twice).
        interleaved = [row for b in range(12) for row in seen[0][4 * b:4 * b + 4] + seen[1][4 * b:4 * b + 4]]
        self.assertEqual(interleaved, sampler.order(1).tolist())


class TrainedRowsTest(absltest.TestCase):

    def test_rows_file_lists_every_row_trained_and_the_rates(self):
        sampler = _sampler([30, 10], [0.75, 0.25], epoch_rows=40, seed=2)
        with tempfile.TemporaryDirectory() as out:
            logged = []
            summary = mixture.write_trained_rows(out, ["big", "small"], sampler, 1, 16, log=logged.append)
            with open(os.path.join(out, mixture.ROWS_FILE), "rb") as f:
                raw = f.read()
            # Plain "\n" line ends (no "\r"), as the other TSVs the runs write.
            self.assertNotIn(b"\r", raw)
            rows = list(csv.reader(raw.decode("utf-8").splitlines(), delimiter="\t"))
            with open(os.path.join(out, mixture.RATES_FILE), encoding="utf-8") as f:
                text = f.read()
            self.assertEqual(json.loads(text), summary)
            self.assertStartsWith(text, '{\n  "big": {\n    "train_rows": 30,')  # indented for people to read
        self.assertEqual(rows[0], ["position", "task", "row"])
        self.assertLen(rows, 1 + 56)
        expected = torch.cat([sampler.order(0), sampler.order(1)[:16]]).tolist()
        names = ["big", "small"]
        self.assertEqual([(names[0] if i < 30 else names[1], i if i < 30 else i - 30) for i in expected],
                         [(task, int(row)) for _, task, row in rows[1:]])
        # A whole epoch holds exactly 30 and 10; the 16 rows of the next split 12 and 4 or near it.
        self.assertEqual(summary["big"]["rows_trained"] + summary["small"]["rows_trained"], 56)
        self.assertEqual(summary["big"]["configured_rate"], 0.75)
        self.assertEqual(summary["small"]["distinct_rows"], 10)
        # The whole summary, counted here from the order itself.
        big = [i for i in expected if i < 30]
        small = [i for i in expected if i >= 30]
        self.assertEqual(summary, {
            "big": {"train_rows": 30, "configured_rate": 0.75, "realised_rate": len(big) / 56,
                    "rows_trained": len(big), "distinct_rows": len(set(big))},
            "small": {"train_rows": 10, "configured_rate": 0.25, "realised_rate": len(small) / 56,
                      "rows_trained": len(small), "distinct_rows": len(set(small))}})
        self.assertEqual(logged, [f"mixture: big {len(big)} rows ({100 * len(big) / 56:.2f}% vs 75.00% configured), "
                                  f"small {len(small)} rows ({100 * len(small) / 56:.2f}% vs 25.00% configured)"])

    def test_task_names_are_written_as_utf8_whatever_the_locale(self):
        # A user's task may have any name; the rows file is UTF-8 also where the locale's codec is ASCII.
        sampler = _sampler([3, 2], [0.5, 0.5], epoch_rows=4)
        with tempfile.TemporaryDirectory() as out, fixtures.ascii_locale():
            mixture.write_trained_rows(out, ["größe", "ß"], sampler, 1, 0, log=lambda *_: None)
            with open(os.path.join(out, mixture.ROWS_FILE), encoding="utf-8") as f:
                names = {row.split("\t")[1] for row in f.read().splitlines()[1:]}
        self.assertEqual(names, {"größe", "ß"})

    def test_one_row_trained(self):
        # A single row drawn: its task's realised rate is all of it, the other's none.
        sampler = _sampler([30, 10], [0.75, 0.25], epoch_rows=40, seed=2)
        first = 0 if sampler.order(0)[0] < 30 else 1
        with tempfile.TemporaryDirectory() as out:
            summary = mixture.write_trained_rows(out, ["big", "small"], sampler, 0, 1, log=lambda *_: None)
        self.assertEqual([summary[name]["realised_rate"] for name in ("big", "small")],
                         [1.0, 0.0] if first == 0 else [0.0, 1.0])


class FlagsTest(parameterized.TestCase):

    def test_task_names(self):
        self.assertEqual(mixture.task_names(GLUE, "all"), tuple(GLUE))
        self.assertEqual(mixture.task_names(GLUE, "cola, sst2,mrpc"), ("cola", "sst2", "mrpc"))
        self.assertEqual(mixture.task_names(GLUE, "sst2"), ("sst2",))
        with self.assertRaisesRegex(UsageError, r"^unknown task 'sts' in --dataset_name 'cola,sts'; known: cola, "
                                                r"sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli, or all$"):
            mixture.task_names(GLUE, "cola,sts")
        with self.assertRaisesRegex(UsageError, r"^--dataset_name names cola twice; name each task once \(rates "
                                                r"come from --mixing\)$"):
            mixture.task_names(GLUE, "cola,sst2,cola")

    @parameterized.named_parameters(
        ("flags_with_one_task", ["sst2"], {"mixing": "equal"},
         "--mixing mixes several tasks, and --dataset_name names one (sst2); name several (e.g. --dataset_name "
         "cola,sst2 or all) or drop the mixture flags"),
        ("temperature_not_positive", ["a", "b"], {"mixing": "temperature", "mixing_temperature": -1.0},
         "--mixing_temperature must be positive, got -1.0; T5 used 2, 8 and 256 (1 is examples-proportional)"),
        ("temperature_zero", ["a", "b"], {"mixing": "temperature", "mixing_temperature": 0.0},
         "--mixing_temperature must be positive, got 0.0; T5 used 2, 8 and 256 (1 is examples-proportional)"),
        ("temperature_without_t", ["a", "b"], {"mixing": "temperature"},
         "--mixing temperature needs --mixing_temperature T (rates ∝ size^(1/T); T5 used 2, 8, 256)"),
        # No --mixing is examples_proportional, and the message says so.
        ("t_without_temperature", ["a", "b"], {"mixing_temperature": 2.0},
         "--mixing_temperature applies to --mixing temperature, not examples_proportional; add --mixing "
         "temperature or drop it"),
        ("cap_below_one", ["a", "b"], {"mixing_cap": 0},
         "--mixing_cap must be at least 1, got 0; T5 used 2^16 to 2^21"),
        ("cap_with_equal", ["a", "b"], {"mixing": "equal", "mixing_cap": 10},
         "--mixing_cap limits the sizes that rates are computed from, and --mixing equal uses no size; drop "
         "--mixing_cap or use examples_proportional or temperature"),
    )
    def test_misused_flags_are_one_line(self, names, flags, message):
        with self.assertRaisesRegex(UsageError, "^" + re.escape(message) + "$"):
            mixture.MixtureConfig(**flags).check_mixture_flags(names)

    def test_good_flags_pass(self):
        mixture.MixtureConfig().check_mixture_flags(["sst2"])
        mixture.MixtureConfig(mixing="temperature", mixing_temperature=2.0, mixing_cap=100).check_mixture_flags(
            ["a", "b"])
        # The bounds themselves: any positive T (below 1 sharpens the rates), and a cap of one row.
        mixture.MixtureConfig(mixing="temperature", mixing_temperature=0.5, mixing_cap=1).check_mixture_flags(
            ["a", "b"])
        mixture.MixtureConfig(mixing_cap=1).check_mixture_flags(["a", "b"])


class ResumeCheckTest(parameterized.TestCase):
    """Which saved mixture a run may resume: one line naming both sides and the fix, never a KeyError."""

    MIXED = {"tasks": ["sst2", "cola"], "train_rows": [100, 50], "rates": [2 / 3, 1 / 3], "epoch_rows": 144}

    ONE = {"task": "sst2", "train_rows": 100}

    def test_the_same_mixture_or_one_task_on_both_sides_resumes(self):
        mixture.check_same_tasks(dict(self.MIXED), dict(self.MIXED), "ckpt")
        mixture.check_same_tasks(dict(self.ONE), mixture.one_task_record("sst2", 100), "ckpt")
        # An earlier version recorded nothing for one task: its checkpoints resume into one task as before.
        mixture.check_same_tasks({}, dict(self.ONE), "ckpt")

    @parameterized.named_parameters(
        ("mixture_resumed_as_one_task", MIXED, ONE, "was trained on a mixture (sst2 66.67% of 100, cola 33.33% of 50) "
                                                    "and this run trains sst2 (100 training rows)"),
        ("one_task_resumed_into_a_mixture", ONE, MIXED, "was trained on sst2 (100 training rows) and this run "
                                                        "mixes sst2 66.67% of 100"),
        ("earlier_one_task_resumed_into_a_mixture", {}, MIXED, "was trained on one task (it records no mixture) and "
                                                               "this run mixes sst2 66.67% of 100"),
        ("another_task", ONE, {"task": "cola", "train_rows": 50}, "was trained on sst2 (100 training rows) and this "
                                                                  "run trains cola (50 training rows)"),
        ("fewer_rows", ONE, {"task": "sst2", "train_rows": 20}, "was trained on sst2 (100 training rows) and this "
                                                                "run trains sst2 (20 training rows)"),
        ("another_mixture", {**MIXED, "rates": [0.5, 0.5]}, MIXED, "was trained on another mixture (sst2 50.00%"),
    )
    def test_a_different_data_position_is_one_line(self, saved, now, said):
        with self.assertRaisesRegex(UsageError, "checkpoint ckpt " + re.escape(said)) as cm:
            mixture.check_same_tasks(saved, now, "ckpt")
        self.assertTrue(str(cm.exception).endswith(
            "; resume with its --dataset_name, mixing flags and --max_train_samples, or start a new run from its "
            "weights with --model_name_or_path"), str(cm.exception))
        self.assertNotIn("\n", str(cm.exception))

    def test_describe_is_what_the_check_compares(self):
        # The keys a checkpoint's TrainState.mixture holds: changing them would refuse every saved mixture.
        sampler = _sampler([100, 50], [2 / 3, 1 / 3], epoch_rows=144)
        self.assertEqual(mixture.task_record(("sst2", "cola"), sampler), self.MIXED)


if __name__ == "__main__":
    absltest.main()
