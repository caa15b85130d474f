"""One trial, run to its end: its folder, its command and environment, how it ended, and what it recorded."""
from __future__ import annotations

import os
import sys

from t5_training import run_dir
from t5_training.errors import Preempted
from t5_training.tools.sweep import engine, results, state as sweep_state
from t5_training.tools.sweep.command import trial_command
from t5_training.tools.sweep.config import RunnerConfig
from t5_training.tools.sweep.schema import searched
from t5_training.tools.sweep.supervise import supervise


def run_trial(config: RunnerConfig, sweep: dict, trial: dict) -> str:
    """Runs one trial to its end, records how it ended, and returns that state."""
    trial_dir = os.path.join(config.output_dir, trial["name"])
    os.makedirs(trial_dir, exist_ok=True)
    command = trial_command(sweep, trial, trial_dir, config.extra)
    log_path = os.path.join(trial_dir, "trial.log")
    settings = " ".join(f"{k}={results.fmt(trial['params'][k])}" for k in searched(sweep))
    print(f"{trial['name']}{' (resumed)' if trial['starts'] > 1 else ''}: {settings}  [log: {log_path}]", flush=True)
    seen = 0

    def progress() -> bool:
        nonlocal seen
        history = results.read_history(trial_dir)
        if len(history) == seen:
            return False
        seen = len(history)
        with sweep_state.locked_state(config.output_dir) as state:
            sweep_state.find_trial(state, trial["name"])["history"] = history
            return engine.should_stop(sweep, state["trials"], trial["name"])

    with open(log_path, "a", encoding="utf-8") as log:
        code, stopped, preempted = supervise(command, log, _trial_env(config, sweep, trial, trial_dir), progress,
                                             config.poll_seconds)
    history = results.read_history(trial_dir)
    finished = run_dir.read_final_eval(trial_dir) is not None
    ended = ("finished" if finished else "stopped" if stopped and history else "preempted" if preempted
             else "failed")
    with sweep_state.locked_state(config.output_dir) as state:
        record = sweep_state.find_trial(state, trial["name"])
        record.update(state=ended, exit_code=code, history=history, summary=results.read_summary(trial_dir, history))
        results.write_results(config.output_dir, sweep, state["trials"])
    _report(sweep, record, log_path)
    if ended == "preempted":
        raise Preempted(f"{preempted} received: {trial['name']} saved a checkpoint; rerun the same command "
                        "and it resumes first")
    return ended


def _trial_env(config: RunnerConfig, sweep: dict, trial: dict, trial_dir: str) -> dict:
    env = dict(os.environ)
    # Trials log to W&B offline (`wandb sync` later) unless told otherwise: there is no agent here.
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_DIR", trial_dir)
    env.setdefault("WANDB_RUN_GROUP", sweep.get("name", os.path.basename(config.output_dir)))
    env["WANDB_NAME"] = trial["name"]
    return env


def _report(sweep: dict, record: dict, log_path: str) -> None:
    """How the trial ended and its metric; a failed trial's last log lines, or a metric it never logged."""
    metric, ended, history = sweep["metric"]["name"], record["state"], record["history"]
    print(f"{record['name']} {ended}: {metric} {results.fmt(results.ranked(sweep, [record])[0]['value'])}",
          flush=True)
    if ended == "failed":
        with open(log_path, encoding="utf-8", errors="replace") as f:
            print("".join(f.readlines()[-15:]), end="", file=sys.stderr, flush=True)
    elif history and metric not in history[-1]:
        print(f"warning: the trial logged no {metric}; it logged "
              f"{', '.join(k for k in history[-1] if k != '_step')}", file=sys.stderr, flush=True)
