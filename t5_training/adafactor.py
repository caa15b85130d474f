"""Adafactor as T5 trains with it: Mesh TensorFlow's `AdafactorOptimizer` with its defaults.

T5's pretraining and fine-tuning (t5/models/gin) use Mesh TF's Adafactor unchanged, whose
defaults differ from HF's `transformers.optimization.Adafactor` in ways that change results:

- each update is multiplied by the parameter's own RMS (floored at eps2 = 1e-3), so at
  lr 1e-2 a weight matrix moves by about 1% of its scale per step, whatever its init scale;
  HF's `scale_parameter=False` instead moves every weight by about lr in absolute terms,
  180% of a freshly initialised t5-small query matrix's norm at 1e-2;
- the second moment is factored (row and column means) only where the two largest dimensions
  are both at least `min_dim_size_to_factor` = 128; HF factors every matrix, so T5's relative
  attention bias (32 x heads) gets a rank-1 estimate there;
- the parameter scale is computed on the device, so a step never waits for the host.

For a tensor of step t (counting from 1), with g its gradient and x its current value:
    beta2 = 1 - t^-0.8                                    (0 at the first step)
    V     = beta2 V + (1 - beta2) (g^2 + eps1)            (or the row and column means of it)
    u     = g / sqrt(V)                                   (factored: V = R C^T / mean(R))
    u     = u / max(1, RMS(u) / clipping_threshold)
    x     = x - lr * max(RMS(x), eps2) * u
There is no first moment (beta1 = 0) and no weight decay unless asked for.
"""
from __future__ import annotations

import torch

from t5_training.foreach import ForeachOptimizer, kept_or_one

MIN_DIM_SIZE_TO_FACTOR = 128


def factored_dims(shape: torch.Size, min_dim_size: int = MIN_DIM_SIZE_TO_FACTOR) -> tuple[int, int] | None:
    """The two largest dimensions (largest first) whose second moment is factored, or None.

    As Mesh TF's `_factored_dims`: a tensor is factored when it has at least two dimensions and
    its second-largest one is at least `min_dim_size`. Ties keep the earlier dimension first.
    """
    if len(shape) < 2:
        return None
    order = sorted(range(len(shape)), key=lambda d: -shape[d])
    if shape[order[1]] < min_dim_size:
        return None
    return order[0], order[1]


def _rms(x: torch.Tensor) -> torch.Tensor:
    # A norm rather than x.pow(2).mean(): no temporary the size of x.
    return torch.linalg.vector_norm(x) / x.numel() ** 0.5


