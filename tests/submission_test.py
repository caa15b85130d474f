"""GLUE leaderboard files (t5_training.submission): reading the test splits, mapping predictions, the files and the zip.

The mapping is checked on hand-made predictions; the files of CoLA, SST-2, MRPC and STS-B come
from fine_tune_t5.py --do_predict on the GLUE-shaped folder the tests make (made_data.py), where a
tiny model's outputs that name no label fall back to the most frequent training label (STS-B: the
mean). The real test files are read by test_real_test_files, which skips without them.
"""
import collections
import contextlib
import csv
import dataclasses
import io
import json
import locale
import math
import os
import re
import statistics
import tempfile
import types
import zipfile
from unittest import mock

import datasets
from absl.testing import absltest, parameterized

import fine_tune_t5
from t5_training import data, modeling, run_dir, submission
from t5_training.errors import UsageError
from t5_training.tasks import get_entry, make_formatter
from tests import fixtures, made_data

TEST_ROWS = made_data.SIZES["test"]


def _read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read().split("\n")[:-1]


def write_one_task(entry, tests, predictions, train_labels, output_dir, log, warn) -> dict:
    """One task's files, the zip and predict_results.json, as inference.predict (--do_predict) writes them."""
    part = submission.write_task_files(entry, tests, predictions, train_labels, output_dir, log, warn)
    return submission.finish(output_dir, [part], log, warn)


