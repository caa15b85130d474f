"""Runs end early: preemption signals a run answers, and kill points that tests use to crash one.

Preemption. A cluster asks a job to stop with a signal some time before it kills it: Slurm's
`--signal=B:USR1@120` (or `scancel --signal=USR1`), SIGTERM at the time limit or from most
schedulers. `PreemptionHandler` records the signal; the training loop finishes the optimizer
step in flight, saves a checkpoint, and raises `Preempted`, which exits with code 75 so that a
job script can requeue the run and resume it with `--resume_from_checkpoint auto`.

Ctrl-C (SIGINT) in a terminal is answered the same way, but ends with `Interrupted` (exit 130,
the shell's code for SIGINT: nothing requeues it): a first Ctrl-C saves, a second one stops at
once without saving (KeyboardInterrupt, one line from errors.run_cli), for a save that takes long.

Kill points. `T5_TRAINING_KILL_AT=site:step[:micro]` makes the process SIGKILL itself at one
exact point, the way a node failure or the OOM killer would end it: nothing is flushed, no
handler runs. The resume tests use it to crash a run mid-accumulation, mid-evaluation and
mid-save. Sites:
    micro:S:K   after the backward pass of micro-batch K (1-based) of optimizer step S
    eval:S      during the evaluation at step S: metrics computed, not yet recorded or exported
    save:S      while checkpoint S is being written, before it is marked complete
Unset (always, outside tests) it costs one comparison per call.
"""
from __future__ import annotations

import os
import signal
import threading

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
STOP_SIGNALS = (*PREEMPTION_SIGNALS, signal.SIGINT)
KILL_ENV = "T5_TRAINING_KILL_AT"


class PreemptionHandler:
    """Installs handlers for SIGTERM, SIGUSR1 and SIGINT while the `with` block runs; restores the old ones after.

    The handler only records the signal: stopping happens at a step boundary, where the state
    is consistent. A second SIGTERM or SIGUSR1 while the checkpoint is written is ignored the
    same way; a second SIGINT (Ctrl-C again) raises KeyboardInterrupt, to stop without saving.
    """

    def __init__(self, announce=print):
        self.received: str | None = None
        self._announce = announce
        self._previous: dict = {}

    def __enter__(self) -> "PreemptionHandler":
        if threading.current_thread() is threading.main_thread():  # signal handlers live there only
            for sig in STOP_SIGNALS:
                # A run started in the background of a script ignores SIGINT (the shell set it so):
                # Ctrl-C meant for the script must not stop it.
                if sig != signal.SIGINT or signal.getsignal(sig) is not signal.SIG_IGN:
                    self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _record(self, signum, frame) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
            again = "; press Ctrl-C again to stop at once, without saving" if signum == signal.SIGINT else ""
            self._announce(f"{self.received} received: stopping after this step and saving a checkpoint{again}")
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt


def parse_kill_at(value: str | None) -> tuple[str, int, int | None] | None:
    if not value:
        return None
    site, step, *micro = value.split(":")
    if site not in ("micro", "eval", "save") or len(micro) != (site == "micro"):
        raise ValueError(f"{KILL_ENV}={value!r}: expected micro:STEP:K, eval:STEP or save:STEP")
    return site, int(step), int(micro[0]) if micro else None


_KILL_AT = parse_kill_at(os.environ.get(KILL_ENV))


def kill_point(site: str, step: int, micro: int | None = None) -> None:
    """SIGKILLs this process if `T5_TRAINING_KILL_AT` names this point."""
    if _KILL_AT is not None and _KILL_AT == (site, step, micro):
        os.kill(os.getpid(), signal.SIGKILL)
