"""The optimizer's share of a training step's memory, for the memory estimator (tools/memory.py):
its state per trainable tensor, and what its step allocates beyond weights, gradients and state."""
from __future__ import annotations

import math

import torch

from t5_training.adafactor import factored_dims
from t5_training.foreach import foreach_chunks
from t5_training.optim import takes_weight_decay


def state_bytes(shapes: list[tuple[int, ...]], optim: str, flat: bool) -> int:
    """Bytes of optimizer state for these trainable tensors (fp32)."""
    if optim in ("adamw_torch", "adamw_scale"):
        return 8 * sum(math.prod(s) for s in shapes)  # exp_avg and exp_avg_sq
    if flat:
        return 4 * sum(math.prod(s) for s in shapes)  # a 1-D partition: no factoring
    total = 0
    for shape in shapes:
        # No first moment in either Adafactor. T5's factors a tensor only where its two largest
        # dimensions are both >= 128 (a mean over each); HF's factors every matrix over its last two.
        dims = factored_dims(torch.Size(shape)) if optim == "adafactor" else (
            (len(shape) - 1, len(shape) - 2) if len(shape) >= 2 else None)
        n = math.prod(shape)
        total += 4 * (n // shape[dims[0]] + n // shape[dims[1]] if dims else n)
    return total


def step_temporaries(optim: str, device: str, zero_stage: int, largest: int, chunk: int, partition: int) -> int:
    """Bytes an optimizer step allocates beyond weights, gradients and state (measured on a CPU).

    optim.py builds fused AdamW outside DeepSpeed: one kernel in place, nothing extra. DeepSpeed
    drives an unfused client AdamW over its flat partition: foreach on a GPU (one copy of it),
    per tensor on a CPU (two). T5's Adafactor and adamw_scale step a chunk of tensors at a time on
    a GPU (foreach.foreach_chunks) and hold one copy of it at their peak; one tensor at a time on
    a CPU, holding one copy of the tensor they are updating. HF's Adafactor holds two, on either.
    """
    if optim == "adamw_torch":
        if not zero_stage:
            return 0
        return 4 * partition * (1 if device == "cuda" else 2)
    if device == "cuda" and optim != "adafactor_hf":
        return 4 * chunk
    return 4 * largest * (2 if optim == "adafactor_hf" else 1)


def largest_chunk(shapes: dict[str, tuple[int, ...]], learn: list[str]) -> int:
    """Elements in the largest chunk a foreach step updates at once: chunks form within each of
    optim.build_optimizer's two groups, in the model's order."""
    groups = ([n for n in learn if takes_weight_decay(n, len(shapes[n]))],
              [n for n in learn if not takes_weight_decay(n, len(shapes[n]))])
    sizes = [[math.prod(shapes[n]) for n in group] for group in groups]
    return max(sum(numels[i] for i in chunk) for numels in sizes for chunk in foreach_chunks(numels))