class T5Adafactor(ForeachOptimizer):
    """Mesh TensorFlow's Adafactor with T5's defaults; `lr` is the absolute learning rate.

    The schedule (inverse square root from 1e-2 for pretraining, constant 1e-3 for fine-tuning,
    as in T5) comes from the LambdaLR in `t5_training.optim`, not from the optimizer.

    `foreach` (ForeachOptimizer; by default on a GPU) updates a group's tensors together with
    torch's multi-tensor ops, a few kernels a step instead of about twenty a tensor; only the
    factored moments' row and column means stay one tensor at a time. `foreach=False` is the
    same update one tensor at a time, the reference the tests hold it to.
    """

    def __init__(self, params, lr: float = 1e-2, *, eps: tuple[float, float] = (1e-30, 1e-3),
                 clipping_threshold: float = 1.0, decay_exponent: float = 0.8,
                 multiply_by_parameter_scale: bool = True, min_dim_size_to_factor: int = MIN_DIM_SIZE_TO_FACTOR,
                 weight_decay: float = 0.0, foreach: bool | None = None):
        if lr <= 0 or clipping_threshold <= 0 or not 0 < decay_exponent <= 1:
            raise ValueError("T5Adafactor needs lr > 0, clipping_threshold > 0 and 0 < decay_exponent <= 1")
        defaults = {"lr": lr, "eps": eps, "clipping_threshold": clipping_threshold, "decay_exponent": decay_exponent,
                    "multiply_by_parameter_scale": multiply_by_parameter_scale,
                    "min_dim_size_to_factor": min_dim_size_to_factor, "weight_decay": weight_decay,
                    "foreach": foreach}
        super().__init__(params, defaults)

    def initial_state(self, p: torch.Tensor, group: dict) -> dict:
        dims = factored_dims(p.shape, group["min_dim_size_to_factor"])
        if not dims:
            return {"second_moment": torch.zeros_like(p, dtype=torch.float32)}
        # R keeps the second-largest dimension (the mean over the largest); C the largest.
        # Stored with the reduced dimension kept, so they broadcast.
        return {"row": torch.zeros_like(p, dtype=torch.float32).mean(dim=dims[0], keepdim=True),
                "col": torch.zeros_like(p, dtype=torch.float32).mean(dim=dims[1], keepdim=True)}

    def update_each(self, group: dict, params: list[torch.Tensor], states: list[dict], keep: torch.Tensor) -> None:
        eps1, eps2 = group["eps"]
        weights, decays = _moment_rates(states, group["decay_exponent"], keep)
        lift = 1 - keep  # see _factored_update
        shrink = kept_or_one(1 - group["lr"] * group["weight_decay"], keep)
        for p, state, weight, decay in zip(params, states, weights, decays):
            dims = factored_dims(p.shape, group["min_dim_size_to_factor"])
            # Computed in fp32 whatever the weights' dtype, as Mesh TF's to_float does.
            grad = p.grad.float()
            value = p.float()
            # In place wherever possible: the step's peak is one extra copy of the tensor.
            grad_sq = grad.square().add_(eps1)
            if dims:
                means = _means(grad_sq, dims)
                del grad_sq
                update = _factored_update(state, dims, means, weight, decay, lift)
            else:
                second = state["second_moment"]
                second.mul_(decay).addcmul_(grad_sq, weight)
                del grad_sq
                update = second.add(lift).rsqrt_()
            update.mul_(grad)
            update.div_((_rms(update) / group["clipping_threshold"]).clamp_(min=1.0))
            scale = group["lr"]
            if group["multiply_by_parameter_scale"]:
                # A tensor, not a float: reading it on the host would stall a GPU per tensor.
                scale = _rms(value).clamp_(min=eps2) * group["lr"]
            if group["weight_decay"]:
                value.mul_(shrink)
            value.sub_(update.mul_(scale))
            p.copy_(value)
            # Freed here, not when the next tensor's update replaces it: the step's peak stays one
            # copy of the largest tensor instead of two.
            del update

    def update_together(self, group: dict, params: list[torch.Tensor], states: list[dict],
                        keep: torch.Tensor) -> None:
        # update_each's update, each line over the group's tensors at once.
        eps1, eps2 = group["eps"]
        dims = [factored_dims(p.shape, group["min_dim_size_to_factor"]) for p in params]
        grads = [p.grad.float() for p in params]
        values = [p.float() for p in params]  # the weights themselves where they are fp32
        weights, decays = _moment_rates(states, group["decay_exponent"], keep)
        lift = 1 - keep  # see _factored_update
        grad_sq = torch._foreach_mul(grads, grads)
        torch._foreach_add_(grad_sq, eps1)
        # As in the loop, the squared gradients are gone before the updates take their place: the
        # chunk's temporaries peak at one copy of it.
        means = [_means(g, d) if d else None for g, d in zip(grad_sq, dims)]
        whole = [i for i, d in enumerate(dims) if not d]
        seconds = [states[i]["second_moment"] for i in whole]
        if whole:
            torch._foreach_mul_(seconds, [decays[i] for i in whole])
            new = [grad_sq[i] for i in whole]
            torch._foreach_mul_(new, [weights[i] for i in whole])
            torch._foreach_add_(seconds, new)
            del new
        del grad_sq
        updates = [_factored_update(state, d, m, weight, decay, lift) if d else None
                   for state, d, m, weight, decay in zip(states, dims, means, weights, decays)]
        if whole:
            # A list, as in ForeachOptimizer.step, so that nothing is read on the host.
            lifted = torch._foreach_add(seconds, [lift] * len(seconds))
            torch._foreach_rsqrt_(lifted)
            for i, update in zip(whole, lifted):
                updates[i] = update
        torch._foreach_mul_(updates, grads)
        roots = [p.numel() ** 0.5 for p in params]
        clip = torch._foreach_norm(updates)
        torch._foreach_div_(clip, roots)
        torch._foreach_div_(clip, group["clipping_threshold"])
        torch._foreach_clamp_min_(clip, 1.0)
        torch._foreach_div_(updates, clip)
        if group["multiply_by_parameter_scale"]:
            scales = torch._foreach_norm(values)
            torch._foreach_div_(scales, roots)
            torch._foreach_clamp_min_(scales, eps2)
            torch._foreach_mul_(scales, group["lr"])
            torch._foreach_mul_(updates, scales)
        else:
            torch._foreach_mul_(updates, group["lr"])
        if group["weight_decay"]:
            torch._foreach_mul_(values, kept_or_one(1 - group["lr"] * group["weight_decay"], keep))
        torch._foreach_sub_(values, updates)
        for p, value in zip(params, values):
            if value is not p:
                p.copy_(value)


def _moment_rates(states: list[dict], decay_exponent: float,
                  keep: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each tensor's weight of the new squared gradient, 1 - beta2 = t^-decay_exponent at its step t
    (1 at the first; 0 on a skipped step), and the old moment's, beta2 = 1 - that weight.

    Mesh TF's decay rate is 1 - t^-0.8 of the global step, which is every tensor's step here but
    a tensor's that misses steps. A tensor whose first step is skipped still counts 0: as 1 here.
    """
    weights = torch._foreach_clamp_min([state["step"] for state in states], 1.0)
    torch._foreach_pow_(weights, -decay_exponent)
    torch._foreach_mul_(weights, keep)
    decays = torch._foreach_neg(weights)
    torch._foreach_add_(decays, 1.0)
    return weights, decays


def _means(grad_sq: torch.Tensor, dims: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The squared gradient's means over its largest and its second-largest dimension."""
    return grad_sq.mean(dim=dims[0], keepdim=True), grad_sq.mean(dim=dims[1], keepdim=True)


def _factored_update(state: dict, dims: tuple[int, int], means: tuple[torch.Tensor, torch.Tensor],
                     weight: torch.Tensor, decay: torch.Tensor, lift: torch.Tensor) -> torch.Tensor:
    """Advances the factored second moment (R and C, from `_means`; see _moment_rates) and returns
    1 / sqrt(V).

    On a skipped step the moments stay as they were and the gradient is zero, so the update is
    too, unless the moments are still zero (a tensor's skipped first step), where 0 / 0 would make
    it NaN: `lift`, 1 - keep (0 on an applied step), is added to them for the division.
    """
    row, col = state["row"], state["col"]
    row.mul_(decay).addcmul_(means[0], weight)
    col.mul_(decay).addcmul_(means[1], weight)
    return ((row + lift) / (row.mean(dim=dims[1], keepdim=True) + lift)).rsqrt_() * (col + lift).rsqrt_()
