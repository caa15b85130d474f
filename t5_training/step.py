"""One optimizer step, the unit t5x tests alone: count the window, accumulate, clip, apply, guard.

A step takes a window of micro-batches (one whole accumulation cycle on this process). The
window's token counts are all-reduced first, so the loss and gradient are exactly those of the
token mean over every micro-batch on every process (see loop.py's docstring for why). The step
reads nothing back to the host: a non-finite step is skipped on the device where the optimizer
allows it, and the loop reads the losses in batches at logging time, where `guard_nonfinite`
counts the skipped steps.
"""
from __future__ import annotations

import math

import torch
from accelerate.utils import DistributedType

from t5_training import losses
from t5_training.config import TrainingConfig
from t5_training.errors import DivergedError
from t5_training.foreach import ForeachOptimizer
from t5_training.interrupts import kill_point


def window_counts(accelerator, window: list[dict], stop_requested: bool) -> torch.Tensor:
    """[target tokens, samples, input + target tokens, processes asked to stop] of a window, summed over processes.

    One all-reduce per step, which also tells every process whether any of them received a
    preemption signal, so that all stop after the same step.
    """
    targets = sum((b["labels"] != -100).sum() for b in window)
    inputs = sum(b["attention_mask"].sum() for b in window)
    # torch.full writes the numbers on the device; torch.tensor would copy them from the host, which on
    # a GPU waits for the work queued before it: a host sync every step.
    samples = torch.full((), sum(len(b["input_ids"]) for b in window), device=accelerator.device)
    stop = torch.full((), int(stop_requested), device=accelerator.device)
    local = torch.stack([targets, samples, inputs + targets, stop]).double()
    # No mutants: accelerate's reduce sums for any reduction but "mean" and "max", and "sum" is its default.
    return accelerator.reduce(local, reduction="sum")  # pragma: no mutate


def train_step(accelerator, model, optimizer, window: list[dict], counts: torch.Tensor, max_grad_norm: float,
                step: int) -> torch.Tensor:
    """One optimizer step over a window of micro-batches, skipped if the loss or gradients are not finite.

    Returns the token-mean loss as a device tensor, NaN when the step was skipped; nothing is
    read back to the host. Fused AdamW (fine-tuning's default), T5's Adafactor (pretraining's) and
    adamw_scale skip on the device itself, given the verdict as `found_inf`, the mechanism
    GradScaler uses; other optimizers (unfused AdamW, HF's Adafactor) cannot, so for them the
    verdict is read before stepping, one host sync per step. The verdict is
    the same on every process because the loss and the gradient norm are all-reduced values.
    """
    total_tokens = counts[0].float()
    # accelerator.backward divides by the accumulation steps and DDP averages over processes;
    # undo both so the gradient is exactly that of the token mean over the whole window.
    scale = accelerator.gradient_accumulation_steps * accelerator.num_processes / total_tokens
    loss_sum = torch.zeros((), device=accelerator.device)
    for micro, batch in enumerate(window, start=1):
        with accelerator.accumulate(model):
            batch_loss = losses.forward_loss_sum(model, batch)
            accelerator.backward(batch_loss * scale)
        loss_sum += batch_loss.detach()
        kill_point("micro", step, micro)
    # The window's last micro-batch synchronised the gradients (a window is one whole
    # accumulation cycle), so the optimizer wrapper below really steps.
    # No mutants, for its reduction's sake as in window_counts (the tests would catch the division's).
    loss = accelerator.reduce(loss_sum, reduction="sum") / total_tokens  # pragma: no mutate
    # Clipping at infinity still measures the norm, which catches inf/NaN gradients of a finite
    # loss. Under DeepSpeed the step already ran inside the last backward: the engine clipped
    # (at --max_grad_norm, see build_accelerator), skipped the update if the gradients were not
    # finite, and reports that step's norm here (inf when skipped; None in older accelerate),
    # so the verdict below matches what DeepSpeed did and its optimizer.step() is a no-op.
    norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else math.inf)
    norm = torch.as_tensor(0.0 if norm is None else norm, device=loss.device)
    # With fp16, accelerate's GradScaler skips overflowing steps itself, and must see them to
    # lower its scale: only a non-finite loss is skipped here.
    finite = torch.isfinite(loss) if accelerator.scaler is not None else torch.isfinite(loss) & torch.isfinite(norm)
    inner = getattr(optimizer, "optimizer", optimizer)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        optimizer.step()
    elif _skips_on_device(inner, accelerator):
        inner.found_inf = (~finite).float()
        optimizer.step()
    elif bool(finite):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return torch.where(finite, loss, torch.full_like(loss, math.nan))


def _skips_on_device(optimizer, accelerator) -> bool:
    # Fused Adam(W), T5's Adafactor and adamw_scale read `found_inf` and leave weights, moments and
    # step counts untouched when it is 1. Under fp16 the GradScaler owns that attribute.
    fused_adam = isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW) and optimizer.defaults.get("fused")
    return bool(fused_adam or isinstance(optimizer, ForeachOptimizer)) and accelerator.scaler is None


def guard_nonfinite(accelerator, config: TrainingConfig, state, step: int, applied: bool) -> None:
    """Counts skipped (non-finite) steps in a row; after --max_nonfinite_steps, stops naming the likely cause."""
    if applied:
        state.nonfinite_in_a_row = 0
        return
    state.nonfinite_in_a_row += 1
    accelerator.print(f"step {step}: non-finite loss or gradients; step skipped, weights unchanged")
    limit = config.max_nonfinite_steps
    if limit and state.nonfinite_in_a_row >= limit:
        if accelerator.mixed_precision == "fp16":
            cause = "T5 overflows in fp16 (its feed-forward activations exceed 65504): use --mixed_precision bf16"
        else:
            cause = (f"the learning rate is likely too high for this model and batch: lower --learning_rate "
                     f"(now {config.resolved_learning_rate:g}) or raise --warmup_steps")
        raise DivergedError(f"the loss was not finite for {state.nonfinite_in_a_row} steps in a row (up to step "
                            f"{step}); {cause}. Checkpoints saved before that are intact")
