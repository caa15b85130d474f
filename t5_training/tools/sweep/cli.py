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
import sys

from t5_training.errors import CliError, UsageError, run_cli
from t5_training.tools.sweep import engine
from t5_training.tools.sweep.config import RunnerConfig
from t5_training.tools.sweep.results import ranked, write_results
from t5_training.tools.sweep.schema import check_extra, load_sweep
from t5_training.tools.sweep.slurm import SBATCH_SCRIPT, launch_slurm
from t5_training.tools.sweep.state import claim_trial, locked_state, start_sweep
from t5_training.tools.sweep.trial import run_trial

# Like a W&B agent, give up after this many failed trials in a row rather than burn the budget.
MAX_FAILURES_IN_A_ROW = 3


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


def main(argv: list[str] | None = None) -> list[dict]:
    """Runs --count trials of the sweep (or submits them as a Slurm array); returns the ranked trials."""
    config = parse_args(argv)
    engine.require()  # before anything is written: one line naming the install command
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
