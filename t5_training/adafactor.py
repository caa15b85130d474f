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


def closure_loss(closure):
    """What `step(closure)` returns, as torch.optim's optimizers do: the closure recomputes the loss and
    its gradients, so it runs with autograd on (shared with optim.AdamWScale)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class T5Adafactor(torch.optim.Optimizer):
    """Mesh TensorFlow's Adafactor with T5's defaults; `lr` is the absolute learning rate.

    The schedule (inverse square root from 1e-2 for pretraining, constant 1e-3 for fine-tuning,
    as in T5) comes from the LambdaLR in `t5_training.optim`, not from the optimizer.
    """

    def __init__(self, params, lr: float = 1e-2, *, eps: tuple[float, float] = (1e-30, 1e-3),
                 clipping_threshold: float = 1.0, decay_exponent: float = 0.8,
                 multiply_by_parameter_scale: bool = True, min_dim_size_to_factor: int = MIN_DIM_SIZE_TO_FACTOR,
                 weight_decay: float = 0.0):
        if lr <= 0 or clipping_threshold <= 0 or not 0 < decay_exponent <= 1:
            raise ValueError("T5Adafactor needs lr > 0, clipping_threshold > 0 and 0 < decay_exponent <= 1")
        defaults = {"lr": lr, "eps": eps, "clipping_threshold": clipping_threshold, "decay_exponent": decay_exponent,
                    "multiply_by_parameter_scale": multiply_by_parameter_scale,
                    "min_dim_size_to_factor": min_dim_size_to_factor, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def step(self, closure=None):
        loss = closure_loss(closure)
        # A with block, not @torch.no_grad(): mutmut does not mutate decorated functions.
        with torch.no_grad():
            for group in self.param_groups:
                eps1, eps2 = group["eps"]
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    state = self.state[p]
                    dims = factored_dims(p.shape, group["min_dim_size_to_factor"])
                    if not state:
                        state["step"] = 0
                        if dims:
                            # R keeps the second-largest dimension (the mean over the largest); C the
                            # largest. Stored with the reduced dimension kept, so they broadcast.
                            state["row"] = torch.zeros_like(p, dtype=torch.float32).mean(dim=dims[0], keepdim=True)
                            state["col"] = torch.zeros_like(p, dtype=torch.float32).mean(dim=dims[1], keepdim=True)
                        else:
                            state["second_moment"] = torch.zeros_like(p, dtype=torch.float32)
                    state["step"] += 1
                    # Computed in fp32 whatever the weights' dtype, as Mesh TF's to_float does.
                    grad = p.grad.float()
                    value = p.float()
                    decay = 1.0 - state["step"] ** -group["decay_exponent"]
                    # In place wherever possible: the step's peak is one extra copy of the tensor.
                    grad_sq = grad.square().add_(eps1)
                    if dims:
                        row, col = state["row"], state["col"]
                        row.mul_(decay).add_(grad_sq.mean(dim=dims[0], keepdim=True), alpha=1 - decay)
                        col.mul_(decay).add_(grad_sq.mean(dim=dims[1], keepdim=True), alpha=1 - decay)
                        del grad_sq
                        update = (row / row.mean(dim=dims[1], keepdim=True)).rsqrt_() * col.rsqrt()
                    else:
                        second = state["second_moment"]
                        second.mul_(decay).add_(grad_sq, alpha=1 - decay)
                        del grad_sq
                        update = second.rsqrt()
                    update.mul_(grad)
                    update.div_((_rms(update) / group["clipping_threshold"]).clamp_(min=1.0))
                    scale = group["lr"]
                    if group["multiply_by_parameter_scale"]:
                        # A tensor, not a float: reading it on the host would stall a GPU per tensor.
                        scale = _rms(value).clamp_(min=eps2) * group["lr"]
                    if group["weight_decay"]:
                        value.mul_(1 - group["lr"] * group["weight_decay"])
                    value.sub_(update.mul_(scale))
                    p.copy_(value)
            return loss
