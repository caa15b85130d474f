"""The sweep YAML: checked against W&B's schema and against what this runner can read back."""
from __future__ import annotations

import os

import yaml

from t5_training.errors import UsageError, first_line
from t5_training.tools.sweep import engine

# Flags the runner sets on every trial: a folder per trial, resumed after a preemption.
RUNNER_FLAGS = ("output_dir", "overwrite_output_dir", "resume_from_checkpoint")


def load_sweep(path: str) -> dict:
    """The sweep YAML, checked against W&B's schema and against what this runner can read back."""
    if not os.path.isfile(path):
        raise UsageError(f"sweep file {path!r} not found; pass a YAML such as sweeps/glue_sst2.yaml")
    with open(path, encoding="utf-8") as f:
        try:
            sweep = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise UsageError(f"{path} is not valid YAML: {first_line(err)}") from None
    if not isinstance(sweep, dict):
        raise UsageError(f"{path} must hold a mapping (program, method, metric, parameters, command)")
    if isinstance(sweep.get("command"), str):
        raise UsageError(f"{path}: command: must be a list of words (- accelerate, - launch, ...); one string "
                         "is run as a single program name (wandb#4135)")
    problems = engine.schema_violations(sweep)
    if problems:
        raise UsageError(f"{path} is not a valid W&B sweep: {problems[0]}")
    name = sweep.get("metric", {}).get("name", "")
    if not name.startswith("eval/"):
        raise UsageError(f"{path}: metric.name {name!r} must be an evaluation key, eval/<metric>, such as "
                         "eval/accuracy: the runner reads the trials' evaluations back from their checkpoints")
    return sweep


def searched(sweep: dict) -> list[str]:
    """The parameters the sweep varies (the others are fixed with `value:`)."""
    return [name for name, spec in sweep["parameters"].items() if "value" not in spec]


def check_extra(sweep: dict, extra: tuple[str, ...]) -> None:
    names = {word[2:].split("=", 1)[0] for word in extra if word.startswith("--")}
    for name in sorted(names & {*RUNNER_FLAGS, *searched(sweep)}):
        why = "the runner gives each trial its own" if name in RUNNER_FLAGS else "the sweep searches it"
        raise UsageError(f"--{name} after -- would override every trial's, but {why}; remove it")
