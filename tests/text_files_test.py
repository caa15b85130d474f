"""Tests for t5_training.text_files: which files a corpus flag names, and the documents each one holds."""
import json
import os
import re

from absl.testing import absltest
import pyarrow as pa
import pyarrow.parquet as pq

from t5_training import corpus, text_files
from t5_training.errors import UsageError
from tests import fixtures


def _write(path, text, mode="w"):
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        f.write(text)
    return path


class TextFilesTest(fixtures.TempDirTestCase):

    def test_expand_files(self):
        for name in ("b.txt", "a.txt", "c.jsonl", "d.parquet"):
            _write(os.path.join(self.dir, name), "x\n")
        os.mkdir(os.path.join(self.dir, "folder.txt"))  # a folder is not a corpus file
        star = os.path.join(self.dir, "*.txt")
        self.assertEqual(text_files.expand_files([star]), [os.path.join(self.dir, n) for n in ("a.txt", "b.txt")])
        jsonl = os.path.join(self.dir, "c.jsonl")
        self.assertEqual(text_files.expand_files([jsonl, star]), [jsonl] + text_files.expand_files([star]))
        self.assertEqual(text_files.expand_files([os.path.join(self.dir, "[cd].*")]),
                         [jsonl, os.path.join(self.dir, "d.parquet")])
        missing = os.path.join(self.dir, "nothing*.txt")
        with self.assertRaisesRegex(UsageError, re.escape(f"--validation_file '{missing}' matches no file")):
            text_files.expand_files([star, missing], "--validation_file")
        with self.assertRaisesRegex(UsageError, "no_such.txt' matches no file"):
            text_files.expand_files([os.path.join(self.dir, "no_such.txt")])
        csv_path = _write(os.path.join(self.dir, "e.csv"), "x\n")
        with self.assertRaisesRegex(UsageError, re.escape(f"{csv_path}: unsupported corpus file")):
            text_files.expand_files([star, csv_path])

    def test_text_file_skips_blank_lines_and_strips(self):
        path = _write(os.path.join(self.dir, "t.txt"), "\n  first doc  \n\n\t\nsecond\n   \nthird")
        self.assertEqual(list(text_files.iter_documents(path, "text")), ["first doc", "second", "third"])

    def test_jsonl(self):
        records = [{"body": "one", "id": 1}, {"body": "  "}, {"body": None}, {"body": "two"}]
        path = _write(os.path.join(self.dir, "a.jsonl"), "\n".join(json.dumps(r) for r in records[:2]) +
                      "\n\n" + "\n".join(json.dumps(r) for r in records[2:]) + "\n")
        self.assertEqual(list(text_files.iter_documents(path, "body")), ["one", "two"])
        with self.assertRaisesRegex(UsageError, re.escape(f"{path} line 1 has no field 'text'; set --text_column")):
            list(text_files.iter_documents(path, "text"))
        bad = _write(os.path.join(self.dir, "b.json"), '{"text": "fine"}\n\n{"title": "t"}\n')
        documents = text_files.iter_documents(bad, "text")
        self.assertEqual(next(documents), "fine")  # read lazily: the error waits for its line
        with self.assertRaisesRegex(UsageError, re.escape(f"{bad} line 3 has no field 'text'")):
            next(documents)
        broken = _write(os.path.join(self.dir, "c.jsonl"), '{"text": "fine"}\n{"text": "cut\n')
        with self.assertRaisesRegex(UsageError, re.escape(f"{broken} line 2 is not JSON")):
            list(text_files.iter_documents(broken, "text"))

    def test_parquet(self):
        texts = [f"row {i}" if i % 7 else "   " for i in range(2500)]  # more rows than one read batch
        texts[10] = None
        path = os.path.join(self.dir, "p.parquet")
        pq.write_table(pa.table({"body": texts, "lang": ["en"] * 2500}), path, row_group_size=1000)
        expected = [t for t in texts if t and t.strip()]
        self.assertEqual(list(text_files.iter_documents(path, "body")), expected)
        self.assertLen(expected, 2500 - 358 - 1)
        with self.assertRaisesRegex(UsageError, re.escape(f"{path} has no column 'text'; columns found: body, lang")):
            list(text_files.iter_documents(path, "text"))
        documents = corpus.load_documents([path], None, None, "train", "body", streaming=False)
        self.assertEqual(list(documents["text"]), expected)


    def test_a_folder_is_named_as_one_with_the_glob_that_reads_it(self):
        folder = os.path.join(self.dir, "corpus")
        os.mkdir(folder)
        with self.assertRaisesWithLiteralMatch(
                UsageError, f"--train_file {folder!r} is a folder; pass the files in it, e.g. "
                            f"'{os.path.join(folder, '*.txt')}' (quoted)"):
            text_files.expand_files([folder])

    def test_a_file_that_is_not_utf8_names_its_line(self):
        path = _write(os.path.join(self.dir, "latin.txt"), "fine\ncaf\xe9\n".encode("latin-1"), "wb")
        with self.assertRaisesWithLiteralMatch(UsageError, f"{path} line 2 is not UTF-8 text (byte 0xe9); convert the "
                                                           "file to UTF-8, e.g. iconv -f latin1 -t utf-8"):
            list(text_files.iter_documents(path, "text"))

    def test_a_json_field_that_is_not_text_is_refused(self):
        path = _write(os.path.join(self.dir, "a.jsonl"), '{"text": "fine"}\n{"text": null}\n{"text": 5}\n')
        with self.assertRaisesWithLiteralMatch(UsageError, f"{path} line 3: field 'text' holds int 5, not text; set "
                                                           "--text_column to the field with the text"):
            list(text_files.iter_documents(path, "text"))
        five = _write(os.path.join(self.dir, "b.jsonl"), "5\n")
        with self.assertRaisesWithLiteralMatch(UsageError, f"{five} line 1 has no field 'text'; set --text_column"):
            list(text_files.iter_documents(five, "text"))

    def test_a_file_that_is_not_parquet_is_refused(self):
        path = _write(os.path.join(self.dir, "bad.parquet"), "hi\n")
        with self.assertRaisesRegex(UsageError, re.escape(f"{path} is not a parquet file pyarrow can read (") +
                                    r".+\); check the file, or give text as \.txt or \.jsonl$"):
            list(text_files.iter_documents(path, "text"))

if __name__ == "__main__":
    absltest.main()