class WriteTaskFileTest(fixtures.TempDirTestCase):

    @parameterized.named_parameters(
        # No label word, an empty output or a spaced one (T5 matches the exact string) falls back (1: 2 of 3).
        ("sst2", "sst2", ["positive", "negative", "neutral", "", " positive "], [0, 1, 1],
         ["1", "0", "1", "1", "1"], 3),
        ("cola_tie_goes_to_the_lower_class", "cola", ["acceptable", "grammatical"], [0, 1, 1, 0], ["1", "0"], 1),
        # WNLI's class 0 is not_entailment; words match case and all, as in T5.
        ("wnli", "wnli", ["not_entailment", "entailment", "Entailment"], [1], ["0", "1", "1"], 1),
        ("mnli_names", "mnli", ["contradiction", "entailment", "maybe"], [2, 2, 0],
         ["contradiction", "entailment", "contradiction"], 1),
        ("rte_names", "rte", ["not_entailment", "entailment", "yes"], [0, 0, 1],
         ["not_entailment", "entailment", "entailment"], 1),
        # float() as T5's string_to_float; clipped to [0, 5]; unparsable or nan: the training mean, 2.5.
        ("stsb", "stsb", ["3.4", "7", "-2", "abc", "nan", "2.25", " 4 ", "1e-1"], [1.0, 2.0, 4.5],
         ["3.400", "5.000", "0.000", "2.500", "2.500", "2.250", "4.000", "0.100"], 2),
    )
    def test_rows(self, task, predictions, train_labels, expected, unmapped):
        entry = get_entry("glue", task)
        test = entry.submission.splits[0]
        indices = [str(100 - 7 * i) for i in range(len(predictions))]  # written as given, in the given order
        path, count = submission.write_task_file(entry, test, indices, predictions, train_labels, self.dir)
        self.assertEqual(path, os.path.join(self.dir, test.file))
        self.assertEqual(_read_lines(path), ["index\tprediction", *(f"{i}\t{e}" for i, e in zip(indices, expected))])
        self.assertEqual(count, unmapped)
        self.assertEqual(os.listdir(self.dir), [test.file])  # no temporary file left

    def test_fallback(self):
        self.assertEqual(submission.fallback(get_entry("glue", "mnli"), [1, 2, 2, 0, 1]), 1)
        self.assertEqual(submission.fallback(get_entry("glue", "stsb"), [0.5, 1.0, 3.0]), 1.5)
        with self.assertRaisesRegex(ValueError, "^no training labels to take the fallback from$"):
            submission.fallback(get_entry("glue", "sst2"), [])

    def test_a_score_without_range_is_written_unclipped(self):
        stsb = get_entry("glue", "stsb")
        unbounded = dataclasses.replace(stsb, submission=dataclasses.replace(stsb.submission, score_range=None))
        self.assertEqual([submission.written_form(unbounded, x) for x in (7.25, -3.0)], ["7.250", "-3.000"])
        self.assertEqual([submission.written_form(stsb, x) for x in (7.25, -3.0)], ["5.000", "0.000"])

    def test_file_is_written_as_utf8_whatever_the_locale(self):
        # Indices are the test file's text; under an ASCII locale open() would refuse "\u00e9".
        entry = get_entry("glue", "sst2")
        old = locale.setlocale(locale.LC_CTYPE)
        try:
            locale.setlocale(locale.LC_CTYPE, "C")
            path, _ = submission.write_task_file(entry, entry.submission.splits[0], ["caf\u00e9-1"], ["positive"],
                                                 [1], self.dir)
        finally:
            locale.setlocale(locale.LC_CTYPE, old)
        self.assertEqual(_read_lines(path), ["index\tprediction", "caf\u00e9-1\t1"])

    def test_rows_and_predictions_must_pair(self):
        entry = get_entry("glue", "sst2")
        with self.assertRaisesRegex(ValueError, "2 test rows but 1 predictions"):
            submission.write_task_file(entry, entry.submission.splits[0], ["0", "1"], ["positive"], [1], self.dir)

    def test_zip_holds_the_files_at_its_top_level(self):
        paths = []
        for name, text in (("CoLA.tsv", "index\tprediction\n0\t1\n"), ("STS-B.tsv", "index\tprediction\n0\t2.000\n")):
            paths.append(os.path.join(self.dir, "submission", name))
            os.makedirs(os.path.dirname(paths[-1]), exist_ok=True)
            with open(paths[-1], "w", encoding="utf-8") as f:
                f.write(text)
        path = submission.write_zip(os.path.join(self.dir, "submission.zip"), paths)
        with zipfile.ZipFile(path) as archive:
            self.assertEqual(archive.namelist(), ["CoLA.tsv", "STS-B.tsv"])
            self.assertEqual(archive.read("STS-B.tsv"), b"index\tprediction\n0\t2.000\n")
            self.assertEqual({info.compress_type for info in archive.infolist()}, {zipfile.ZIP_DEFLATED})
        self.assertEqual(sorted(os.listdir(self.dir)), ["submission", "submission.zip"])

    def test_mnli_without_its_diagnostic_set(self):
        # Rows come in decoding order; `idx` puts them back in the test file's order.
        tests = {name: datasets.Dataset.from_dict({"idx": [1, 0], "index": ["b", "a"]})
                 for name in ("test_matched", "test_mismatched")}
        predictions = {"test_matched": ["neutral", "x"], "test_mismatched": ["y", "z"]}
        log, warned = [], []
        written = write_one_task(get_entry("glue", "mnli"), tests, predictions, [2, 2, 1], self.dir,
                                 log.append, warned.append)
        folder = os.path.join(self.dir, "submission")
        zip_path = os.path.join(self.dir, "submission.zip")
        self.assertEqual(written, {
            "files": {"MNLI-m.tsv": {"rows": 2, "no_label": 1, "no_label_share": 0.5, "written_as": "contradiction"},
                      "MNLI-mm.tsv": {"rows": 2, "no_label": 2, "no_label_share": 1.0, "written_as": "contradiction"}},
            "missing": ["AX.tsv"], "zip": zip_path})
        with open(os.path.join(self.dir, submission.RESULTS_FILE), encoding="utf-8") as f:
            self.assertEqual(json.load(f), written)
        self.assertEqual(_read_lines(os.path.join(folder, "MNLI-m.tsv")),
                         ["index\tprediction", "a\tneutral", "b\tcontradiction"])
        with zipfile.ZipFile(written["zip"]) as archive:
            self.assertEqual(archive.namelist(), ["MNLI-m.tsv", "MNLI-mm.tsv"])
        self.assertEqual(log[0], f"{folder}/MNLI-m.tsv: 2 rows; 1 predictions matched no label and were written as "
                                 "contradiction, the most frequent training label")
        self.assertEqual(log[-1], f"{zip_path}: MNLI-m.tsv, MNLI-mm.tsv")  # what the zip holds
        # Half is a warning; all of MNLI-mm is the loud one, and the zip names it and the missing AX.tsv.
        self.assertLen(warned, 4)
        self.assertStartsWith(warned[0], f"warning: {folder}/MNLI-m.tsv: 1 of 2 test predictions (50.0%) name no "
                                         "label")
        self.assertStartsWith(warned[1], f"WARNING: {folder}/MNLI-mm.tsv is mostly the fallback")
        self.assertStartsWith(warned[2], f"WARNING: {zip_path} holds files that are mostly the fallback, not the "
                                         "model's answers: MNLI-mm.tsv (100.0% no label);")
        self.assertStartsWith(warned[3], f"WARNING: {zip_path} lacks AX.tsv, which the leaderboard requires: it "
                                         "will refuse this zip")

    @parameterized.named_parameters(
        ("every_output_a_label", ["positive", "negative", "positive", "negative"], 0, ()),
        ("one_falls_back", ["positive", "x", "negative", "positive"], 1, ("warning: {path}: 1 of 4",)),
        ("most_fall_back", ["x", "", "maybe", "positive"], 3,
         ("WARNING: {path} is mostly the fallback", "WARNING: {zip} holds files that are mostly the fallback")),
    )
    def test_outputs_that_name_no_label_are_counted_and_warned_about(self, outputs, count, warnings):
        tests = {"test": datasets.Dataset.from_dict({"idx": [0, 1, 2, 3], "index": ["0", "1", "2", "3"]})}
        warned = []
        written = write_one_task(get_entry("glue", "sst2"), tests, {"test": outputs}, [1, 1, 0],
                                 self.dir, lambda line: None, warned.append)
        self.assertEqual(written["files"], {"SST-2.tsv": {"rows": 4, "no_label": count, "no_label_share": count / 4,
                                                          "written_as": "1"}})
        self.assertEqual(written["missing"], [])
        path, zip_path = os.path.join(self.dir, "submission", "SST-2.tsv"), os.path.join(self.dir, "submission.zip")
        self.assertLen(warned, len(warnings))
        for line, start in zip(warned, warnings):
            self.assertStartsWith(line, start.format(path=path, zip=zip_path))

    def test_stsb_outputs_that_are_no_number_are_no_label(self):
        tests = {"test": datasets.Dataset.from_dict({"idx": [0, 1, 2], "index": ["0", "1", "2"]})}
        log, warned = [], []
        written = write_one_task(get_entry("glue", "stsb"), tests, {"test": ["3.2", "high", "nan"]},
                                 [1.0, 4.0], self.dir, log.append, warned.append)
        self.assertEqual(written["files"]["STS-B.tsv"], {"rows": 3, "no_label": 2, "no_label_share": 2 / 3,
                                                         "written_as": "2.500"})
        path = os.path.join(self.dir, "submission", "STS-B.tsv")
        self.assertStartsWith(warned[0], f"WARNING: {path} is mostly")
        self.assertIn("were written as 2.500:", warned[0])
        # A score falls back to the training mean, and the line says so.
        self.assertEqual(log[0], f"{path}: 3 rows; 2 predictions matched no label and were written as 2.500, the "
                                 "training mean")

    def test_a_split_missing_before_others_leaves_them_written(self):
        tests = {name: datasets.Dataset.from_dict({"idx": [0], "index": ["0"]}) for name in ("test_mismatched", "ax")}
        predictions = {"test_mismatched": ["neutral"], "ax": ["entailment"]}
        written = write_one_task(get_entry("glue", "mnli"), tests, predictions, [2], self.dir,
                                 lambda line: None, lambda line: None)
        self.assertEqual(sorted(written["files"]), ["AX.tsv", "MNLI-mm.tsv"])
        self.assertEqual(written["missing"], ["MNLI-m.tsv"])

    def test_an_empty_test_split(self):
        tests = {"test": datasets.Dataset.from_dict({"idx": [], "index": []})}
        written = write_one_task(get_entry("glue", "sst2"), tests, {"test": []}, [1], self.dir,
                                 lambda line: None, lambda line: None)
        self.assertEqual(written["files"]["SST-2.tsv"], {"rows": 0, "no_label": 0, "no_label_share": 0.0,
                                                         "written_as": "1"})
        self.assertEqual(_read_lines(os.path.join(self.dir, "submission", "SST-2.tsv")), ["index\tprediction"])


