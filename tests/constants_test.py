"""Registry checks for constants.DATASET_VALS, and adding a dataset as one entry."""

import ast
import collections
import csv
import dataclasses
import os
import sys

from absl.testing import absltest, parameterized
from absl.testing.absltest import mock
import datasets

import constants
from constants import DATASET_VALS, LocalFiles, TaskEntry
from tests import fixtures
from t5_training import data, metrics, registry, tasks, top_level
from t5_training.errors import UsageError

CONSTANTS_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "constants.py")

ENTRIES = [(f"{benchmark}_{task}", benchmark, task)
           for benchmark, entries in sorted(DATASET_VALS.items()) for task in sorted(entries)]


class RegistryTest(parameterized.TestCase):

    def test_knows_every_glue_task(self):
        self.assertEqual(sorted(DATASET_VALS["glue"]),
                         ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli"])
        self.assertLen(ENTRIES, 12)

    def test_prefixes_unique_within_and_across_benchmarks(self):
        prefixes = collections.Counter(entry.prefix for entries in DATASET_VALS.values()
                                       for entry in entries.values())
        self.assertEqual([p for p, n in prefixes.items() if n > 1], [])
        self.assertNotIn("", prefixes)

    def test_tasks_read_the_same_registry_object(self):
        # mock.patch.dict(constants.DATASET_VALS, ...) below only works because of this.
        self.assertIs(tasks.DATASET_VALS, constants.DATASET_VALS)

    @parameterized.named_parameters(*ENTRIES)
    def test_entry(self, benchmark, task):
        entry = DATASET_VALS[benchmark][task]
        self.assertIsInstance(entry, TaskEntry)
        self.assertIs(tasks.get_entry(benchmark, task), entry)
        self.assertIn(entry.kind, ("classification", "regression", "seq2seq"))
        self.assertTrue(entry.inputs)
        self.assertNotIn(entry.target, entry.inputs)
        self.assertLen(set(entry.inputs), len(entry.inputs))
        if entry.show_keys:
            # T5 writes "key: value" pairs with the keys sorted by name (MNLI: hypothesis, premise).
            self.assertEqual(list(entry.inputs), sorted(entry.inputs))

    @parameterized.named_parameters(*ENTRIES)
    def test_metrics_known(self, benchmark, task):
        entry = DATASET_VALS[benchmark][task]
        self.assertTrue(entry.metrics)
        for name in entry.metrics:
            self.assertIn(name, metrics.METRICS)
        self.assertLen(set(entry.metrics), len(entry.metrics))
        self.assertTrue(entry.eval_splits)
        self.assertLen(set(entry.eval_splits), len(entry.eval_splits))
        self.assertNotIn(entry.train_split, entry.eval_splits)
        keys = [key for name in entry.metrics for key in metrics.metric_keys(name)]
        logged = {tasks.metric_key(entry, split, key) for split in entry.eval_splits for key in keys}
        self.assertIn(entry.metric_to_optimize, logged)
        if len(entry.eval_splits) == 1:
            self.assertIn(entry.metric_to_optimize, keys)
        else:
            split, key = entry.metric_to_optimize.split("/")
            self.assertIn(split, entry.eval_splits)
            self.assertIn(key, keys)

    @parameterized.named_parameters(*ENTRIES)
    def test_label_words(self, benchmark, task):
        entry = DATASET_VALS[benchmark][task]
        if entry.kind == "classification":
            self.assertGreaterEqual(len(entry.label_words), 2)
            self.assertLen(set(entry.label_words), len(entry.label_words))
            for word in entry.label_words:
                # Predictions are stripped before matching, so a padded word could never match.
                self.assertTrue(word)
                self.assertEqual(word, word.strip())
                self.assertEqual(metrics.label_to_id(word, entry.label_words), entry.label_words.index(word))
        else:
            self.assertEqual(entry.label_words, ())

    @parameterized.named_parameters(*ENTRIES)
    def test_sources(self, benchmark, task):
        entry = DATASET_VALS[benchmark][task]
        if entry.local is not None:
            self.assertIsInstance(entry.local, LocalFiles)
            for split in (entry.train_split, *entry.eval_splits):
                self.assertIn(split, entry.local.splits)
                self.assertTrue(entry.local.splits[split])
            renamed = list(entry.local.columns.values())
            self.assertLen(set(renamed), len(renamed))
            self.assertContainsSubset(tasks.required_columns(entry), renamed)
            if not entry.local.header:
                for file_column in entry.local.columns:
                    self.assertTrue(file_column.isdigit(), file_column)
        if benchmark == "glue":
            self.assertEqual(entry.hub_path, "nyu-mll/glue")
            self.assertEqual(entry.hub_name, task)
            self.assertIsNotNone(entry.local)
        if entry.package_corpus is not None:
            self.assertEqual(entry.inputs, ("text",))
            self.assertGreater(entry.package_corpus.validation_every, 1)

    @parameterized.named_parameters(*ENTRIES)
    def test_submission(self, benchmark, task):
        entry = DATASET_VALS[benchmark][task]
        if benchmark != "glue":
            self.assertIsNone(entry.submission)
            return
        sub = entry.submission
        names = [test.name for test in sub.splits]
        self.assertLen(set(names), len(names))
        self.assertEqual(sorted(sub.local.splits), sorted(names))
        # Each test file's row numbers become `index`, the inputs their entry's names; no label column.
        self.assertEqual(sorted(sub.local.columns.values()), sorted(["index", *entry.inputs]))
        self.assertTrue(sub.local.header)
        if entry.kind == "regression":
            self.assertEqual((sub.labels, sub.score_range), ((), (0.0, 5.0)))
        else:
            self.assertLen(sub.labels, len(entry.label_words))
            self.assertIsNone(sub.score_range)

    def test_glue_leaderboard_files(self):
        # GLUE's names and label forms: ids where GLUE's own files label by id, names for the inference tasks.
        glue = DATASET_VALS["glue"]
        files = {test.file: (task, test.name) for task, entry in glue.items() for test in entry.submission.splits}
        self.assertEqual(files, {
            "CoLA.tsv": ("cola", "test"), "SST-2.tsv": ("sst2", "test"), "MRPC.tsv": ("mrpc", "test"),
            "QQP.tsv": ("qqp", "test"), "STS-B.tsv": ("stsb", "test"), "MNLI-m.tsv": ("mnli", "test_matched"),
            "MNLI-mm.tsv": ("mnli", "test_mismatched"), "AX.tsv": ("mnli", "ax"), "QNLI.tsv": ("qnli", "test"),
            "RTE.tsv": ("rte", "test"), "WNLI.tsv": ("wnli", "test")})
        labels = {task: entry.submission.labels for task, entry in glue.items()}
        for task in ("cola", "sst2", "mrpc", "qqp", "wnli"):
            self.assertEqual(labels[task], ("0", "1"), task)
        self.assertEqual(labels["mnli"], ("entailment", "neutral", "contradiction"))
        self.assertEqual(labels["qnli"], ("entailment", "not_entailment"))
        self.assertEqual(labels["rte"], ("entailment", "not_entailment"))
        ax = glue["mnli"].submission.splits[2]
        self.assertEqual((ax.hub_name, ax.hub_split, ax.optional), ("ax", "test", True))
        self.assertEqual(glue["mnli"].submission.local.splits["ax"], "../diagnostic/diagnostic.tsv")
        self.assertEqual(glue["qqp"].submission.local.columns["id"], "index")
        self.assertFalse(any(test.optional for entry in glue.values() for test in entry.submission.splits
                             if test.name != "ax"))

    def test_exact_values_follow_t5(self):
        glue = DATASET_VALS["glue"]
        self.assertEqual(glue["mnli"].inputs, ("hypothesis", "premise"))
        self.assertEqual(glue["mnli"].local.columns["sentence2"], "hypothesis")
        self.assertEqual(glue["wnli"].label_words, ("not_entailment", "entailment"))
        self.assertEqual(glue["rte"].label_words, ("entailment", "not_entailment"))
        self.assertEqual(glue["stsb"].metric_to_optimize, "pearson_corrcoef")
        self.assertEqual(glue["cola"].metric_to_optimize, "matthews_corrcoef")

    def test_constants_is_data_its_only_project_import_the_entry_types(self):
        # A user edits entries here: no function, no class, and nothing of the package but the schema.
        with open(CONSTANTS_PY, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = set()
        for node in ast.walk(tree):
            self.assertNotIsInstance(node, (ast.FunctionDef, ast.ClassDef, ast.Lambda))
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                self.assertEqual(node.level, 0)  # no relative imports
                imported.add(node.module)
        self.assertEqual(sorted(m for m in imported if m.split(".")[0] not in sys.stdlib_module_names),
                         ["t5_training.entries"])
        self.assertEqual(os.path.realpath(constants.__file__), os.path.realpath(CONSTANTS_PY))

    def test_the_package_reads_the_clones_registry_as_one_object(self):
        self.assertIs(registry.DATASET_VALS, constants.DATASET_VALS)
        self.assertIs(top_level.load("constants"), constants)
        with self.assertRaisesRegex(ValueError, "not one of the project's top-level files"):
            top_level.load("setup")


# A made-up dataset: product reviews in a CSV with its own column names and star ratings.
REVIEWS = TaskEntry(
    prefix="review",
    inputs=("body", "title"),
    label_words=("bad", "good"),
    metrics=("accuracy", "f1"),
    metric_to_optimize="f1",
    local=LocalFiles(
        splits={"train": "train.csv", "validation": "valid.csv"},
        columns={"Title": "title", "Review Text": "body", "Verdict": "label"},
        delimiter=",",
        quoting=csv.QUOTE_MINIMAL,
    ),
)


class AddingADatasetTest(fixtures.TempDirTestCase):

    def setUp(self):
        super().setUp()
        rows = {
            "train.csv": [["Great kettle", "Boils fast, looks nice.", "good", "5"],
                          ["Broke", "Stopped working after a week.", "bad", "1"]],
            "valid.csv": [["Fine", 'The "auto-off" switch, sadly, sticks.', "bad", "2"],
                          ["Love it", "Quiet and quick.", "1", "4"]],
        }
        for name, lines in rows.items():
            with open(os.path.join(self.dir, name), "w", encoding="utf-8", newline="") as f:
                writer = csv.writer(f)
                writer.writerow(["Title", "Review Text", "Verdict", "Stars"])
                writer.writerows(lines)

    def test_one_entry_is_enough(self):
        with mock.patch.dict(constants.DATASET_VALS, {"shop": {"reviews": REVIEWS}}):
            entry = tasks.get_entry("shop", "reviews")
            self.assertIs(entry, REVIEWS)
            splits = data.load_splits(entry, data_dir=self.dir)
        self.assertEqual(sorted(splits), ["train", "validation"])
        self.assertEqual(splits["train"]["label"], [1, 0])
        valid = splits["validation"]
        self.assertEqual(valid.column_names, ["body", "title", "label"])
        self.assertEqual(valid["label"], [0, 1])

        formatted = tasks.make_formatter(entry)(valid[:])
        self.assertEqual(formatted, {
            "source": ['review body: The "auto-off" switch, sadly, sticks. title: Fine',
                       "review body: Quiet and quick. title: Love it"],
            "target": ["bad", "good"],
        })

        score = tasks.make_scorer(entry)
        self.assertEqual(score(["bad", "good"], formatted["target"]), {"accuracy": 100.0, "f1": 100.0})
        # "meh" is no label: wrong for accuracy, and the opposite class for F1 (T5's f1_with_invalid).
        self.assertEqual(score(["bad", "meh"], formatted["target"]), {"accuracy": 50.0, "f1": 0.0})
        self.assertEqual(tasks.metric_key(entry, "validation", "f1"), entry.metric_to_optimize)

    def test_readme_example_from_csv(self):
        # README, "Adding a dataset": a CSV with review and stars columns, read with --train_file and
        # --validation_file; labels may be class ids or label words.
        stars = TaskEntry(prefix="stars", inputs=("review",), target="stars",
                          label_words=("one", "two", "three", "four", "five"),
                          metrics=("accuracy",), metric_to_optimize="accuracy")
        paths = {}
        for name, rows in (("train.csv", [["Loved it, truly.", "five"], ["Meh.", "2"]]),
                           ("dev.csv", [["Awful.", "0"], ["Good, not great.", "four"], ["Fine.", "three"]])):
            paths[name] = os.path.join(self.dir, name)
            with open(paths[name], "w", encoding="utf-8", newline="") as f:
                csv.writer(f).writerows([["review", "stars"], *rows])
        with mock.patch.dict(constants.DATASET_VALS, {"reviews": {"stars": stars}}), \
                mock.patch.object(datasets.config, "HF_DATASETS_CACHE", os.path.join(self.dir, "hf_cache")):
            entry = tasks.get_entry("reviews", "stars")
            splits = data.load_splits(entry, train_file=paths["train.csv"], validation_file=paths["dev.csv"])
        self.assertEqual(splits["train"]["stars"], [4, 2])  # "2" is a class id: "three"
        self.assertEqual(splits["validation"]["stars"], [0, 3, 2])
        formatted = tasks.make_formatter(entry)(splits["validation"][:])
        self.assertEqual(formatted, {
            "source": ["stars review: Awful.", "stars review: Good, not great.", "stars review: Fine."],
            "target": ["one", "four", "three"],
        })
        scores = tasks.make_scorer(entry)(["one", "five", "three"], formatted["target"])
        self.assertEqual(list(scores), ["accuracy"])
        self.assertAlmostEqual(scores["accuracy"], 200 / 3)

    def test_gone_after_the_patch(self):
        with mock.patch.dict(constants.DATASET_VALS, {"shop": {"reviews": REVIEWS}}):
            self.assertIn("shop", tasks.DATASET_VALS)
        with self.assertRaisesRegex(UsageError, r"unknown --benchmark 'shop'; known: embedded, glue, seq2seq"):
            tasks.get_entry("shop", "reviews")

    def test_new_task_in_an_existing_benchmark(self):
        entry = dataclasses.replace(REVIEWS, prefix="reviews")
        with mock.patch.dict(constants.DATASET_VALS["glue"], {"reviews": entry}):
            self.assertIs(tasks.get_entry("glue", "reviews"), entry)
        self.assertNotIn("reviews", DATASET_VALS["glue"])

    def test_bad_label_in_new_dataset(self):
        with open(os.path.join(self.dir, "valid.csv"), "a", encoding="utf-8", newline="") as f:
            csv.writer(f).writerow(["Hmm", "It is a kettle.", "okay", "3"])
        with self.assertRaisesRegex(
                UsageError, r"validation split \(.*/valid.csv\) row 3: label 'okay' is not one of the label words "
                            r"\(0 or 'bad', 1 or 'good'\)"):
            data.load_splits(REVIEWS, data_dir=self.dir)


if __name__ == "__main__":
    absltest.main()
