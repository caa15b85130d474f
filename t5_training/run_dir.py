"""Reading a run folder: the one reader of what a running or finished run wrote.

A run writes, in its --output_dir:
  step-NNNNNN/train_state.json   per checkpoint: step, data position, per-step losses, evaluations
  best/, final/                  exports that from_pretrained loads
  train_results.json, eval_results.json   written when the run finishes, after final/

The sweep runner, the demo, the benchmarks and the tests read runs through these functions,
so what "finished" and "newest checkpoint" mean is decided here once: only complete
checkpoints count (checkpoint.list_checkpoints), and a run is finished when its export and both
results files exist.
"""
from __future__ import annotations

import json
import os

from t5_training import checkpoint

RESULTS_FILES = {"train": "train_results.json", "eval": "eval_results.json"}


def read_state(run_dir: str, step: int | None = None) -> dict | None:
    """The train_state.json of checkpoint `step`, or of the newest complete checkpoint; None if there is none.

    A checkpoint rotated away between listing and reading (a run still going) is skipped for
    the next newest, so a reader polling a live run never fails on it.
    """
    paths = ([checkpoint.checkpoint_dir(run_dir, step)] if step is not None
             else list(reversed(checkpoint.list_checkpoints(run_dir))))
    for path in paths:
        state = _read_json(os.path.join(path, checkpoint.STATE_FILE))
        if state is not None:
            return state
    return None


def read_losses(run_dir: str, step: int | None = None) -> list[float]:
    """The training loss of every optimizer step up to the checkpoint (newest by default)."""
    state = read_state(run_dir, step)
    return list(state["losses"]) if state else []


def read_evals(run_dir: str) -> list[dict]:
    """Every evaluation so far ({"step", metric: value, ...}), from the newest checkpoint."""
    state = read_state(run_dir)
    return list(state.get("evals", [])) if state else []


def read_final_eval(run_dir: str) -> dict | None:
    """eval_results.json, which a run writes as it finishes; None while it runs or if it never finished."""
    return _read_json(os.path.join(run_dir, RESULTS_FILES["eval"]))


def read_results(run_dir: str) -> dict | None:
    """{"train": ..., "eval": ...} of a finished run (its final export and both results files); else None."""
    if not os.path.isfile(os.path.join(run_dir, "final", "config.json")):
        return None
    results = {key: _read_json(os.path.join(run_dir, name)) for key, name in RESULTS_FILES.items()}
    return results if all(value is not None for value in results.values()) else None


def _read_json(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
