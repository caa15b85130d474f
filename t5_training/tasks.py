"""Factories that turn a `DATASET_VALS` entry into the functions a run needs.

An entry is data; here it becomes: a check-and-normalize function for raw labels, a formatter
from raw columns to T5's (source, target) text, and a scorer from generated text to T5's
metrics. Scoring follows seqio: predictions and targets go through the same postprocessing
(label word -> class id, text -> float), and a prediction that maps to no label is -1, which
every metric counts as wrong.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from constants import DATASET_VALS, TaskEntry
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


def make_label_normalizer(entry: TaskEntry, where: str) -> Callable[[Batch], dict]:
    """Checks the target column of a batch and returns it in canonical form.

    Classification labels become class ids (files may hold ids or label words), regression
    labels floats, seq2seq targets stripped strings. Anything else is a UsageError naming the
    row (`where` says which file or split) and the values that would be accepted.
    """

    def to_class_id(value, row: int) -> int:
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

    def to_float(value, row: int) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if math.isnan(number):
            raise UsageError(f"{where} row {row}: label {value!r} is not a number; fix or remove the row")
        return number

    def to_text(value, row: int) -> str:
        text = "" if value is None else str(value).strip()
        if not text:
            raise UsageError(f"{where} row {row}: the {entry.target!r} column is empty; fix or remove the row")
        return text

    convert = {"classification": to_class_id, "regression": to_float, "seq2seq": to_text}[entry.kind]

    def normalize(batch: Batch, indices: list[int]) -> dict:
        return {entry.target: [convert(v, i + 1) for v, i in zip(batch[entry.target], indices)]}

    return normalize


def target_text(entry: TaskEntry, label) -> str:
    """The target string T5 trains on for one canonical label."""
    if entry.kind == "classification":
        # T5 writes <unk> for unlabelled rows (label -1, e.g. GLUE test sets).
        return entry.label_words[label] if label >= 0 else "<unk>"
    if entry.kind == "regression":
        return metrics.stsb_target(label)
    return label


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
    if entry.kind == "classification":
        return lambda text: metrics.label_to_id(text, entry.label_words)
    if entry.kind == "regression":
        return metrics.string_to_float
    return lambda text: text.strip()


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
