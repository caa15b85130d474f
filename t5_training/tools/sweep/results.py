"""What the trials recorded, read back from their runs, and the trials ranked by the sweep's metric.

A trial's evaluations are read from its checkpoints (`step-*/train_state.json`) and
`eval_results.json`; the ranking is written to results.md and results.json.
"""
from __future__ import annotations

import os

from t5_training import reporting, run_dir
from t5_training.tools.sweep import engine
from t5_training.tools.sweep.schema import searched


def read_history(trial_dir: str) -> list[dict]:
    """The trial's evaluations so far, keyed as they are logged (eval/<key>), from its newest checkpoint."""
    return [{"_step": e["step"], **{f"eval/{k}": v for k, v in e.items() if k != "step"}}
            for e in run_dir.read_evals(trial_dir)]


def read_summary(trial_dir: str, history: list[dict]) -> dict:
    """The final evaluation (eval_results.json, written when a run finishes), else the last one recorded."""
    final = run_dir.read_final_eval(trial_dir)
    if final is None:
        return {k: v for k, v in (history[-1] if history else {}).items() if k != "_step"}
    return {f"eval/{k}": v for k, v in final.items() if k not in ("best_metric", "best_step", "metric_to_optimize")}


def ranked(sweep: dict, trials: list[dict]) -> list[dict]:
    """One row per trial, best first by the sweep's metric, taken the way the search engine takes it
    (the best value over the trial's evaluations); trials without a value come last."""
    metric, goal = sweep["metric"]["name"], sweep["metric"].get("goal", "minimize")
    rows = []
    for trial, run in zip(trials, engine.sweep_runs(sweep, trials)):
        try:
            value = run.metric_extremum(metric, kind=goal)
        except ValueError:
            value = None
        step = next((h["_step"] for h in trial["history"] if h.get(metric) == value), None)
        rows.append({"trial": trial["name"], "state": trial["state"], "value": engine.plain(value), "step": step,
                     "params": {k: trial["params"][k] for k in searched(sweep)}})
    sign = -1 if goal == "maximize" else 1
    return sorted(rows, key=lambda r: (r["value"] is None, sign * (r["value"] or 0)))


def write_results(output_dir: str, sweep: dict, trials: list[dict]) -> str:
    """Writes results.json and results.md (the ranked table); returns the table."""
    rows = ranked(sweep, trials)
    names = searched(sweep)
    header = ["rank", "trial", "state", sweep["metric"]["name"], "at step", *names]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for rank, row in enumerate(rows, start=1):
        cells = [rank, row["trial"], row["state"], row["value"], row["step"], *(row["params"][n] for n in names)]
        lines.append("| " + " | ".join(fmt(c) for c in cells) + " |")
    table = "\n".join(lines) + "\n"
    reporting.write_json(os.path.join(output_dir, "results.json"), {"metric": sweep["metric"], "trials": rows})
    with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(table)
    return table


def fmt(value) -> str:
    """A table cell or a printed value: floats to 4 significant digits, None as "-"."""
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
