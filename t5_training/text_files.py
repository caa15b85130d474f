"""Pretraining's corpus files, read as documents: a line of text, a JSON line's text field, or a
parquet row. Anything a file holds that is not that (another encoding, a broken line, a field that
is not text, a file that is not parquet) is one UsageError naming the file and, where there is
one, the line. Shared by pre_train_t5.py (t5_training/corpus.py), the tokenizer and dataset_stats.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from t5_training.errors import UsageError, first_line

TEXT_SUFFIXES = (".txt", ".text", ".raw")
JSON_SUFFIXES = (".json", ".jsonl")
PARQUET_SUFFIXES = (".parquet",)


def expand_files(patterns: Sequence[str], flag: str = "--train_file") -> list[str]:
    """Globs expanded and sorted (so every process sees the same order); unmatched ones are an error."""
    files = []
    for pattern in patterns:
        matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        matched = [path for path in matched if os.path.isfile(path)]
        if not matched and os.path.isdir(pattern):
            raise UsageError(f"{flag} {pattern!r} is a folder; pass the files in it, e.g. "
                             f"'{os.path.join(pattern, '*.txt')}' (quoted)")
        if not matched:
            raise UsageError(f"{flag} {pattern!r} matches no file; check the path or quote the glob")
        # A file matched by two patterns is still read once.
        files.extend(path for path in matched if path not in files)
    for path in files:
        if not path.endswith(TEXT_SUFFIXES + JSON_SUFFIXES + PARQUET_SUFFIXES):
            raise UsageError(f"{path}: unsupported corpus file; use .txt, .jsonl/.json or .parquet")
    return files


def iter_documents(path: str, text_column: str) -> Iterator[str]:
    """Documents of one file, read lazily: a line of text, a JSON line's field, or a parquet row.

    A file that cannot be read as its suffix says (not UTF-8, not parquet, a JSON line that is not
    an object with a text field) is a UsageError naming it, and the line where there is one.
    """
    if path.endswith(PARQUET_SUFFIXES):
        yield from _parquet_documents(path, text_column)
        return
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if path.endswith(JSON_SUFFIXES):
                    line = _json_text(path, number, line, text_column)
                if line.strip():
                    yield line.strip()
    except UnicodeDecodeError:
        raise _not_utf8(path) from None


def _not_utf8(path: str) -> UsageError:
    """Names the first line that is not UTF-8 (text mode decodes whole blocks, so its error cannot)."""
    _, bad = scan_decoding(path, "utf-8")
    if bad:
        number, byte, _ = bad
        return UsageError(f"{path} line {number} is not UTF-8 text (byte {byte:#04x}); convert "
                          "the file to UTF-8, e.g. iconv -f latin1 -t utf-8")
    return UsageError(f"{path} is not UTF-8 text; convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8")


def scan_decoding(path: str, encoding: str) -> tuple[int, tuple[int, int, str] | None]:
    """(the non-blank lines before the first that does not decode, (its number, its first bad byte,
    the codec's reason) or None): line by line, because a UnicodeDecodeError's offset counts from
    the start of the block being decoded, not of the file."""
    count = 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                raw.decode(encoding)
            except UnicodeDecodeError as err:
                return count, (number, raw[err.start], err.reason)
            count += bool(raw.strip())
    return count, None


def _json_text(path: str, number: int, line: str, text_column: str) -> str:
    """The text field of one JSON line ("" for a blank line or a null field)."""
    if not line.strip():
        return ""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise UsageError(f"{path} line {number} is not JSON ({err.msg}); give one JSON object "
                         "a line (JSON Lines)") from None
    if not isinstance(record, dict) or text_column not in record:
        raise UsageError(f"{path} line {number} has no field {text_column!r}; set --text_column")
    text = record[text_column]
    if text is not None and not isinstance(text, str):
        raise UsageError(f"{path} line {number}: field {text_column!r} holds {type(text).__name__} "
                         f"{json.dumps(text)[:40]}, not text; set --text_column to the field with the text")
    return text or ""


def _parquet_documents(path: str, text_column: str) -> Iterator[str]:
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise UsageError(f"{path} is not a parquet file pyarrow can read ({first_line(err)[:120]}); "
                         "check the file, or give text as .txt or .jsonl") from None
    if text_column not in parquet.schema_arrow.names:
        raise UsageError(f"{path} has no column {text_column!r}; columns found: "
                         f"{', '.join(parquet.schema_arrow.names)}. Set --text_column")
    for batch in parquet.iter_batches(columns=[text_column], batch_size=1024):
        yield from (text for text in batch.column(0).to_pylist() if text and text.strip())