# The first lines of GLUE's test files, for the tasks whose files the made folder lacks.
FAKE_TEST_FILES = {
    "qqp/test.tsv": ["id\tquestion1\tquestion2", "0\tHow do I learn?\tWhat is learning?",
                     "1\tWhy?\tWhy not?"],
    "mnli/test_matched.tsv": [
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2",
        "0\t31493\t31493\ttravel\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tHierbas is a liqueur.\tIt is a drink."],
    "mnli/test_mismatched.tsv": [
        "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
        "sentence2_parse\tsentence1\tsentence2",
        "0\t8\t8\tletters\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tWhat a day.\tThe day was long."],
    "diagnostic/diagnostic.tsv": ["index\tsentence1\tsentence2", "0\tThe cat sat.\tA cat sat."],
    "qnli/test.tsv": ["index\tquestion\tsentence", "0\tWho won?\tThe home team won."],
    "rte/test.tsv": ["index\tsentence1\tsentence2", "0\tMaude lives in Paris.\tMaude lives in France."],
    "wnli/test.tsv": ["index\tsentence1\tsentence2", "0\tThe cup fell. It broke.\tThe cup broke."],
}


class LoadTestSplitsTest(fixtures.TempDirTestCase):

    def setUp(self):
        super().setUp()
        for name, lines in FAKE_TEST_FILES.items():
            os.makedirs(os.path.join(self.dir, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(self.dir, name), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")

    def _load(self, task, folder, log=None, warn=None):
        return submission.load_test_splits(get_entry("glue", task), data_dir=folder,
                                           log=(log if log is not None else []).append,
                                           warn=(warn if warn is not None else []).append)

    @parameterized.named_parameters(
        ("cola", "cola", "CoLA", 1063, {"sentence": "Bill whistled past the house."}, -1),
        ("sst2", "sst2", "SST-2", 1821, {"sentence": "uneasy mishmash of styles and genres ."}, -1),
        ("mrpc", "mrpc", "MRPC", 1725, {"sentence1": "PCCW's chief operating officer, Mike Butcher, and Alex "
                                                     "Arena, the chief financial officer, will report directly to "
                                                     "Mr So."}, -1),
        ("stsb", "stsb", "STS-B", 1379, {"sentence1": "A girl is styling her hair.",
                                         "sentence2": "A girl is brushing her hair."}, -1.0),
    )
    def test_real_test_files(self, task, folder, rows, first, unlabelled):
        test = self._load(task, fixtures.real_data(folder))["test"]
        self.assertLen(test, rows)
        self.assertEqual(test.column_names, [*get_entry("glue", task).inputs, "label", "index"])
        self.assertEqual(test["index"][:], [str(i) for i in range(rows)])
        self.assertEqual(set(test["label"][:]), {unlabelled})
        self.assertEqual({key: test[0][key] for key in first}, first)

    @parameterized.named_parameters(
        ("qqp", "qqp", {"test": ("qqp question1: Why? question2: Why not?", "1")}),
        ("mnli", "mnli", {"test_matched": ("mnli hypothesis: It is a drink. premise: Hierbas is a liqueur.", "0"),
                          "test_mismatched": ("mnli hypothesis: The day was long. premise: What a day.", "0"),
                          "ax": ("mnli hypothesis: A cat sat. premise: The cat sat.", "0")}),
        ("qnli", "qnli", {"test": ("qnli question: Who won? sentence: The home team won.", "0")}),
        ("rte", "rte", {"test": ("rte sentence1: Maude lives in Paris. sentence2: Maude lives in France.", "0")}),
        ("wnli", "wnli", {"test": ("wnli sentence1: The cup fell. It broke. sentence2: The cup broke.", "0")}),
    )
    def test_glue_layouts(self, task, last_rows):
        entry = get_entry("glue", task)
        splits = self._load(task, os.path.join(self.dir, task))
        self.assertEqual(sorted(splits), sorted(last_rows))
        for name, (source, index) in last_rows.items():
            row = make_formatter(entry)(splits[name][-1:])
            self.assertEqual((row["source"][0], row["target"][0], splits[name][-1]["index"]), (source, "<unk>", index))

    def test_diagnostic_set_is_optional(self):
        os.remove(os.path.join(self.dir, "diagnostic", "diagnostic.tsv"))
        log, warned = [], []
        splits = self._load("mnli", os.path.join(self.dir, "mnli"), log, warned)
        self.assertEqual(sorted(splits), ["test_matched", "test_mismatched"])
        self.assertEqual(log, [])
        # Loud, naming the file, where to get it, and what the leaderboard does without it.
        self.assertLen(warned, 1)
        self.assertStartsWith(warned[0], "WARNING: AX.tsv will not be written: there is no "
                                         f"{os.path.join(self.dir, 'diagnostic', 'diagnostic.tsv')}, and the "
                                         "leaderboard refuses a submission zip without AX.tsv")
        self.assertIn("the benchmark's download", warned[0])
        self.assertIn("nyu-mll/glue", warned[0])

    def test_missing_diagnostic_set_warning_in_full(self):
        entry = get_entry("glue", "mnli")
        ax = entry.submission.splits[-1]
        line = submission.missing_file_warning(entry, ax, os.path.join(self.dir, "mnli"))
        no_hub = submission.missing_file_warning(dataclasses.replace(entry, hub_path=None), ax,
                                                 os.path.join(self.dir, "mnli"))
        path = os.path.join(self.dir, "diagnostic", "diagnostic.tsv")
        start = (f"WARNING: AX.tsv will not be written: there is no {path}, and the leaderboard "
                 "refuses a submission zip without AX.tsv. Put the file there from the benchmark's download")
        # The hub names AX's own config and split, not MNLI's.
        self.assertEqual(line, f"{start}, or drop --data_dir to read every test split from the hub (nyu-mll/glue, "
                               "ax, split test)")
        self.assertEqual(no_hub, start)

    def test_missing_test_file_is_named(self):
        os.remove(os.path.join(self.dir, "mnli", "test_mismatched.tsv"))
        path = os.path.join(self.dir, "mnli", "test_mismatched.tsv")
        with self.assertRaisesRegex(UsageError, rf"^--do_predict needs the test file {path}, which is not there; "
                                                r"put the task's test_mismatched.tsv in --data_dir"):
            self._load("mnli", os.path.join(self.dir, "mnli"))

    def test_repeated_index(self):
        with open(os.path.join(self.dir, "rte", "test.tsv"), "a", encoding="utf-8") as f:
            f.write("0\tA.\tB.\n")
        with self.assertRaisesRegex(UsageError, r"^test split: index 0 appears more than once, and the leaderboard "
                                                r"scores each test row once; use the original test file$"):
            self._load("rte", os.path.join(self.dir, "rte"))

    def test_empty_test_file_names_its_split(self):
        with open(os.path.join(self.dir, "mnli", "test_matched.tsv"), "w", encoding="utf-8") as f:
            f.write(FAKE_TEST_FILES["mnli/test_matched.tsv"][0] + "\n")
        with self.assertRaisesRegex(UsageError, r"^test_matched split \(.*/mnli/test_matched.tsv\) is empty; point the run at a file with rows$"):
            self._load("mnli", os.path.join(self.dir, "mnli"))

    def test_a_missing_optional_split_skips_only_itself(self):
        # Wherever it stands in the entry's splits: the ones after it are still read.
        os.remove(os.path.join(self.dir, "diagnostic", "diagnostic.tsv"))
        mnli = get_entry("glue", "mnli")
        ax_first = dataclasses.replace(mnli, submission=dataclasses.replace(
            mnli.submission, splits=(mnli.submission.splits[-1], *mnli.submission.splits[:-1])))
        warned = []
        splits = submission.load_test_splits(ax_first, data_dir=os.path.join(self.dir, "mnli"), warn=warned.append)
        self.assertEqual(sorted(splits), ["test_matched", "test_mismatched"])
        self.assertLen(warned, 1)

    def test_task_without_test_split(self):
        with self.assertRaisesRegex(UsageError, r"this task has no test split; drop --do_predict"):
            submission.load_test_splits(get_entry("seq2seq", "summarization"), data_dir=self.dir)

    def test_hub_test_splits(self):
        # Offline here, so the hub is a stand-in: GLUE's hub test splits say -1 and number rows in `idx`.
        calls = []

        def load(path, name, split, trust_remote_code):
            calls.append((path, name, split))
            return datasets.Dataset.from_dict({"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"],
                                               "label": [-1, -1], "idx": [0, 1]})

        with mock.patch.object(submission.data, "load_hub_split", load):
            splits = submission.load_test_splits(get_entry("glue", "mnli"))
        self.assertEqual(calls, [("nyu-mll/glue", "mnli", "test_matched"), ("nyu-mll/glue", "mnli", "test_mismatched"),
                                 ("nyu-mll/glue", "ax", "test")])
        self.assertEqual(splits["ax"][:], {"hypothesis": ["h1", "h2"], "premise": ["p1", "p2"], "label": [-1, -1],
                                           "index": [0, 1]})
        no_hub = dataclasses.replace(get_entry("glue", "rte"), hub_path=None)
        with self.assertRaisesRegex(UsageError, r"^--do_predict reads the test files from --data_dir"):
            submission.load_test_splits(no_hub)

    def test_hub_test_split_errors_name_the_dataset(self):
        # Its configuration too: MNLI's diagnostic rows come from another one (ax) than its test rows.
        def load(path, name, split, trust_remote_code):
            return datasets.Dataset.from_dict({"premise": ["p"], "label": [-1], "idx": [0]})

        with mock.patch.object(submission.data, "load_hub_split", load), self.assertRaisesRegex(
                UsageError, r"^test_matched split \(nyu-mll/glue/mnli\) has no column 'hypothesis'"):
            submission.load_test_splits(get_entry("glue", "mnli"))

    def test_hub_splits_run_no_remote_code_unless_asked(self):
        flags = []

        def load(path, name, split, trust_remote_code):
            flags.append(trust_remote_code)
            # A hub split that names its rows `index` already is read as it is.
            return datasets.Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [-1], "index": [4]})

        with mock.patch.object(submission.data, "load_hub_split", load):
            splits = submission.load_test_splits(get_entry("glue", "rte"))
            submission.load_test_splits(get_entry("glue", "rte"), trust_remote_code=True)
        self.assertEqual(flags, [False, True])
        self.assertEqual(splits["test"]["index"][:], [4])

    # build_test_data, in-process: every test row tokenized, longest first, its test-file index kept.

    def _rte_folder(self, name):
        folder = os.path.join(self.dir, name)
        os.makedirs(folder)
        with open(os.path.join(folder, "test.tsv"), "w", encoding="utf-8") as f:
            f.write("index\tsentence1\tsentence2\n7\tA cat.\tA cat.\n"
                    "3\tThe government said on Monday that the new rules would apply to every company in the "
                    "country.\tRules apply.\n5\tThe film was long and slow.\tIt was slow.\n")
        return folder

    def _config(self, data_dir, trust_remote_code=False):
        return types.SimpleNamespace(data_dir=data_dir, trust_remote_code=trust_remote_code, max_source_length=32,
                                     max_target_length=4)

    def test_built_rows_tokenized_longest_first_with_their_index(self):
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        log = []
        tests = submission.build_test_data(get_entry("glue", "rte"), self._config(self._rte_folder("rte-lengths")),
                                           tokenizer, log.append, mode_token_id=5)
        self.assertEqual(list(tests), ["test"])
        test = tests["test"]
        self.assertEqual(test["index"][:], ["3", "5", "7"])  # longest input first
        self.assertEqual(data.in_row_order(test, "index"), ["7", "3", "5"])  # `idx` restores the file's order
        self.assertEqual(log, ["test: 3 rows; truncated: 1 inputs to 32 tokens"])
        inputs = test["input_ids"][:]
        self.assertEqual([ids[0] for ids in inputs], [5, 5, 5])  # the mode token before every source
        self.assertEqual([len(ids) for ids in inputs][:2], [32, 26])
        self.assertEqual([ids[-1] for ids in inputs], [tokenizer.eos_token_id] * 3)
        short = tokenizer("rte sentence1: A cat. sentence2: A cat.")["input_ids"]
        self.assertEqual(inputs[2], [5, *short])

    def test_built_from_the_data_dir_argument_over_the_configs(self):
        # A mixture passes each task's folder; config.data_dir is then another task's.
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        tests = submission.build_test_data(get_entry("glue", "rte"), self._config(os.path.join(self.dir, "nope")),
                                           tokenizer, lambda line: None, data_dir=self._rte_folder("mixture-rte"))
        self.assertLen(tests["test"], 3)

    def test_built_without_the_diagnostic_set_warns_through_warn(self):
        os.remove(os.path.join(self.dir, "diagnostic", "diagnostic.tsv"))
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        warned = []
        tests = submission.build_test_data(get_entry("glue", "mnli"), self._config(os.path.join(self.dir, "mnli")),
                                           tokenizer, lambda line: None, warn=warned.append)
        self.assertEqual(sorted(tests), ["test_matched", "test_mismatched"])
        self.assertLen(warned, 1)
        self.assertStartsWith(warned[0], "WARNING: AX.tsv will not be written")

    def test_built_with_trust_remote_code_reaching_the_hub_loader(self):
        flags = []

        def load(path, name, split, trust_remote_code):
            flags.append(trust_remote_code)
            return datasets.Dataset.from_dict({"sentence1": ["a"], "sentence2": ["b"], "label": [-1], "idx": [0]})

        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        with mock.patch.object(submission.data, "load_hub_split", load):
            submission.build_test_data(get_entry("glue", "rte"), self._config(None, trust_remote_code=True),
                                       tokenizer, lambda line: None)
        self.assertEqual(flags, [True])


