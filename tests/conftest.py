"""Settings for the whole test session: the cores are shared out between the pytest-xdist workers.

Each worker (and every training process a test starts, which inherits the environment) gets
cores / workers OpenMP threads. Left at torch's default, two workers on two cores run four
threads, and a thread that waits at the end of a parallel region for one that was descheduled
stalls the whole step: measured here, a t5-small step took 7-20 s instead of 2 s. An explicit
OMP_NUM_THREADS is kept.

The suite runs on the CPU on any host: GPUs are hidden from the test processes and every process
they start, unless T5_TRAINING_TEST_DEVICE=cuda asks for them (docs/development.md). Otherwise a
GPU host would train some tests' runs on the GPU in bf16 against tolerances set for fp32, and one
process would mix `Accelerator(cpu=True)` with GPU Accelerators, which accelerate refuses.
"""
import os

if os.environ.get("T5_TRAINING_TEST_DEVICE") != "cuda":
    # Read when CUDA first starts, not when torch is imported; nothing has started it before the
    # conftest (tests/__init__.py, imported first, does not import torch).
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
else:
    # cuBLAS reads it when it starts: tests that compare GPU runs bitwise turn on torch's
    # deterministic algorithms (fixtures.deterministic_kernels), which need a fixed workspace.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))

if _WORKERS > 1:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    _threads = str(max(1, _cores // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _threads)
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

    import torch  # noqa: E402  (after the variables, which torch reads when it starts its thread pool)

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _unfreeze_after_run_cli():
    # run_cli freezes every object at a script's end (its process is about to exit); a test that
    # calls it in the test process must not leave them frozen, or no later collection frees them.
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _fresh_accelerate_state():
    # accelerate keeps one state per process (device, precision, compile settings) and ignores or
    # refuses a later Accelerator's other settings; each test starts as a new process would.
    yield
    from tests import fixtures  # here, not at the top: the variables above come before any import of torch

    fixtures.reset_accelerate_state()
