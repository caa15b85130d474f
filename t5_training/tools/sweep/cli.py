"""Run a W&B sweep YAML without a W&B server: here, one trial after another, or as a Slurm job array.

    python -m t5_training.sweep sweeps/glue_sst2.yaml --count 10 --output_dir runs/sweep_sst2 \
        -- --data_dir ../shared/data/SST-2        # flags after -- go to every trial
    python -m t5_training.sweep sweeps/glue_sst2.yaml --count 10 --output_dir runs/sweep_sst2 --slurm [submit]

W&B's own search engine, the `sweeps` package the W&B server runs, proposes each trial from
the trials so far (bayes, random or grid) and applies the YAML's hyperband `early_terminate`.
A trial runs the YAML's `command:` with ${program}, ${args}, ${env}, ${interpreter} and
${envvar:NAME} filled in as a W&B agent fills them, plus a folder of its own; its evaluations
are read back from its checkpoints (`step-*/train_state.json`) and `eval_results.json`.

Runners may share a sweep: `<output_dir>/sweep_state.json` holds every trial and is only read
and written under an fcntl lock, so each runner (a Slurm array task) proposes its trial from
the trials finished by then and no trial runs twice. A trial stopped by SIGTERM, SIGUSR1 or
Ctrl-C saves a checkpoint, the runner exits 75, and the next runner resumes that trial first.

Writes `<output_dir>/trial-NNN/` (a run and its trial.log), sweep_state.json, and the trials
ranked by the sweep's metric in results.md and results.json.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass

import numpy as np
import yaml

from t5_training import reporting, run_dir
from t5_training.errors import CliError, Preempted, UsageError, run_cli
from t5_training.interrupts import PREEMPTION_SIGNALS

with warnings.catch_warnings():
    # sweeps 0.3.0 still names pydantic v1 settings; pydantic 2 warns on import and works.
    warnings.simplefilter("ignore")
    try:
        import sweeps
    except ImportError:  # not a dependency: it pins numpy<2, so it is installed with --no-deps
        sweeps = None
INSTALL_SWEEPS = "pip install --no-deps sweeps==0.3.0 && pip install jsonschema jsonref"

STATE_FILE = "sweep_state.json"
SBATCH_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "slurm",
                             "sweep_offline.sbatch")
# Flags the runner sets on every trial: a folder per trial, resumed after a preemption.
RUNNER_FLAGS = ("output_dir", "overwrite_output_dir", "resume_from_checkpoint")
# Like a W&B agent, give up after this many failed trials in a row rather than burn the budget.
MAX_FAILURES_IN_A_ROW = 3
# Time a stopped trial gets to save its checkpoint before it is killed.
STOP_GRACE_SECONDS = 300
# Our trial states, as the search engine sees them. A trial stopped by hyperband has real,
# if truncated, results: bayes should learn from them, not impute the worst value.
RUN_STATES = {"running": "running", "finished": "finished", "stopped": "finished", "preempted": "preempted",
              "failed": "failed"}


@dataclass(frozen=True)
class RunnerConfig:
    """Flags of `python -m t5_training.sweep`."""

    sweep_file: str
    output_dir: str
    count: int = 1
    seed: int = 0
    poll_seconds: float = 10.0
    slurm: str | None = None
    parallel: int = 0
    extra: tuple[str, ...] = ()

    def __post_init__(self):
        if self.count < 1:
            raise UsageError(f"--count must be at least 1, got {self.count}")
        if self.poll_seconds <= 0:
            raise UsageError(f"--poll_seconds must be positive, got {self.poll_seconds}")
        if self.parallel < 0:
            raise UsageError(f"--parallel must be >= 0 (0: no limit), got {self.parallel}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message}; run with --help for usage")


def parse_args(argv: list[str] | None) -> RunnerConfig:
    """Runner flags, then the trials' own flags after `--`."""
    words = list(argv or [])
    extra = words[words.index("--") + 1:] if "--" in words else []
    words = words[:words.index("--")] if "--" in words else words
    parser = _Parser(prog="python -m t5_training.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_file", help="A W&B sweep YAML, e.g. sweeps/glue_sst2.yaml.")
    parser.add_argument("--output_dir", required=True, help="The sweep's folder: state, trials, results.")
    parser.add_argument("--count", type=int, default=1, help="Trials this runner runs (Slurm: array tasks).")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the proposals (with the trial number).")
    parser.add_argument("--poll_seconds", type=float, default=10.0, help="How often hyperband looks at a trial.")
    parser.add_argument("--slurm", nargs="?", const="print", choices=("print", "submit"),
                        help=f"Print (or submit) an sbatch array of --count tasks running {SBATCH_SCRIPT}.")
    parser.add_argument("--parallel", type=int, default=0, help="Slurm: at most N array tasks at once.")
    return RunnerConfig(**vars(parser.parse_args(words)), extra=tuple(extra))


