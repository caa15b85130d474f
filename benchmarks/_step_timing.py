"""Timing of training steps and of the matmul peak, for benchmarks/pretraining_mfu.py: wall time,
and busy time (this process's CPU time over its threads) that other work on a shared machine
does not add to."""
from __future__ import annotations

import math
import time

import torch

from t5_training.step import train_step, window_counts

MATMUL_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_scaled_dot_product")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> tuple[float, float]:
    """(wall, busy) seconds of fn(). Busy is this process's CPU time over its torch threads: time
    the work ran, which other work on a shared machine does not add to (on a GPU, the wall time)."""
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    synchronize(device)
    wall = time.perf_counter() - wall
    return wall, (wall if device.type == "cuda" else (time.process_time() - cpu) / torch.get_num_threads())


def matmul_peak(shapes: list[tuple[int, int, int]], dtype: torch.dtype, device: torch.device,
                seconds_per_shape: float) -> dict:
    """Best FLOP/s of torch.mm at each (m, k, n), by wall and by busy time, over about `seconds_per_shape`."""
    results = {"wall": {}, "busy": {}}
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        torch.mm(a, b)
        best_wall, best_busy, spent = float("inf"), float("inf"), 0.0
        while spent < seconds_per_shape or best_wall == float("inf"):
            wall, busy = timed(lambda: torch.mm(a, b), device)
            best_wall, best_busy, spent = min(best_wall, wall), min(best_busy, busy), spent + wall
        name = f"{m}x{k}@{k}x{n}"
        results["wall"][name] = 2 * m * k * n / best_wall
        results["busy"][name] = 2 * m * k * n / max(best_busy, 1e-9)
    return results


def time_steps(accelerator, model, optimizer, batch: dict, warmup: int, steps: int) -> tuple[list[float], list[float]]:
    """(wall, busy) seconds of each of `steps` training steps after `warmup` untimed ones (see `timed`)."""
    window = [batch]
    walls, busys = [], []
    for step in range(warmup + steps):
        losses = []

        def one_step():
            counts = window_counts(accelerator, window, False)
            losses.append(train_step(accelerator, model, optimizer, window, counts, 1.0, step + 1))

        wall, busy = timed(one_step, accelerator.device)
        if step >= warmup:
            walls.append(wall)
            busys.append(busy)
        if not math.isfinite(float(losses[0])):
            raise SystemExit(f"step {step + 1} was skipped (loss {float(losses[0])}); its time is not a real step's")
    return walls, busys


def profile_step(accelerator, model, optimizer, batch: dict, top: int = 8) -> dict:
    """Top ops by self time over one training step, and the share of time in matmul kernels."""
    from torch.profiler import ProfilerActivity, profile

    cuda = accelerator.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        time_steps(accelerator, model, optimizer, batch, 0, 1)
    attribute = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, attribute) > 0]
    total = sum(getattr(e, attribute) for e in events)
    events.sort(key=lambda e: getattr(e, attribute), reverse=True)
    matmul = sum(getattr(e, attribute) for e in events if e.key.startswith(MATMUL_OPS))
    # torch's optimizers label their step; its total (not self) time covers every op it runs.
    total_attribute = "device_time_total" if cuda else "cpu_time_total"
    optimizer = sum(getattr(e, total_attribute) for e in prof.key_averages() if e.key.startswith("Optimizer.step#"))
    ops = [{"op": e.key, "self_ms": round(getattr(e, attribute) / 1e3, 2),
            "share": round(getattr(e, attribute) / total, 4), "calls": e.count} for e in events[:top]]
    return {"clock": "device" if cuda else "cpu", "total_self_ms": round(total / 1e3, 2),
            "matmul_share": round(matmul / total, 4), "optimizer_share": round(optimizer / total, 4), "top_ops": ops,
            "attention_ops": attention_ops(prof)}


def attention_ops(prof) -> dict[str, int]:
    """Calls of each aten op of scaled_dot_product_attention's that a finished profile recorded,
    forward and backward (aten::_scaled_dot_product_efficient_attention, aten::_efficient_attention_backward,
    aten::_scaled_dot_product_attention_math...): which kernel the device chose."""
    return {e.key: e.count for e in prof.key_averages() if "scaled_dot_product" in e.key or "_attention" in e.key}


def describe_attention(ops: dict[str, int]) -> str:
    """attention_ops as the reports print it, after "attention ran as: "."""
    return ", ".join(f"{op} x{calls}" for op, calls in ops.items()) or "no SDPA op (eager attention)"
