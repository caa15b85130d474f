"""Runs a trial's command and sees it to its end: hyperband's stop, a preemption, Ctrl-C.

A trial stopped by SIGTERM, SIGUSR1 or Ctrl-C saves a checkpoint before it ends; whatever it
started (data-loader workers and the like) never outlives it.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from t5_training.interrupts import PREEMPTION_SIGNALS

# Time a stopped trial gets to save its checkpoint before it is killed.
STOP_GRACE_SECONDS = 300


def supervise(command, log, env, progress, poll_seconds) -> tuple[int, bool, str | None]:
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