def load_sweep(path: str) -> dict:
    """The sweep YAML, checked against W&B's schema and against what this runner can read back."""
    if not os.path.isfile(path):
        raise UsageError(f"sweep file {path!r} not found; pass a YAML such as sweeps/glue_sst2.yaml")
    with open(path, encoding="utf-8") as f:
        try:
            sweep = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise UsageError(f"{path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(sweep, dict):
        raise UsageError(f"{path} must hold a mapping (program, method, metric, parameters, command)")
    if isinstance(sweep.get("command"), str):
        raise UsageError(f"{path}: command: must be a list of words (- accelerate, - launch, ...); one string "
                         "is run as a single program name (wandb#4135)")
    problems = sweeps.schema_violations_from_proposed_config(sweep)
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
            params = propose(sweep, trials, config.seed)
            if params is None:
                return None
            trial = {"name": f"trial-{len(trials):03d}", "params": params, "history": [], "summary": {},
                     "exit_code": None, "starts": 0}
            trials.append(trial)
        trial.update(state="running", owner=_owner(), starts=trial["starts"] + 1)
        return dict(trial)


def propose(sweep: dict, trials: list[dict], seed: int) -> dict | None:
    """W&B's next proposal for these trials, as plain values (None once a grid is exhausted)."""
    # The engine draws from `random` and numpy's global generator: seed both per trial so a
    # sweep is reproducible, and put them back so this stays invisible to the caller.
    saved = random.getstate(), np.random.get_state()
    random.seed(seed * 100003 + len(trials))
    np.random.seed((seed * 100003 + len(trials)) % 2 ** 32)
    try:
        run = sweeps.next_run(sweep, sweep_runs(sweep, trials), validate=True)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
    return None if run is None else {name: _plain(spec["value"]) for name, spec in run.config.items()}


def _plain(value):
    """np.float64 and friends as Python numbers, for JSON and for flags."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def sweep_runs(sweep: dict, trials: list[dict]) -> list:
    """Trials as the search engine's SweepRuns: config, state, and the metric's history and summary."""
    return [sweeps.SweepRun(name=t["name"], state=RUN_STATES[t["state"]], history=t["history"],
                            summary_metrics=t["summary"], config={k: {"value": v} for k, v in t["params"].items()})
            for t in trials]


def trial_command(sweep: dict, trial: dict, trial_dir: str, extra: tuple[str, ...]) -> list[str]:
    """The YAML's command with its macros filled in exactly as a W&B agent does, then the runner's flags."""
    # W&B's own builders: the same --flag=value words, ${envvar:NAME} expansion and formats.
    from wandb.sdk.launch.sweeps import utils as wandb_sweep_utils

    macros = wandb_sweep_utils.create_sweep_command_args({"args": {k: {"value": v}
                                                                   for k, v in trial["params"].items()}})
    # The agent runs "python"; this runner's own interpreter keeps trials in its environment.
    macros.update(env=["/usr/bin/env"], interpreter=[sys.executable], program=[sweep.get("program", "")])
    words = []
    for word in map(str, wandb_sweep_utils.create_sweep_command(list(sweep.get("command") or []))):
        if word.startswith("${") and word.endswith("}"):
            if word[2:-1] not in macros or word == "${program}" and not sweep.get("program"):
                raise UsageError(f"the sweep's command uses {word}, which this runner cannot fill in; "
                                 "use ${program} (with program:), ${args}, ${env} or ${interpreter}")
            words += macros[word[2:-1]]
        else:
            words.append(word)
    return [*words, f"--output_dir={trial_dir}", "--overwrite_output_dir=true", "--resume_from_checkpoint=auto",
            *extra]


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


def should_stop(sweep: dict, trials: list[dict], name: str) -> bool:
    """Whether W&B's hyperband stops trial `name`, given every trial's evaluations so far."""
    if "early_terminate" not in sweep:
        return False
    return any(run.name == name for run in sweeps.stop_runs(sweep, sweep_runs(sweep, trials)))


def run_trial(config: RunnerConfig, sweep: dict, trial: dict) -> str:
    """Runs one trial to its end, records how it ended, and returns that state."""
    trial_dir = os.path.join(config.output_dir, trial["name"])
    os.makedirs(trial_dir, exist_ok=True)
    command = trial_command(sweep, trial, trial_dir, config.extra)
    log_path = os.path.join(trial_dir, "trial.log")
    settings = " ".join(f"{k}={_fmt(trial['params'][k])}" for k in searched(sweep))
    print(f"{trial['name']}{' (resumed)' if trial['starts'] > 1 else ''}: {settings}  [log: {log_path}]", flush=True)

    env = dict(os.environ)
    # Trials log to W&B offline (`wandb sync` later) unless told otherwise: there is no agent here.
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_DIR", trial_dir)
    env.setdefault("WANDB_RUN_GROUP", sweep.get("name", os.path.basename(config.output_dir)))
    env["WANDB_NAME"] = trial["name"]
    seen = 0

    def progress() -> bool:
        nonlocal seen
        history = read_history(trial_dir)
        if len(history) == seen:
            return False
        seen = len(history)
        with locked_state(config.output_dir) as state:
            _find(state, trial["name"])["history"] = history
            return should_stop(sweep, state["trials"], trial["name"])

    with open(log_path, "a", encoding="utf-8") as log:
        code, stopped, preempted = _supervise(command, log, env, progress, config.poll_seconds)
    history = read_history(trial_dir)
    finished = run_dir.read_final_eval(trial_dir) is not None
    ended = ("finished" if finished else "stopped" if stopped and history else "preempted" if preempted
             else "failed")
    with locked_state(config.output_dir) as state:
        record = _find(state, trial["name"])
        record.update(state=ended, exit_code=code, history=history, summary=read_summary(trial_dir, history))
        write_results(config.output_dir, sweep, state["trials"])
    print(f"{trial['name']} {ended}: {sweep['metric']['name']} {_fmt(ranked(sweep, [record])[0]['value'])}",
          flush=True)
    if ended == "failed":
        with open(log_path, encoding="utf-8", errors="replace") as f:
            print("".join(f.readlines()[-15:]), end="", file=sys.stderr, flush=True)
    elif history and sweep["metric"]["name"] not in history[-1]:
        print(f"warning: the trial logged no {sweep['metric']['name']}; it logged "
              f"{', '.join(k for k in history[-1] if k != '_step')}", file=sys.stderr, flush=True)
    if ended == "preempted":
        raise Preempted(f"{preempted} received: {trial['name']} saved a checkpoint; rerun the same command "
                        "and it resumes first")
    return ended


def _supervise(command, log, env, progress, poll_seconds) -> tuple[int, bool, str | None]:
    """Runs the command, asking `progress()` every poll whether to stop it; passes on preemption and Ctrl-C.

    Returns (exit code, stopped by hyperband, the preemption signal received).
    """
    received: list[str] = []
    hyperband, asked_at, next_poll = False, None, time.monotonic() + poll_seconds
    with _recording(received):
        # USR1 ignored, inherited through exec as in slurm/preemption.sh: a USR1 sent to every
        # process of a job must not kill `accelerate launch`; the training process handles it.
        recording = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            # A session of its own: Ctrl-C in the terminal reaches the runner only, which stops
            # the trial cleanly, and everything the trial started can be killed as one group.
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            signal.signal(signal.SIGUSR1, recording)
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = proc.wait(timeout=min(poll_seconds, 1.0))  # short waits: signals are answered promptly
                break
            if asked_at is None and not received and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + poll_seconds
                hyperband = progress()
                if hyperband:
                    print("hyperband: stopping the trial", flush=True)
            if asked_at is None and (received or hyperband):
                for pid in _trainers(proc.pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
                asked_at = time.monotonic()
            elif asked_at is not None and time.monotonic() - asked_at > STOP_GRACE_SECONDS:
                _kill_group(proc.pid)
        # A scheduler may have signalled every process, killing `accelerate launch` while the
        # training process it started is still saving its checkpoint: let that finish.
        deadline = (asked_at or time.monotonic()) + (STOP_GRACE_SECONDS if received or hyperband else 10)
        while _group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
    _kill_group(proc.pid)  # data-loader workers and the like never outlive their trial
    return code, hyperband, received[0] if received else None


@contextlib.contextmanager
def _recording(received: list):
    """Records the first SIGTERM, SIGUSR1 (a scheduler's preemption) or SIGINT (Ctrl-C) in `received`."""

    def record(signum, frame):
        if not received:
            received.append(signal.Signals(signum).name)
            print(f"{received[0]} received: the trial saves a checkpoint and stops", flush=True)

    previous = {sig: signal.signal(sig, record) for sig in (*PREEMPTION_SIGNALS, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every live process, from /proc (Linux; empty elsewhere)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]  # after "pid (name)"
        except (OSError, ValueError):
            continue
        if state != "Z":
            found.append((int(entry), int(ppid), int(pgrp)))
    return found


def _trainers(leader: int) -> list[int]:
    """The processes a stop signal goes to: the command's children if it has any, else the command.

    `accelerate launch` neither passes a signal on to the training process it starts nor
    survives one: signalling it would leave the run saving its checkpoint with nobody waiting.
    """
    return [pid for pid, ppid, _ in _processes() if ppid == leader] or [leader]


def _group(pgid: int) -> list[int]:
    return [pid for pid, _, pgrp in _processes() if pgrp == pgid]


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def ranked(sweep: dict, trials: list[dict]) -> list[dict]:
    """One row per trial, best first by the sweep's metric, taken the way the search engine takes it
    (the best value over the trial's evaluations); trials without a value come last."""
    metric, goal = sweep["metric"]["name"], sweep["metric"].get("goal", "minimize")
    rows = []
    for trial, run in zip(trials, sweep_runs(sweep, trials)):
        try:
            value = run.metric_extremum(metric, kind=goal)
        except ValueError:
            value = None
        step = next((h["_step"] for h in trial["history"] if h.get(metric) == value), None)
        rows.append({"trial": trial["name"], "state": trial["state"], "value": _plain(value), "step": step,
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
        lines.append("| " + " | ".join(_fmt(c) for c in cells) + " |")
    table = "\n".join(lines) + "\n"
    reporting.write_json(os.path.join(output_dir, "results.json"), {"metric": sweep["metric"], "trials": rows})
    with open(os.path.join(output_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(table)
    return table


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _find(state: dict, name: str) -> dict:
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


def slurm_array(config: RunnerConfig) -> list[str]:
    """The sbatch command whose array tasks each run one trial of this sweep."""
    array = f"0-{config.count - 1}" + (f"%{config.parallel}" if config.parallel else "")
    script = os.path.relpath(SBATCH_SCRIPT)
    return ["sbatch", f"--array={array}", script, config.sweep_file, config.output_dir,
            *(["--", *config.extra] if config.extra else [])]


def launch_slurm(config: RunnerConfig) -> None:
    command = slurm_array(config)
    print(" ".join(command), flush=True)
    if config.slurm == "submit":
        try:
            subprocess.run(command, check=True)
        except FileNotFoundError:
            raise UsageError("sbatch not found: run the command above on the cluster's login node") from None
        except subprocess.CalledProcessError as err:
            raise CliError(f"sbatch failed with exit code {err.returncode}") from None


def main(argv: list[str] | None = None) -> list[dict]:
    """Runs --count trials of the sweep (or submits them as a Slurm array); returns the ranked trials."""
    config = parse_args(argv)
    if sweeps is None:
        raise UsageError(f"the sweep runner needs W&B's search engine, the sweeps package: {INSTALL_SWEEPS}")
    sweep = load_sweep(config.sweep_file)
    check_extra(sweep, config.extra)
    start_sweep(config, sweep)
    if config.slurm:
        launch_slurm(config)
        return []
    failures = 0
    for _ in range(config.count):
        trial = claim_trial(config, sweep)
        if trial is None:
            print("the sweep has no more trials to propose (run_cap reached, or the grid is done)")
            break
        failures = failures + 1 if run_trial(config, sweep, trial) == "failed" else 0
        if failures == min(MAX_FAILURES_IN_A_ROW, config.count):
            raise CliError(f"{failures} trial(s) in a row failed; see the trial.log files in {config.output_dir}")
    with locked_state(config.output_dir) as state:
        print(write_results(config.output_dir, sweep, state["trials"]), end="", flush=True)
        return ranked(sweep, state["trials"])


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
