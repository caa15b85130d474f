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
    """AdamW, AdamW with RMS-scaled steps, or Adafactor over the trainable parameters.

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
    if config.optim == "adamw_scale":
        return AdamWScale(groups, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                          eps=config.adam_epsilon)
    if config.optim == "adafactor":
        # T5's settings: an external learning rate, no parameter scaling, no built-in warmup.
        return Adafactor(groups, lr=config.learning_rate, scale_parameter=False, relative_step=False,
                         warmup_init=False)
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_epsilon)


class AdamWScale(torch.optim.Optimizer):
    """AdamW whose step for each tensor is scaled by that tensor's root-mean-square.

    Adafactor's relative step size on top of Adam's moments (nanoT5 pretrains T5 this way):
    a tensor of large weights takes proportionally larger steps, so one learning rate suits
    embeddings and layer norms alike. The scale is floored at 1e-3 so that tensors starting
    near zero still move. Weight decay is decoupled, as in AdamW, and not scaled.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                bias1 = 1 - beta1 ** state["step"]
                bias2 = 1 - beta2 ** state["step"]
                denom = (exp_avg_sq / bias2).sqrt_().add_(group["eps"])
                # Kept on the device: .item() here would stall a GPU once per tensor per step.
                rms = p.float().pow(2).mean().sqrt().clamp_(min=1e-3).to(p.dtype)
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(exp_avg / denom * rms, alpha=-group["lr"] / bias1)
        return loss


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
