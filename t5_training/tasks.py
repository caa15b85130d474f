"""Factories that turn a `DATASET_VALS` entry into the functions a run needs.

An entry is data; here it becomes: a check-and-normalize function for raw labels, a formatter
from raw columns to T5's (source, target) text, and a scorer from generated text to T5's
metrics. Scoring follows seqio: predictions and targets go through the same postprocessing
(label word -> class id, text -> float), and a prediction that maps to no label is -1, which
every metric counts as wrong.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from t5_training.entries import TaskEntry
from t5_training.registry import DATASET_VALS
from t5_training import metrics
from t5_training.errors import UsageError

Batch = Mapping[str, list]


def get_entry(benchmark: str, task: str) -> TaskEntry:
    """The registry entry for `benchmark`/`task`, or a UsageError listing what is known."""
    if benchmark not in DATASET_VALS:
        raise UsageError(f"unknown --benchmark {benchmark!r}; known: {', '.join(sorted(DATASET_VALS))}")
    tasks = DATASET_VALS[benchmark]
    if task not in tasks:
        raise UsageError(
            f"unknown --dataset_name {task!r} for benchmark {benchmark!r}; known: {', '.join(sorted(tasks))}"
        )
    return tasks[task]


def required_columns(entry: TaskEntry) -> tuple[str, ...]:
    return (*entry.inputs, entry.target)


def _class_id(entry: TaskEntry, where: str, value, row: int) -> int:
    # A CSV id column with an empty cell is read as floats (1.0, 0.0, None): take 1.0 as 1 so the
    # error below names the empty row rather than the first one.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip() if value is not None else ""
    if text in entry.label_words:
        return entry.label_words.index(text)
    try:
        label = int(text)
    except ValueError:
        label = None
    if label is None or not 0 <= label < len(entry.label_words):
        allowed = ", ".join(f"{i} or {w!r}" for i, w in enumerate(entry.label_words))
        raise UsageError(f"{where} row {row}: label {value!r} is not one of the label words ({allowed}); "
                         "fix the row or the entry's label_words")
    return label


def _number(entry: TaskEntry, where: str, value, row: int) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number):
        raise UsageError(f"{where} row {row}: label {value!r} is not a number; fix or remove the row")
    return number


def _text(entry: TaskEntry, where: str, value, row: int) -> str:
    text = "" if value is None else str(value).strip()
    if not text:
        raise UsageError(f"{where} row {row}: the {entry.target!r} column is empty; fix or remove the row")
    return text


@dataclass(frozen=True)
class Kind:
    """What one kind of task (an entry's `kind`) does at each stage: the one place kinds differ."""

    target_type: str  # the arrow type of the canonical target column
    # (entry, where, raw value, 1-based row) -> canonical label, or a UsageError naming the row
    normalize: Callable[[TaskEntry, str, object, int], object]
    # (entry, canonical label) -> the target text T5 trains on
    target_text: Callable[[TaskEntry, object], str]
    # entry -> (generated or target text -> the value metrics compare)
    postprocessor: Callable[[TaskEntry], Callable[[str], object]]
    # whether the answer is one of a closed set of label words, so evaluation can score them
    closed_label_set: bool
    # the canonical label of a test row that has none (GLUE's hub test splits say -1)
    unlabelled: object


KINDS = {
    # T5 writes <unk> for unlabelled rows (label -1, e.g. GLUE test sets).
    "classification": Kind("int64", _class_id,
                           lambda entry, label: entry.label_words[label] if label >= 0 else "<unk>",
                           lambda entry: lambda text: metrics.label_to_id(text, entry.label_words), True, -1),
    "regression": Kind("float64", _number, lambda entry, label: metrics.stsb_target(label),
                       lambda entry: metrics.string_to_float, False, -1.0),
    "seq2seq": Kind("string", _text, lambda entry, label: label, lambda entry: lambda text: text.strip(), False,
                    ""),
}


def kind_of(entry: TaskEntry) -> Kind:
    return KINDS[entry.kind]


def is_unlabelled(value) -> bool:
    """Whether a test row's label cell says it has none: empty, missing, or GLUE's -1."""
    if value is None:
        return True
    text = str(value).strip()
    try:
        return float(text) == -1
    except ValueError:
        return not text


def make_label_normalizer(entry: TaskEntry, where: str, unlabelled_ok: bool = False) -> Callable[[Batch], dict]:
    """Checks the target column of a batch and returns it in canonical form.

    Classification labels become class ids (files may hold ids or label words), regression
    labels floats, seq2seq targets stripped strings. Anything else is a UsageError naming the
    row (`where` says which file or split) and the values that would be accepted. Only a test
    split (`unlabelled_ok`) may leave a row unlabelled (`is_unlabelled`): its label becomes the
    kind's `unlabelled` value.
    """
    kind = kind_of(entry)

    def normalize_one(value, row: int):
        if unlabelled_ok and is_unlabelled(value):
            return kind.unlabelled
        return kind.normalize(entry, where, value, row)

    def normalize(batch: Batch, indices: list[int]) -> dict:
        return {entry.target: [normalize_one(v, i + 1) for v, i in zip(batch[entry.target], indices)]}

    return normalize


def target_text(entry: TaskEntry, label) -> str:
    """The target string T5 trains on for one canonical label."""
    return kind_of(entry).target_text(entry, label)


def make_formatter(entry: TaskEntry) -> Callable[[Batch], dict]:
    """Batch of canonical columns -> {"source": [...], "target": [...]} in T5's text format."""

    def format_batch(batch: Batch) -> dict:
        sources = []
        for row in zip(*(batch[column] for column in entry.inputs)):
            parts = [entry.prefix] if entry.prefix else []
            for column, value in zip(entry.inputs, row):
                # CSV/JSON columns may hold numbers, and an empty CSV cell is None (a TSV's is "").
                value = "" if value is None else str(value)
                parts.extend([f"{column}:", value] if entry.show_keys else [value])
            sources.append(" ".join(parts))
        return {"source": sources, "target": [target_text(entry, v) for v in batch[entry.target]]}

    return format_batch


def make_postprocessor(entry: TaskEntry) -> Callable[[str], object]:
    """Generated (or target) text -> the value metrics compare."""
    return kind_of(entry).postprocessor(entry)


def make_scorer(entry: TaskEntry, rouge_use_stemmer: bool = False
                ) -> Callable[[Sequence[str], Sequence[str]], dict[str, float]]:
    """(predicted texts, target texts) -> {metric key: value} on T5's 0-100 scale."""
    postprocess = make_postprocessor(entry)

    def score(predictions: Sequence[str], targets: Sequence[str]) -> dict[str, float]:
        return metrics.compute_metrics(
            entry.metrics, [postprocess(p) for p in predictions], [postprocess(t) for t in targets],
            rouge_use_stemmer=rouge_use_stemmer)

    return score


def metric_key(entry: TaskEntry, split: str, metric: str) -> str:
    """The key a metric is logged under, after "eval/": bare when the task has one eval split."""
    return metric if len(entry.eval_splits) == 1 else f"{split}/{metric}"
