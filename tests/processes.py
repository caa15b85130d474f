"""Two training processes over gloo on the CPU, started as the multi-process tests start them.

On any host, GPU or not, the launched pair trains on the CPU in fp32 (ACCELERATE_USE_CPU; one
thread each, as two processes share two cores). A test that compares the pair with a run in its
own process makes that run on the CPU too (`on_the_cpu`): in the CUDA subset the test's own run
would otherwise train on the GPU in bf16, and fp32 against bf16 differs by more than either
differs from itself in another order (measured 2026-11-27, bf16 autocast on a CPU against the
fp32 pair: 3.0e-3 of the loss at step 4 of fine-tuning, over COARSE_RELATIVE's 2e-3). What these
tests check (how rows are dealt, gathered and resumed across processes) is the same on any device.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from unittest import mock

import psutil

from tests import fixtures

LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
# The GPUs hidden too: on a GPU host accelerate's wait_for_everyone names cuda:<local rank> as the
# gloo barrier's device even in a CPU run, and on a host with one GPU every pair failed at that
# barrier (seen on a lent H200, 2026-11-27).
CPU_ENV = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def timeout_s() -> float:
    """How long a launched pair may run: within pytest-timeout's limit where one is set (the GPU
    check sets PYTEST_TIMEOUT), so that a hung pair is killed here and its output reported, rather
    than the test killed with the output lost and the pair left running beside the next tests."""
    limit = float(os.environ.get("PYTEST_TIMEOUT") or 0)
    return 0.8 * limit if limit > 0 else 600.0


def start_two(script: str, args: list[str], *, python: str = sys.executable,
              cwd: str = fixtures.REPO) -> subprocess.Popen:
    """`script args` started as two processes on the CPU by `python`'s accelerate, output piped as text."""
    return subprocess.Popen([python, *LAUNCH[1:], script, *args], env={**os.environ, **CPU_ENV}, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def workers(started: subprocess.Popen) -> list[psutil.Process]:
    """The processes a started pair's launcher has started (its workers), while they run."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return psutil.Process(started.pid).children(recursive=True)
    return []


def kill(started: subprocess.Popen) -> tuple[str, str]:
    """Kills a started pair, workers and launcher, and returns what it printed (stdout, stderr).

    The workers, not only the launcher: torch's elastic agent starts each in a session of its own,
    where a killed launcher would leave them running (and holding the output pipes open).
    """
    for process in [*workers(started), psutil.Process(started.pid)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return started.communicate()


def launch_two(script: str, args: list[str], *, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Runs `script args` as two processes and returns how it ended, output as text.

    A pair still running after `timeout` seconds (default `timeout_s()`) is killed, launcher and
    workers together, and the test fails with the tail of what they printed.
    """
    timeout = timeout or timeout_s()
    started = start_two(script, args)
    try:
        stdout, stderr = started.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stdout, stderr = kill(started)
        raise AssertionError(f"two processes of {os.path.basename(script)} still ran after {timeout:.0f} s; "
                             f"killed. Their output's start and end:\n{_ends(stdout + stderr)}") from None
    return subprocess.CompletedProcess(started.args, started.returncode, stdout, stderr)


def run_two(script: str, args: list[str]) -> subprocess.CompletedProcess:
    """`launch_two`, failing the test unless both processes exited 0."""
    done = launch_two(script, args)
    if done.returncode != 0:
        raise AssertionError(f"two processes of {os.path.basename(script)} exited {done.returncode}:\n"
                             f"{_ends(done.stderr)}")
    return done


def _ends(output: str, head: int = 1500, tail: int = 3000) -> str:
    """The start and the end of a failed pair's output: the first process to fail prints its cause
    first, and the other's traceback (a peer that closed the connection) would push it out of the end."""
    if len(output) <= head + tail:
        return output
    return f"{output[:head]}\n[... {len(output) - head - tail} characters ...]\n{output[-tail:]}"


@contextlib.contextmanager
def on_the_cpu():
    """This process's training runs use the CPU in fp32 on any host, as the launched pair does."""
    with mock.patch.dict(os.environ, {"ACCELERATE_USE_CPU": "1"}):
        yield