def _read_tsv(path: str, quoting=csv.QUOTE_MINIMAL) -> list[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.reader(f, delimiter="\t", quoting=quoting))


def _glue_form(task: str, prediction: str) -> str | None:
    """What a raw prediction should be written as, worked out here independently; None when it names no label."""
    if task == "stsb":
        try:
            score = float(prediction)
        except ValueError:
            return None
        return f"{min(max(score, 0.0), 5.0):.3f}" if math.isfinite(score) else None
    words = get_entry("glue", task).label_words
    return str(words.index(prediction)) if prediction in words else None


def _fallback(task: str) -> str:
    """The most frequent training label of the made folder (a tie goes to the lower class), or STS-B's mean score."""
    folder = os.path.join(fixtures.glue_dir(), FOLDERS[task])
    labels = data.load_splits(get_entry("glue", task), data_dir=folder)["train"]["label"]
    if task == "stsb":
        return f"{statistics.mean(labels):.3f}"
    counts = collections.Counter(labels)
    return str(max(sorted(counts), key=counts.get))


FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B"}


def run_script(out: str, task: str, folder: str, *flags: str) -> tuple[dict, str, str]:
    """fine_tune_t5.main on a made GLUE task with the tiny model, and what it printed on stdout and stderr."""
    args = fixtures.fine_tune_args(out, "--max_source_length", "32", "--per_device_eval_batch_size", "128",
                                   "--save_total_limit", "1", *flags)
    args[args.index("--dataset_name") + 1] = task
    args[args.index("--data_dir") + 1] = os.path.join(fixtures.glue_dir(), folder)
    printed, warned = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(warned):
        result = fine_tune_t5.main(args)
    return result, printed.getvalue(), warned.getvalue()


