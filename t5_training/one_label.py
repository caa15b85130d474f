"""Classifiers stuck at one label: a model that answers (nearly) every dev row with the same label.

Fine-tuning a T5 on a classification task first teaches it to emit a label word at all, and the
cheapest way to do that is to emit the commonest one for every input; a run that never gets past
that plateau scores the majority class and looks, in its loss curve, like a run that is merely
slow. Each dev evaluation of a classification task therefore records `top_label_share` (the share
of outputs naming the label predicted most, 0 to 1) and `one_label` (1 when the run is stuck
there, else 0), keyed per split and task as the other metrics; a run stuck for PATIENCE
evaluations in a row is warned about once while it trains, and one whose last evaluation is stuck
again when it ends, so a user can stop it or change its settings instead of reading a constant
guess as a result.
"""
from __future__ import annotations

import collections
from typing import Callable, Mapping, Sequence

from t5_training import no_label, run_dir
from t5_training.entries import TaskEntry

# At least this share of the outputs name one label ...
STUCK_SHARE = 0.95
# ... and that label is at least this much more common among the outputs than among the references:
# a task whose references are 97% one class is not stuck when its model predicts that class for all rows.
MARGIN = 0.1
# Evaluations in a row, one label each, before a training run is warned about.
PATIENCE = 3
# What to look at: a constant guess comes from the run's settings more often than from its data.
ADVICE = ("the model answers with one label whatever the input; check the learning rate (an adapter's "
          "too: docs/peft.md#stuck-at-one-label) and that the training labels are not all one class")


def counts(entry: TaskEntry, predictions: Sequence[str], targets: Sequence[str]) -> dict[str, float]:
    """{"top_label_share", "one_label"} for a classification task's outputs and references; {} otherwise."""
    if entry.kind != "classification" or not predictions:
        return {}
    labels = collections.Counter(no_label.label_of(entry, text) for text in predictions)
    labels.pop(None, None)  # outputs that name no label are counted by no_label, not as a label of their own
    if not labels:
        return {"top_label_share": 0.0, "one_label": 0}
    top, hits = labels.most_common(1)[0]
    share = hits / len(predictions)
    reference = sum(no_label.label_of(entry, text) == top for text in targets) / max(len(targets), 1)
    return {"top_label_share": share, "one_label": int(share >= STUCK_SHARE and share - reference >= MARGIN)}


def watch(evaluate: Callable[[object], dict], warn: Callable[[str], None],
          patience: int = PATIENCE) -> Callable[[object], dict]:
    """`evaluate` that also warns, once per task and split, when `patience` evaluations in a row are stuck."""
    streaks: dict[str, int] = collections.defaultdict(int)

    def watched(model) -> dict:
        results = evaluate(model)
        for key, stuck in results.items():
            if not key.endswith("one_label"):
                continue
            streaks[key] = streaks[key] + 1 if stuck else 0
            if streaks[key] == patience:
                warn(f"WARNING: {_where(key)}{_share(results, key):.1%} of the dev outputs have named one label in "
                     f"each of the last {patience} evaluations: {ADVICE}")
        return results

    return watched


def dev_warnings(results: Mapping[str, float]) -> list[str]:
    """A line for each task and split whose evaluation in `results` (as eval_results.json keys it) is stuck."""
    return [f"WARNING: {run_dir.RESULTS_FILES['eval']}: {_where(key)}{_share(results, key):.1%} of the dev outputs "
            f"name one label: {ADVICE}; predictions_*.tsv has them"
            for key, stuck in results.items() if key.endswith("one_label") and stuck]


def _where(key: str) -> str:
    """'sst2/validation: ' for a keyed metric, '' for a lone task's."""
    where = key.removesuffix("one_label").rstrip("/")
    return f"{where}: " if where else ""


def _share(results: Mapping[str, float], key: str) -> float:
    """The top_label_share beside a `one_label` key, for the same task and split."""
    return results[key.removesuffix("one_label") + "top_label_share"]
