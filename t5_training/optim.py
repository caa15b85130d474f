"""Optimizers and learning-rate schedules, chosen by `--optim` and `--lr_scheduler_type`.

Every schedule is a multiplier on `--learning_rate` (a `LambdaLR`), so the peak learning rate
is always the number the user typed, and a schedule is a pure function of the step: nothing
but the step count has to be checkpointed to resume it.
"""
from __future__ import annotations

import math

import torch
from transformers.optimization import Adafactor

from t5_training.config import TrainingConfig


def build_optimizer(model: torch.nn.Module, config: TrainingConfig) -> torch.optim.Optimizer:
    """AdamW or Adafactor over the trainable parameters.

    Weight decay skips layer-norm scales and biases: decaying them towards zero changes what
    the layer computes rather than regularizing it.
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or "layer_norm" in name else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if config.optim == "adafactor":
        # T5's settings: an external learning rate, no parameter scaling, no built-in warmup.
        return Adafactor(groups, lr=config.learning_rate, scale_parameter=False, relative_step=False,
                         warmup_init=False)
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_epsilon)


def warmup_steps(config: TrainingConfig, total_steps: int) -> int:
    """`--warmup_steps` if set, else `--warmup_ratio` of the run (rounded up)."""
    if config.warmup_steps > 0:
        return config.warmup_steps
    # Round away float noise first: 0.07 * 100 is 7.000000000000001, which must give 7, not 8.
    return math.ceil(round(config.warmup_ratio * total_steps, 6))


def lr_multiplier(kind: str, step: int, warmup: int, total: int) -> float:
    """The schedule: the fraction of the peak learning rate used for optimizer step `step`."""
    if kind == "inverse_sqrt":
        # T5: lr is proportional to 1/sqrt(max(step, warmup)), flat at the peak during warmup.
        return math.sqrt(max(warmup, 1) / max(step, warmup, 1))
    if kind == "constant":
        return 1.0
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if kind == "constant_with_warmup":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "linear":
        return max(0.0, 1.0 - progress)
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    raise ValueError(f"unknown schedule {kind!r}")


def build_scheduler(optimizer, config: TrainingConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = warmup_steps(config, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(config.lr_scheduler_type, step, warmup, total_steps)
    )