class SubmissionFilesTest(parameterized.TestCase):
    """The files fine_tune_t5.py --do_predict writes for the four GLUE tasks of the made folder."""

    def check_task_file(self, out: str, task: str, folder: str, name: str, rows: int, result: dict, printed: str,
                        warned: str):
        """Rows, header, index order and label form of one task's file, its zip, and the fallback count printed,
        recorded and warned about; and the dev outputs that named no label, counted in the eval results."""
        path = os.path.join(out, "submission", name)
        lines = _read_lines(path)
        self.assertEqual(lines[0], "index\tprediction")
        self.assertLen(lines, rows + 1)  # every test row, whatever --max_eval_samples
        written = [line.split("\t") for line in lines[1:]]
        test_file = _read_tsv(os.path.join(fixtures.glue_dir(), folder, "test.tsv"), csv.QUOTE_NONE)
        self.assertEqual([index for index, _ in written], [row[0] for row in test_file[1:]])
        # What the model really said, row by row, against what was written for it.
        predicted = [row[1] for row in _read_tsv(os.path.join(out, "predictions_test.tsv"))[1:]]
        expected = [_glue_form(task, text) for text in predicted]
        unmapped = expected.count(None)
        fallback = _fallback(task)
        self.assertEqual([value for _, value in written], [e or fallback for e in expected])
        for _, value in written:
            if task == "stsb":
                self.assertTrue(0.0 <= float(value) <= 5.0 and re.fullmatch(r"\d\.\d{3}", value), value)
            else:
                self.assertIn(value, ("0", "1"))
        why = "the training mean" if task == "stsb" else "the most frequent training label"
        self.assertIn(f"{path}: {rows} rows; {unmapped} predictions matched no label and were written as "
                      f"{fallback}, {why}\n", printed)
        self.assertEqual(result["predict"], {
            "files": {name: {"rows": rows, "no_label": unmapped, "no_label_share": unmapped / rows,
                             "written_as": fallback}},
            "missing": [], "zip": os.path.join(out, "submission.zip")})
        with open(os.path.join(out, submission.RESULTS_FILE), encoding="utf-8") as f:
            self.assertEqual(json.load(f), result["predict"])
        if unmapped > rows / 2:
            self.assertIn(f"WARNING: {path} is mostly the fallback, not the model's answers: {unmapped} of {rows} "
                          "test predictions", warned)
            self.assertIn(f"WARNING: {os.path.join(out, 'submission.zip')} holds files that are mostly the fallback, "
                          f"not the model's answers: {name} (", warned)
        elif unmapped:
            self.assertIn(f"warning: {path}: {unmapped} of {rows} test predictions", warned)
        else:
            self.assertNotIn(path, warned)
        dev = [_glue_form(task, row[1]) for row in _read_tsv(os.path.join(out, "predictions_validation.tsv"))[1:]]
        self.assertEqual((result["eval"]["no_label"], result["eval"]["no_label_share"]),
                         (dev.count(None), dev.count(None) / len(dev)))
        with zipfile.ZipFile(os.path.join(out, "submission.zip")) as archive:
            self.assertEqual(archive.namelist(), [name])
            with open(path, "rb") as f:
                self.assertEqual(archive.read(name), f.read())
        self.assertEqual(os.listdir(os.path.join(out, "submission")), [name])
        return unmapped

    @parameterized.named_parameters(
        ("cola", "cola", "CoLA", "CoLA.tsv", TEST_ROWS),
        ("mrpc", "mrpc", "MRPC", "MRPC.tsv", TEST_ROWS),
        ("stsb", "stsb", "STS-B", "STS-B.tsv", TEST_ROWS),
    )
    def test_after_training(self, task, folder, name, rows):
        with tempfile.TemporaryDirectory() as out:
            result, printed, warned = run_script(out, task, folder, "--max_steps", "2", "--do_predict")
            # Two steps teach the tiny model nothing: its outputs fall back to the training label.
            self.assertGreater(self.check_task_file(out, task, folder, name, rows, result, printed, warned), 0)
            self.assertTrue(os.path.isdir(os.path.join(out, "final")))

    def test_sst2_trained_then_predicted_without_training(self):
        with tempfile.TemporaryDirectory() as trained, tempfile.TemporaryDirectory() as root:
            # A few steps at a high rate: the model answers with a label word, so rows map.
            result, printed, warned = run_script(trained, "sst2", "SST-2", "--max_steps", "6", "--learning_rate",
                                                 "3e-3", "--do_predict")
            unmapped = self.check_task_file(trained, "sst2", "SST-2", "SST-2.tsv", TEST_ROWS, result, printed, warned)
            self.assertLess(unmapped, TEST_ROWS)
            # --do_train false loads the exported model, evaluates and predicts: the same file.
            out = os.path.join(root, "predict")
            model = ["--model_name_or_path", os.path.join(trained, "final"), "--do_train", "false", "--do_predict"]
            again, printed, warned = run_script(out, "sst2", "SST-2", *model)
            self.check_task_file(out, "sst2", "SST-2", "SST-2.tsv", TEST_ROWS, again, printed, warned)
            with open(os.path.join(trained, "submission", "SST-2.tsv"), "rb") as a, \
                    open(os.path.join(out, "submission", "SST-2.tsv"), "rb") as b:
                self.assertEqual(a.read(), b.read())
            self.assertEqual(again["eval"]["accuracy"], result["eval"]["accuracy"])
            self.assertEqual(sorted(os.listdir(out)), ["eval_results.json", "predict_results.json",
                                                       "predictions_test.tsv", "predictions_validation.tsv",
                                                       "submission", "submission.zip"])
            self.assertEqual(run_dir.read_final_eval(out)["accuracy"], result["eval"]["accuracy"])


if __name__ == "__main__":
    absltest.main()
