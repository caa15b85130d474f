"""Reading a user's task files (`--train_file`, `--validation_file`): CSV, TSV, JSON lines or a JSON array;
and a dataset's original files in `--data_dir` (`read_original_file`, with its entry's `LocalFiles` layout).

Read here with Python's csv and json modules rather than handed to `datasets.load_dataset`:
pandas and pyarrow report a ragged row as a parser error without the file's line, and pyarrow's
JSON reader can crash the interpreter (a segmentation fault) on malformed JSON lines, which no
exception handler can turn into one clear line. Every problem here is a `UsageError` that names
the file, the line and the fix. Values become text; the task's label normalizer turns them into
class ids or numbers and names the row when one does not fit.
"""
from __future__ import annotations

import csv
import json
import os
from typing import Sequence

import datasets

from t5_training.entries import LocalFiles
from t5_training.errors import UsageError
from t5_training.text_files import scan_decoding

EXTENSIONS = {".csv": ",", ".tsv": "\t", ".json": None, ".jsonl": None}
# A cell may hold a long document; csv's default limit (128 KiB) would call it an error.
MAX_FIELD_BYTES = 64 * 2**20


def scan_lines(path: str, encoding: str) -> tuple[int, UsageError | None]:
    """Counts the non-blank lines of a file, stopping with an error at the first that does not decode."""
    count, bad = scan_decoding(path, encoding)
    if bad is None:
        return count, None
    line, byte, reason = bad
    # "utf-8-sig" (UTF-8 that may start with a byte-order mark) is still just UTF-8 to a user.
    name = "UTF-8" if encoding.replace("_", "-").lower().startswith("utf-8") else encoding
    return count, UsageError(f"{path} is not {name}: line {line} has byte 0x{byte:02x} ({reason}); re-encode it "
                             "as UTF-8")


def read_table_file(path: str, split: str, required: Sequence[str]) -> datasets.Dataset:
    """The rows of one task file as a Dataset of text columns (JSON: the `required` keys only)."""
    if not os.path.isfile(path):
        raise UsageError(f"{split} file {path!r} does not exist; check the path")
    extension = os.path.splitext(path)[1].lower()
    if extension not in EXTENSIONS:
        raise UsageError(f"{path}: unsupported file type {extension!r}; use .csv, .tsv, .json or .jsonl")
    delimiter = EXTENSIONS[extension]
    lines, error = scan_lines(path, "utf-8")
    if error:
        raise error
    if lines <= (1 if delimiter else 0):  # a CSV's first line is its header
        raise UsageError(f"{split} file {path} has no rows; point the run at a file with rows")
    columns = _read_delimited(path, delimiter) if delimiter else _read_json(path, required)
    return datasets.Dataset.from_dict(columns)


def _field_positions(path: str, layout: LocalFiles, header: list[str] | None) -> dict[str, int]:
    """Where each of the layout's columns sits in a row: named by the header, or by position."""
    if header is None:
        return {old: int(old) for old in layout.columns}
    if not header:
        raise UsageError(f"{path} is empty; --data_dir must hold the task's original files")
    missing = [old for old in layout.columns if old not in header]
    if missing:
        raise UsageError(f"{path} line 1 (the header): no column {missing[0]!r}; columns found: "
                         f"{', '.join(header)}. Is --data_dir the right dataset?")
    return {old: header.index(old) for old in layout.columns}


def _read_delimited(path: str, delimiter: str) -> dict[str, list[str]]:
    name = "tab" if delimiter == "\t" else "comma"
    csv.field_size_limit(MAX_FIELD_BYTES)
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=delimiter)
        try:
            header = next(row for row in reader if row)
            if len(set(header)) < len(header) or not all(h.strip() and h.isprintable() for h in header):
                # Arrow cannot hold a column name with a control character (NUL, tab, newline).
                raise UsageError(f"{path} line {reader.line_num}: the header {header!r} has empty, repeated or "
                                 f"unprintable column names; the first line must name each column once, "
                                 f"{name}-separated")
            columns: dict[str, list[str]] = {h: [] for h in header}
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise UsageError(f"{path} line {reader.line_num}: {len(row)} fields, but the header has "
                                     f"{len(header)}; a {'.tsv' if delimiter == chr(9) else '.csv'} file is "
                                     f"{name}-separated: quote fields that contain the delimiter")
                for column, value in zip(header, row):
                    columns[column].append(value)
        except csv.Error as err:
            raise UsageError(f"{path} line {reader.line_num}: {err}; fix the line or re-save the file as "
                             f"{name}-separated UTF-8") from None
    return columns


def _read_json(path: str, required: Sequence[str]) -> dict[str, list[str]]:
    """JSON lines (one object per line), or one JSON array of objects."""
    with open(path, encoding="utf-8-sig") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        try:
            records = list(enumerate(json.loads(text), start=1))
        except json.JSONDecodeError as err:
            raise UsageError(f"{path} is not valid JSON (line {err.lineno}: {err.msg}); write one object per "
                             "line (JSON lines) or one array of objects") from None
        except RecursionError:
            raise UsageError(f"{path} nests JSON too deeply to read; rows must be flat objects") from None
        where = "item"
    else:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    records.append((number, json.loads(line)))
                except json.JSONDecodeError as err:
                    raise UsageError(f"{path} line {number} is not JSON ({err.msg}); each line must be one object "
                                     "such as {\"source\": \"...\", \"target\": \"...\"}") from None
                except RecursionError:
                    raise UsageError(f"{path} line {number} nests JSON too deeply to read; rows must be flat "
                                     "objects") from None
        where = "line"
    columns: dict[str, list[str]] = {name: [] for name in required}
    for number, record in records:
        if not isinstance(record, dict):
            raise UsageError(f"{path} {where} {number}: a JSON {type(record).__name__}, not an object; each row must be "
                             f"an object with the keys {', '.join(required)}")
        for name in required:
            if name not in record:
                raise UsageError(f"{path} {where} {number}: no {name!r} key; keys found: "
                                 f"{', '.join(map(repr, record)) or 'none'}")
            columns[name].append(_text(record[name], path, where, number, name))
    return columns


def _text(value, path: str, where: str, number: int, name: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    kind = "null" if value is None else type(value).__name__
    raise UsageError(f"{path} {where} {number}: {name!r} is {kind}; it must be text or a number")


def read_original_file(path: str, layout: LocalFiles) -> datasets.Dataset:
    """Reads one original file (e.g. a GLUE TSV) with the entry's layout, renaming its columns."""
    if not os.path.isfile(path):
        raise UsageError(f"{path} not found; --data_dir must hold {os.path.basename(path)}")
    columns: dict[str, list[str]] = {new: [] for new in layout.columns.values()}
    try:
        with open(path, encoding=layout.encoding, newline="") as f:
            reader = csv.reader(f, delimiter=layout.delimiter, quoting=layout.quoting)
            fields = _field_positions(path, layout, next(reader, []) if layout.header else None)
            needed = max(fields.values()) + 1
            for line, row in enumerate(reader, start=2 if layout.header else 1):
                if not row:
                    continue
                if len(row) < needed:
                    short = min((old for old, i in fields.items() if i >= len(row)), key=fields.get)
                    raise UsageError(f"{path} line {line}: column {short!r} is field {fields[short] + 1}, but the "
                                     f"line has {len(row)}; fix or remove the line")
                for old, new in layout.columns.items():
                    columns[new].append(row[fields[old]])
    except UnicodeDecodeError as err:
        raise (scan_lines(path, layout.encoding)[1] or err) from None
    return datasets.Dataset.from_dict(columns)
