"""Tests for t5_training.table_files: task files read with the line a problem is on, never a crash."""
import os

from absl.testing import parameterized

from t5_training import table_files
from t5_training.errors import UsageError
from tests import fixtures


class ReadTableFileTest(fixtures.TempDirTestCase):

    def _read(self, name: str, content: bytes, required=("source", "target")):
        path = os.path.join(self.dir, name)
        with open(path, "wb") as f:
            f.write(content)
        return table_files.read_table_file(path, "train", required)

    def test_csv_with_quoted_delimiters_newlines_and_a_byte_order_mark(self):
        ds = self._read("t.csv", '\ufeffsource,target\n"a, b","line one\nline two"\nc,d\n'.encode())
        self.assertEqual(ds[:], {"source": ["a, b", "c"], "target": ["line one\nline two", "d"]})

    def test_json_lines_and_json_array_read_the_same(self):
        lines = self._read("t.jsonl", b'{"source": "a", "target": 1, "x": [1]}\n\n{"source": "b", "target": 2.5}\n')
        array = self._read("t.json", b'[{"source": "a", "target": 1, "x": [1]}, {"source": "b", "target": 2.5}]')
        self.assertEqual(lines[:], {"source": ["a", "b"], "target": ["1", "2.5"]})
        self.assertEqual(array[:], lines[:])

    @parameterized.named_parameters(
        ("ragged_row", "t.csv", b"source,target\na,b\nc,d,e\n",
         r"t.csv line 3: 3 fields, but the header has 2; a .csv file is comma-separated"),
        ("unterminated_quote", "t.csv", b'source,target\n"a,b\nc,d\n', r"t.csv line \d: 1 fields, but the header has 2"),
        ("repeated_header", "t.csv", b"source,source\na,b\n", r"line 1: the header .* repeated or unprintable"),
        ("control_character_in_header", "t.csv", b"\x00source\ttarget\n0\n", r"line 1: the header .* unprintable"),
        ("not_json", "t.jsonl", b'{"source": "a", "target": "b"}\n{"source": \n', r"t.jsonl line 2 is not JSON"),
        ("not_an_object", "t.jsonl", b'{"source": "a", "target": "b"}\n"text"\n', r"t.jsonl line 2: a JSON str, not an "),
        ("array_of_lists", "t.json", b'[["a", "b"]]', r"t.json item 1: a JSON list, not an object"),
        ("missing_key", "t.jsonl", b'{"source": "a"}\n', r"line 1: no 'target' key; keys found: 'source'"),
        ("nested_value", "t.jsonl", b'{"source": "a", "target": {"x": 1}}\n', r"line 1: 'target' is dict; it must"),
        ("null_value", "t.jsonl", b'{"source": null, "target": "b"}\n', r"line 1: 'source' is null"),
        ("deep_nesting", "t.jsonl", b"[" * 100000 + b"]" * 100000 + b"\n", r"too deeply|not an object|is not JSON"),
    )
    def test_problems_are_one_line_naming_the_line(self, name, content, message):
        with self.assertRaisesRegex(UsageError, message) as raised:
            self._read(name, content)
        self.assertNotIn("\n", str(raised.exception))
