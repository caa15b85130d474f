"""The sweep's shared state, `<output_dir>/sweep_state.json`: every trial, read and written under a lock.

Runners may share a sweep (Slurm array tasks): each proposes its trial from the trials finished
by then, and no trial runs twice. A trial whose runner died on this host is resumed first.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket

from t5_training import reporting
from t5_training.errors import UsageError
from t5_training.tools.sweep.config import RunnerConfig
from t5_training.tools.sweep import engine

STATE_FILE = "sweep_state.json"


@contextlib.contextmanager
def locked_state(output_dir: str):
    """The sweep's state, read and rewritten while holding its lock; nothing is written on error.

    `lockf` takes a POSIX lock, which (unlike `flock`) NFS and Lustre enforce across nodes.
    """
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, STATE_FILE)
    with open(path + ".lock", "a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        try:
            state = {"trials": []}
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    state = json.load(f)
            yield state
            reporting.write_json(path, state)
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)


def start_sweep(config: RunnerConfig, sweep: dict) -> None:
    """Records the sweep in its folder, or checks that the folder holds this same sweep."""
    with locked_state(config.output_dir) as state:
        state.setdefault("sweep", sweep)
        state.setdefault("extra", list(config.extra))
        if (state["sweep"], state["extra"]) != (sweep, list(config.extra)):
            raise UsageError(f"--output_dir {config.output_dir} holds another sweep (different YAML or flags after "
                             "--); choose a new folder, or rerun with the same YAML and flags")


def claim_trial(config: RunnerConfig, sweep: dict) -> dict | None:
    """The trial this runner runs next: an interrupted one to resume, else a new proposal (None: done)."""
    with locked_state(config.output_dir) as state:
        trials = state["trials"]
        for trial in trials:
            if trial["state"] == "running" and not _owner_alive(trial["owner"]):
                trial["state"] = "preempted"  # its runner died on this host: resume it from its checkpoint
        trial = next((t for t in trials if t["state"] == "preempted"), None)
        if trial is None:
            if len(trials) >= sweep.get("run_cap", float("inf")):
                return None
            params = engine.propose(sweep, trials, config.seed)
            if params is None:
                return None
            trial = {"name": f"trial-{len(trials):03d}", "params": params, "history": [], "summary": {},
                     "exit_code": None, "starts": 0}
            trials.append(trial)
        trial.update(state="running", owner=_owner(), starts=trial["starts"] + 1)
        return dict(trial)


def find_trial(state: dict, name: str) -> dict:
    """The record of trial `name` in the state."""
    return next(t for t in state["trials"] if t["name"] == name)


def _owner() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": os.environ.get("SLURM_JOB_ID")}


def _owner_alive(owner: dict) -> bool:
    """False only when the runner is known dead: it ran on this host and its process is gone.

    A runner on another node cannot be checked from here; its trial stays "running" (a pending
    point to the search engine) until that runner, or its requeued Slurm task, ends it.
    """
    if owner["host"] != socket.gethostname():
        return True
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
