"""The experiment pieces the demo and the benchmarks share: files written, runs paired, finished runs reused or refused.

Whole training runs through these pieces are tested by demo_test.py (pretraining, pairs side by side)
and benchmarks_test.py (reuse over reruns); here fine_tune_t5.main is replaced by a stand-in that
writes a finished run's files, so that each rule is checked in milliseconds.
"""
import ast
import json
import os
from unittest import mock

import datasets
from absl.testing import absltest

from t5_training import experiments, reporting, top_level
from t5_training.errors import UsageError
from tests import fixtures


def _split(n: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": [f"article {i}" for i in range(n)], "label": [i % 3 for i in range(n)]})


class FakeFineTune:
    """Stands in for fine_tune_t5.main: records each command line and leaves a finished run in --output_dir,
    whose accuracy is its --seed (plus 10 for a run from --model_name_or_path)."""

    def __init__(self):
        self.calls = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        flags = dict(zip(argv, argv[1:]))
        out = flags["--output_dir"]
        accuracy = float(flags["--seed"]) + (10 if "--model_name_or_path" in argv else 0)
        results = {"train": {"train_steps": 2}, "eval": {"accuracy": accuracy, "loss": 1.0}}
        reporting.write_json(os.path.join(out, "final", "config.json"), {})
        reporting.write_json(os.path.join(out, "train_results.json"), results["train"])
        reporting.write_json(os.path.join(out, "eval_results.json"), results["eval"])
        return results


class FilesTest(fixtures.TempDirTestCase):

    def test_labelled_rows_are_drawn_with_the_seed_or_all_kept_in_order(self):
        split = _split(30)
        every = experiments.write_labelled_rows(split, 30, None, os.path.join(self.dir, "all.jsonl"))
        with open(every, encoding="utf-8") as f:
            self.assertEqual([json.loads(line) for line in f], list(split))
        drawn = {}
        for seed in (0, 1):
            path = experiments.write_labelled_rows(split, 5, seed, os.path.join(self.dir, "rows", f"{seed}.jsonl"))
            with open(path, encoding="utf-8") as f:
                drawn[seed] = [json.loads(line)["text"] for line in f]
            self.assertLen(drawn[seed], 5)
            self.assertEqual(drawn[seed], split.shuffle(seed=seed).select(range(5))["text"])
        self.assertNotEqual(drawn[0], drawn[1])

    def test_more_rows_than_the_split_holds_is_one_clear_error(self):
        with self.assertRaisesRegex(UsageError, "asked for 31 labelled rows but the split has 30; ask for fewer"):
            experiments.write_labelled_rows(_split(30), 31, 0, os.path.join(self.dir, "rows.jsonl"))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "rows.jsonl")))

    def test_corpus_is_one_text_a_line_and_the_held_out_rows_with_labels(self):
        splits = {"train": _split(7), "validation": _split(3)}
        paths = experiments.write_corpus(os.path.join(self.dir, "corpus"), splits)
        with open(paths["train"], encoding="utf-8") as f:
            self.assertEqual(f.read(), "".join(f"article {i}\n" for i in range(7)))
        with open(paths["validation"], encoding="utf-8") as f:
            self.assertEqual(f.read(), "article 0\narticle 1\narticle 2\n")
        with open(paths["validation_rows"], encoding="utf-8") as f:
            self.assertEqual([json.loads(line) for line in f], list(splits["validation"]))

    def test_tokenizer_is_trained_once(self):
        path = os.path.join(self.dir, "tokenizer")
        with mock.patch.object(experiments, "train_tokenizer") as train:
            self.assertEqual(experiments.make_tokenizer(path, ["a b"], ["yes"], 100), path)
            train.assert_called_once_with(["a b", "yes"], path, vocab_size=100, seed=0)
            reporting.write_json(os.path.join(path, "tokenizer.json"), {})
            experiments.make_tokenizer(path, ["a b"], ["yes"], 100)
            train.assert_called_once()


class _FakeFineTuneCase(fixtures.TempDirTestCase):
    """fine_tune_t5.main replaced by a FakeFineTune (`self.fake`) while each test runs."""

    def setUp(self):
        super().setUp()
        self.fake = FakeFineTune()
        patcher = mock.patch.object(top_level.load("fine_tune_t5"), "main", self.fake)
        patcher.start()
        self.addCleanup(patcher.stop)


