"""Optimizers and learning-rate schedules, chosen by `--optim` and `--lr_scheduler_type`.

Every schedule is a multiplier on `--learning_rate` (a `LambdaLR`), so the peak learning rate
is always the number the user typed, and a schedule is a pure function of the step: nothing
but the step count has to be checkpointed to resume it.
"""
from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import torch

from t5_training.adafactor import T5Adafactor
from t5_training.config import TrainingConfig
from t5_training.errors import UsageError
from t5_training.foreach import ForeachOptimizer, kept_or_one

if TYPE_CHECKING:
    from accelerate.utils import DummyOptim


def build_optimizer(model: torch.nn.Module, config: TrainingConfig,
                    deepspeed_config: dict | None = None) -> torch.optim.Optimizer | DummyOptim:
    """AdamW, AdamW with RMS-scaled steps, T5's Adafactor or HF's over the trainable parameters.

    Weight decay skips layer-norm scales and biases: decaying them towards zero changes what
    the layer computes rather than regularizing it. Under DeepSpeed (`deepspeed_config`, the
    active plugin's config) the optimizer built here runs as ZeRO's client optimizer, unless
    the config has an "optimizer" block: then DeepSpeed builds it (see `_deepspeed_optimizer`).
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if takes_weight_decay(name, param.ndim) else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    if deepspeed_config and "optimizer" in deepspeed_config:
        return _deepspeed_optimizer(groups, config, deepspeed_config)
    if config.optim == "adamw_scale":
        return AdamWScale(groups, lr=config.resolved_learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                          eps=config.adam_epsilon)
    if config.optim == "adafactor":
        return T5Adafactor(groups, lr=config.resolved_learning_rate)
    if config.optim == "adafactor_hf":
        # HF's external-lr variant: every matrix factored, and no parameter scaling, so each
        # weight moves by about lr in absolute terms whatever its scale. Not T5's recipe.
        # Imported here: transformers.optimization pulls in the Trainer's utilities and peft (~1.5 s).
        from transformers.optimization import Adafactor

        return Adafactor(groups, lr=config.resolved_learning_rate, scale_parameter=False, relative_step=False,
                         warmup_init=False)
    # Fused: one kernel per step instead of a dozen passes over the weights (about 25% less
    # optimizer time on a CPU, more on a GPU), and it can skip a non-finite step on the device
    # (see step.train_step). DeepSpeed's ZeRO optimizer drives the client optimizer itself.
    fused = deepspeed_config is None and all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=config.resolved_learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                             eps=config.adam_epsilon, fused=fused)


def takes_weight_decay(name: str, ndim: int) -> bool:
    """Whether a parameter goes in the weight-decay group: matrices, not layer-norm scales or biases."""
    return ndim >= 2 and "layer_norm" not in name


def _deepspeed_optimizer(groups: list[dict], config: TrainingConfig, deepspeed_config: dict) -> DummyOptim:
    """The placeholder accelerate requires when the DeepSpeed config defines the optimizer.

    That is how ZeRO-Offload gets DeepSpeed's CPU Adam. accelerate fills the block's "auto" lr
    from the placeholder, and DeepSpeed keeps our weight-decay groups. The flags must still
    tell the truth about the run: the block has to be AdamW with the flags' betas and eps
    (accelerate cannot fill "auto" for those two), and a "scheduler" block would fight the
    script's own schedule, which sets the learning rate at every step.
    """
    if "scheduler" in deepspeed_config:
        raise UsageError('the DeepSpeed config has a "scheduler" block, but --lr_scheduler_type schedules the '
                         'learning rate here; remove the block')
    if config.optim != "adamw_torch":
        raise UsageError(f'--optim {config.optim} cannot run with a DeepSpeed config that has an "optimizer" block '
                         "(DeepSpeed builds that optimizer); remove the block to run it as ZeRO's client optimizer, "
                         "or pass --optim adamw_torch")
    block = deepspeed_config["optimizer"]
    params = block.get("params", {})
    if str(block.get("type", "")).lower() not in ("adam", "adamw") or params.get("adam_w_mode") is False:
        raise UsageError(f'--optim adamw_torch means AdamW, but the DeepSpeed config\'s optimizer is '
                         f'{json.dumps(block.get("type"))}; use "type": "AdamW"')
    # A key left out takes DeepSpeed's default, which would silently override the flag. The
    # groups carry their own weight decay, so the block's weight_decay never applies.
    flags = {"lr": (config.resolved_learning_rate, 1e-3, "--learning_rate"),
             "betas": ([config.adam_beta1, config.adam_beta2], [0.9, 0.999], "--adam_beta1 --adam_beta2"),
             "eps": (config.adam_epsilon, 1e-8, "--adam_epsilon")}
    for key, (value, default, flag) in flags.items():
        given = params.get(key, default)
        if not (key == "lr" and given == "auto") and not _same_numbers(given, value):
            raise UsageError(f'the DeepSpeed config\'s optimizer has "{key}": {json.dumps(given)} but {flag} '
                             f'gives {json.dumps(value)}; make them agree ("auto" works for lr only)')
    # Imported here: accelerate.utils has DummyOptim only where DeepSpeed is installed, an optional extra.
    from accelerate.utils import DummyOptim

    return DummyOptim(groups, lr=config.resolved_learning_rate, weight_decay=config.weight_decay)


def _same_numbers(a, b) -> bool:
    a, b = (list(x) if isinstance(x, (list, tuple)) else [x] for x in (a, b))
    try:
        return len(a) == len(b) and all(math.isclose(float(x), float(y), rel_tol=1e-9) for x, y in zip(a, b))
    except (TypeError, ValueError):
        return False


class AdamWScale(ForeachOptimizer):
    """AdamW whose step for each tensor is scaled by that tensor's root-mean-square.

    Adafactor's relative step size on top of Adam's moments (nanoT5 pretrains T5 this way):
    a tensor of large weights takes proportionally larger steps, so one learning rate suits
    embeddings and layer norms alike. The scale is floored at 1e-3 so that tensors starting
    near zero still move. Weight decay is decoupled, as in AdamW, and not scaled.

    `foreach` (ForeachOptimizer; by default on a GPU) updates a group's tensors together with
    torch's multi-tensor ops, in chunks (foreach.foreach_chunks); `foreach=False` is the same
    update one tensor at a time, the reference the tests hold it to.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0,
                 foreach: bool | None = None):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                                  "foreach": foreach})

    def initial_state(self, p: torch.Tensor, group: dict) -> dict:
        return {"exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}

    def update_each(self, group: dict, params: list[torch.Tensor], states: list[dict], keep: torch.Tensor) -> None:
        beta1, beta2 = group["betas"]
        # beta on an applied step, 1 on a skipped one, whose gradients are zero: the moments stay.
        decay1, decay2 = kept_or_one(beta1, keep), kept_or_one(beta2, keep)
        shrink = kept_or_one(1 - group["lr"] * group["weight_decay"], keep)
        step_sizes, corrections2 = _bias_corrections(states, group, keep)
        for p, state, step_size, correction2 in zip(params, states, step_sizes, corrections2):
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.mul_(decay1).add_(p.grad, alpha=1 - beta1)
            exp_avg_sq.mul_(decay2).addcmul_(p.grad, p.grad, value=1 - beta2)
            update = (exp_avg_sq / correction2).sqrt_().add_(group["eps"])
            # Kept on the device: .item() here would stall a GPU once per tensor per step. A norm
            # rather than pow(2).mean(): no temporary the size of the tensor.
            rms = (torch.linalg.vector_norm(p.float()) / p.numel() ** 0.5).clamp_(min=1e-3).to(p.dtype)
            if group["weight_decay"]:
                p.mul_(shrink)
            # exp_avg / denom * rms in the denominator's memory: one temporary the size of the tensor,
            # freed before the next tensor's.
            p.addcmul_(update.reciprocal_().mul_(exp_avg).mul_(rms), step_size)
            del update

    def update_together(self, group: dict, params: list[torch.Tensor], states: list[dict],
                        keep: torch.Tensor) -> None:
        # update_each's update, each line over the chunk's tensors at once; one temporary per tensor.
        beta1, beta2 = group["betas"]
        step_sizes, corrections2 = _bias_corrections(states, group, keep)
        grads = [p.grad for p in params]
        exp_avgs, exp_avg_sqs = [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states]
        torch._foreach_mul_(exp_avgs, kept_or_one(beta1, keep))
        torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, kept_or_one(beta2, keep))
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        updates = torch._foreach_div(exp_avg_sqs, corrections2)
        torch._foreach_sqrt_(updates)
        torch._foreach_add_(updates, group["eps"])
        torch._foreach_reciprocal_(updates)
        torch._foreach_mul_(updates, exp_avgs)  # exp_avg / denom, in the denominators' memory
        rms = torch._foreach_norm([p.float() for p in params])
        torch._foreach_div_(rms, [p.numel() ** 0.5 for p in params])
        torch._foreach_clamp_min_(rms, 1e-3)
        torch._foreach_mul_(updates, [r.to(p.dtype) for r, p in zip(rms, params)])
        torch._foreach_mul_(updates, step_sizes)
        if group["weight_decay"]:
            torch._foreach_mul_(params, kept_or_one(1 - group["lr"] * group["weight_decay"], keep))
        torch._foreach_add_(params, updates)


def _bias_corrections(states: list[dict], group: dict, keep: torch.Tensor) -> tuple[list, list]:
    """Each tensor's step size, -lr / (1 - beta1^t) (0 on a skipped step, whose moments would
    otherwise still move the weights), and 1 - beta2^t; t is at least 1, as a tensor whose first
    step is skipped still counts 0."""
    beta1, beta2 = group["betas"]
    steps = torch._foreach_clamp_min([state["step"] for state in states], 1.0)
    step_sizes = torch._foreach_pow(beta1, steps)
    torch._foreach_sub_(step_sizes, 1.0)  # beta1^t - 1, so that the reciprocal below carries lr's sign
    torch._foreach_reciprocal_(step_sizes)
    torch._foreach_mul_(step_sizes, keep * group["lr"])
    corrections2 = torch._foreach_pow(beta2, steps)
    torch._foreach_neg_(corrections2)
    torch._foreach_add_(corrections2, 1.0)
    return step_sizes, corrections2


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
        optimizer, lambda step: lr_multiplier(config.resolved_lr_scheduler_type, step, warmup, total_steps)
    )
