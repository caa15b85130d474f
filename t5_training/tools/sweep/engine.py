"""W&B's own search engine, the `sweeps` package the W&B server runs, as the runner uses it.

It proposes each trial from the trials so far (bayes, random or grid) and applies the YAML's
hyperband `early_terminate`; here it sees our trials as its SweepRuns.
"""
from __future__ import annotations

import random
import sys
import warnings

import numpy as np

from t5_training.errors import UsageError

INSTALL_SWEEPS = "pip install --no-deps sweeps==0.3.0 && pip install jsonschema jsonref"
MISSING_SWEEPS = ("the sweep runner needs W&B's search engine, the sweeps package, which is not installed: "
                  + INSTALL_SWEEPS)


def _import_sweeps():
    """W&B's `sweeps` package, or None where it is not installed (it is not a dependency: it pins
    numpy<2, so it is installed with --no-deps).

    Without it, `import sweeps` from the repository root does not fail: it finds the repository's
    own sweeps/ folder of YAMLs, which has no __init__.py, as a namespace package (a regular
    package anywhere on sys.path wins over one, so this happens only when the real one is
    missing). That module has no file and none of the engine, so it counts as missing too.
    """
    with warnings.catch_warnings():
        # sweeps 0.3.0 still names pydantic v1 settings; pydantic 2 warns on import and works.
        warnings.simplefilter("ignore")
        try:
            import sweeps
        except ImportError:
            return None
    if getattr(sweeps, "__file__", None) is None or not hasattr(sweeps, "next_run"):
        if sys.modules.get("sweeps") is sweeps:
            del sys.modules["sweeps"]  # so that a later import looks again rather than reuse the folder
        return None
    return sweeps


sweeps = _import_sweeps()


def require():
    """The `sweeps` module; a UsageError saying how to install it where it is missing."""
    if sweeps is None:
        raise UsageError(MISSING_SWEEPS)
    return sweeps

# Our trial states, as the search engine sees them. A trial stopped by hyperband has real,
# if truncated, results: bayes should learn from them, not impute the worst value.
RUN_STATES = {"running": "running", "finished": "finished", "stopped": "finished", "preempted": "preempted",
              "failed": "failed"}


def propose(sweep: dict, trials: list[dict], seed: int) -> dict | None:
    """W&B's next proposal for these trials, as plain values (None once a grid is exhausted)."""
    # The engine draws from `random` and numpy's global generator: seed both per trial so a
    # sweep is reproducible, and put them back so this stays invisible to the caller.
    saved = random.getstate(), np.random.get_state()
    random.seed(seed * 100003 + len(trials))
    np.random.seed((seed * 100003 + len(trials)) % 2 ** 32)
    try:
        run = require().next_run(sweep, sweep_runs(sweep, trials), validate=True)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
    return None if run is None else {name: plain(spec["value"]) for name, spec in run.config.items()}


def plain(value):
    """np.float64 and friends as Python numbers, for JSON and for flags."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def sweep_runs(sweep: dict, trials: list[dict]) -> list:
    """Trials as the search engine's SweepRuns: config, state, and the metric's history and summary."""
    sweep_run = require().SweepRun
    return [sweep_run(name=t["name"], state=RUN_STATES[t["state"]], history=t["history"],
                      summary_metrics=t["summary"], config={k: {"value": v} for k, v in t["params"].items()})
            for t in trials]


def should_stop(sweep: dict, trials: list[dict], name: str) -> bool:
    """Whether W&B's hyperband stops trial `name`, given every trial's evaluations so far."""
    if "early_terminate" not in sweep:
        return False
    return any(run.name == name for run in require().stop_runs(sweep, sweep_runs(sweep, trials)))


def schema_violations(sweep: dict) -> list:
    """What W&B's schema finds wrong with the sweep (empty: valid)."""
    return require().schema_violations_from_proposed_config(sweep)