class ReuseTest(_FakeFineTuneCase):

    def setUp(self):
        super().setUp()
        self.run_dir = os.path.join(self.dir, "run")
        self.argv = ["--learning_rate", "1e-3", "--seed", "4", "--group_by_length"]

    def test_a_finished_run_with_the_same_flags_is_read_back(self):
        first = experiments.fine_tune_once(self.run_dir, self.argv)
        self.assertEqual(self.fake.calls, [[*self.argv, "--output_dir", self.run_dir, "--overwrite_output_dir"]])
        with open(os.path.join(self.run_dir, experiments.REUSE_RECORD), encoding="utf-8") as f:
            self.assertEqual(json.load(f), {"argv": self.argv})
        self.assertEqual(experiments.fine_tune_once(self.run_dir, self.argv), first)
        self.assertLen(self.fake.calls, 1)
        # Without reuse it trains again, and keeps no record.
        experiments.fine_tune_once(os.path.join(self.dir, "other"), self.argv, reuse=False)
        self.assertLen(self.fake.calls, 2)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "other", experiments.REUSE_RECORD)))

    def test_reusable_result_is_none_without_a_finished_run(self):
        self.assertIsNone(experiments.reusable_result(self.run_dir, self.argv))
        os.makedirs(os.path.join(self.run_dir, "final"))
        self.assertIsNone(experiments.reusable_result(self.run_dir, self.argv))

    def test_a_finished_run_with_other_flags_is_refused_naming_each_change(self):
        experiments.fine_tune_once(self.run_dir, self.argv)
        other = ["--learning_rate", "3e-4", "--seed", "4", "--max_steps", "9"]
        with self.assertRaisesRegex(UsageError, r"run holds a finished run trained with other flags \("
                                                r"--group_by_length  -> \(unset\); --learning_rate 1e-3 -> 3e-4; "
                                                r"--max_steps \(unset\) -> 9\); "
                                                "pass another --output_dir or delete it"):
            experiments.fine_tune_once(self.run_dir, other)
        self.assertLen(self.fake.calls, 1)

    def test_a_finished_run_without_a_record_is_refused(self):
        self.fake([*self.argv, "--output_dir", self.run_dir])
        with self.assertRaisesRegex(UsageError, r"other flags \(none recorded\)"):
            experiments.reusable_result(self.run_dir, self.argv)

    def test_equal_flags_pass(self):
        experiments.refuse_other_flags(self.run_dir, list(self.argv), list(self.argv))


class PairsTest(_FakeFineTuneCase):

    def pairs(self, seeds, reuse=True):
        return experiments.fine_tune_pairs({seed: ["--max_steps", "2"] for seed in seeds}, "PRETRAINED", "t5-tiny",
                                           os.path.join(self.dir, "pairs"), reuse=reuse)

    def test_each_seed_trains_the_pretrained_model_and_random_init_alike(self):
        runs = self.pairs([3, 5])
        self.assertEqual(sorted(runs), [3, 5])
        for seed in (3, 5):
            self.assertEqual(list(runs[seed]), list(experiments.INITS))
            self.assertEqual(runs[seed]["pretrained"]["dir"], os.path.join(self.dir, "pairs", f"pretrained-seed{seed}"))
            self.assertEqual(runs[seed]["random init"]["dir"],
                             os.path.join(self.dir, "pairs", f"random_init-seed{seed}"))
            self.assertEqual(runs[seed]["pretrained"]["eval"]["accuracy"], seed + 10)
        self.assertEqual(self.fake.calls[0], ["--max_steps", "2", "--model_name_or_path", "PRETRAINED", "--seed", "3",
                                              "--output_dir", os.path.join(self.dir, "pairs", "pretrained-seed3"),
                                              "--overwrite_output_dir"])
        self.assertEqual(self.fake.calls[1][:5], ["--max_steps", "2", "--config_name", "t5-tiny", "--seed"])
        self.assertLen(self.fake.calls, 4)

    def test_a_rerun_with_another_seed_trains_only_the_new_pair(self):
        first = self.pairs([3])
        again = self.pairs([3, 4])
        self.assertLen(self.fake.calls, 4)
        self.assertEqual(again[3], first[3])
        self.assertEqual({call[call.index("--seed") + 1] for call in self.fake.calls[2:]}, {"4"})

    def test_a_rerun_with_other_flags_stops_before_training(self):
        self.pairs([3])
        with self.assertRaisesRegex(UsageError, r"--max_steps 2 -> 3"):
            experiments.fine_tune_pairs({3: ["--max_steps", "3"], 4: ["--max_steps", "3"]}, "PRETRAINED", "t5-tiny",
                                        os.path.join(self.dir, "pairs"), reuse=True)
        self.assertLen(self.fake.calls, 2)


class SummarizeTest(absltest.TestCase):

    def test_rows_per_init_and_the_paired_difference(self):
        runs = {0: {"pretrained": {"eval": {"accuracy": 80.0, "loss": 1.0}},
                    "random init": {"eval": {"accuracy": 70.0, "loss": 1.5}}},
                1: {"pretrained": {"eval": {"accuracy": 76.0, "loss": 1.2}},
                    "random init": {"eval": {"accuracy": 72.0, "loss": 1.7}}}}
        summary = experiments.summarize(runs, "accuracy")
        self.assertEqual(summary["table"], [
            {"model": "pretrained", "seed 0": 80.0, "seed 1": 76.0, "mean": 78.0, "held-out loss": 1.1},
            {"model": "random init", "seed 0": 70.0, "seed 1": 72.0, "mean": 71.0, "held-out loss": 1.6},
            {"model": "pretrained - random init", "seed 0": 10.0, "seed 1": 4.0, "mean": 7.0},
        ])
        difference = summary["difference"]
        self.assertEqual((difference["mean"], difference["pairs"], difference["wins"]), (7.0, 2, 2))
        # Differences 10 and 4: sd 3 * sqrt(2), t(0.975, 1) = 12.706; half-width 12.706 * 3 = 38.12.
        self.assertAlmostEqual(difference["high"] - difference["mean"], 38.118, places=2)


class ImportsTest(absltest.TestCase):

    def test_it_imports_no_top_level_file(self):
        # The scripts' main() are reached through top_level.load at call time, never imported.
        with open(os.path.join(fixtures.REPO, "t5_training", "experiments.py"), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = {name.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for name in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                     if isinstance(node, ast.ImportFrom) and node.module}
        self.assertEqual(imported & set(top_level.FILES), set())


if __name__ == "__main__":
    absltest.main()
