"""Outputs that name no label: counted per split in the results, and warned about where they are written.

A classification output names a label when it is one of the entry's label words, a regression's
when `float(text)` is a finite number: T5's postprocessors, as evaluation applies them
(metrics.label_to_id, metrics.string_to_float). Dev evaluation counts any other output wrong;
--do_predict writes it as the task's fallback (submission.fallback), so a model that never
learned the label words still gives a well-formed leaderboard file, a constant guess. The count
and share go into eval_results.json (`no_label`, `no_label_share`, per split and task as the
metrics are keyed) and predict_results.json (per file); a file with any is warned about, and one
that is mostly fallback loudly, again at the zip, where a long run's output ends. So is the dev
evaluation that eval_results.json holds, once, when the run ends (`dev_warnings`), whatever the
model: a full one, an adapter, a prompt-tuned export evaluated with --do_train false.
"""
from __future__ import annotations

import math
import sys
from typing import Mapping, Sequence

from t5_training.entries import TaskEntry
from t5_training import metrics, run_dir

# Above this share of fallback rows a file is mostly a constant guess, not the model's answers.
MOSTLY = 0.5
# The kinds whose outputs are meant to be labels; a seq2seq task's every output is an answer.
LABELLED_KINDS = ("classification", "regression")


def label_of(entry: TaskEntry, text: str) -> int | float | None:
    """The label a predicted text names (T5's rules, as evaluation scores it), or None when it names none."""
    if entry.kind == "regression":
        score = metrics.string_to_float(text, default=math.nan)
        return score if math.isfinite(score) else None
    class_id = metrics.label_to_id(text, entry.label_words)
    return class_id if class_id >= 0 else None


def counts(entry: TaskEntry, predictions: Sequence[str]) -> dict[str, float]:
    """{"no_label": outputs that name no label, "no_label_share": their share of the rows, 0 to 1};
    {} for a task without labels (seq2seq)."""
    if entry.kind not in LABELLED_KINDS:
        return {}
    missed = sum(label_of(entry, text) is None for text in predictions)
    return {"no_label": missed, "no_label_share": missed / len(predictions) if predictions else 0.0}


# Why most outputs name no label, and what to check: the same for dev and test rows.
_NOT_LEARNED = ("the model has not learned the label words (too little training, or another task's or mode's "
                "model: check --model_name_or_path and --mode_token)")


def warning(path: str, missed: int, rows: int, written_as: str) -> str | None:
    """The line a leaderboard file with fallback rows gets: plain for some, loud when they are most; None for none."""
    if not missed:
        return None
    share = missed / rows
    if share > MOSTLY:
        return (f"WARNING: {path} is mostly the fallback, not the model's answers: {missed} of {rows} test "
                f"predictions ({share:.1%}) name no label and were written as {written_as}: {_NOT_LEARNED}; "
                "predictions_*test*.tsv has its raw outputs. Do not submit this file as the model's result")
    return (f"warning: {path}: {missed} of {rows} test predictions ({share:.1%}) name no label and were written "
            f"as {written_as}; predictions_*test*.tsv has the raw outputs")


def dev_warnings(results: Mapping[str, float]) -> list[str]:
    """A line for each task and split of a dev evaluation (`results`, as eval_results.json keys them) with outputs
    that name no label, which its metrics count as wrong: plain for some, loud when they are most."""
    lines = []
    for key, missed in results.items():
        if not key.endswith("no_label") or not missed:
            continue
        share = results[f"{key}_share"]
        rows = round(missed / share)
        where = key.removesuffix("no_label").rstrip("/")
        counted = (f"{run_dir.RESULTS_FILES['eval']}: {missed} of {rows} dev outputs{f' of {where}' if where else ''} "
                   f"({share:.1%}) name no label")
        if share > MOSTLY:
            lines.append(f"WARNING: {counted} and are scored as wrong: {_NOT_LEARNED}; predictions_*.tsv has the "
                         "raw outputs")
        else:
            lines.append(f"warning: {counted} and are scored as wrong; predictions_*.tsv has the raw outputs")
    return lines


def zip_warning(zip_path: str, files: Mapping[str, Mapping]) -> str | None:
    """One loud line naming the zip's files that are mostly fallback (`files` as predict_results.json has them)."""
    mostly = [f"{name} ({entry['no_label_share']:.1%} no label)" for name, entry in files.items()
              if entry["no_label_share"] > MOSTLY]
    if not mostly:
        return None
    return (f"WARNING: {zip_path} holds files that are mostly the fallback, not the model's answers: "
            f"{', '.join(mostly)}; the leaderboard would score a constant guess for them (see the warnings above)")


def to_stderr(line: str) -> None:
    """Where a warning goes by default: stderr, apart from the run's ordinary output."""
    print(line, file=sys.stderr, flush=True)
