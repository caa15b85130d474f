"""`--auto_find_batch_size`: the largest per-device batch whose worst-case training step fits in memory."""
from __future__ import annotations

import dataclasses
from typing import Callable, TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, find_executable_batch_size

from t5_training import device
from t5_training.config import TrainingConfig
from t5_training.errors import UsageError
from t5_training.losses import forward_loss_sum

C = TypeVar("C", bound=TrainingConfig)


def find_batch_size(accelerator: Accelerator, config: C, model: torch.nn.Module,
                    make_batch: Callable[[int], dict]) -> C:
    """`--auto_find_batch_size`: the config with the largest per-device batch whose worst-case step fits.

    `make_batch(n)` builds a batch of n rows of the longest lengths the run will see. Tried
    sizes step down through the divisors of --per_device_train_batch_size (accelerate's
    `find_executable_batch_size` with that schedule), and the accumulation steps grow by the
    same factor, so the global batch and the training arithmetic stay exactly the same. The
    probe reserves room for the optimizer state (which the first step allocates), draws no
    random numbers from the run's generators, and every process agrees on the smallest size.
    """
    start = config.per_device_train_batch_size
    if not config.auto_find_batch_size:
        return config
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        # DeepSpeed fixes its micro-batch and accumulation when the engine is built.
        raise UsageError("--auto_find_batch_size does not work under DeepSpeed; set --per_device_train_batch_size "
                         "and --gradient_accumulation_steps yourself (python -m t5_training.memory estimates them)")
    divisors = [d for d in range(start, 0, -1) if start % d == 0]
    trainable = [p for p in model.parameters() if p.requires_grad]
    # AdamW's two fp32 moments per weight; Adafactor's factored state is small enough to ignore.
    state_numel = 0 if config.optim == "adafactor" else 2 * sum(p.numel() for p in trainable)
    model.to(accelerator.device)

    @find_executable_batch_size(starting_batch_size=start,
                                reduce_batch_size_fn=lambda: divisors.pop(1) if len(divisors) > 1 else 0)
    def probe(batch_size: int) -> int:
        reserve = torch.ones(state_numel, device=accelerator.device)  # ones: a CPU allocation must touch its pages
        try:
            batch = {k: v.to(accelerator.device) for k, v in make_batch(batch_size).items()}
            with accelerator.autocast():
                forward_loss_sum(model, batch).backward()
        finally:
            del reserve
            model.zero_grad(set_to_none=True)
        return batch_size

    with device.rng_untouched(accelerator.device):
        try:
            found = probe()
        except RuntimeError as err:
            if "No executable batch size" not in str(err):
                raise
            raise UsageError("even a batch of 1 at the longest lengths runs out of memory: lower "
                             "--max_source_length/--max_target_length, or add --gradient_checkpointing") from None
    found = int(accelerator.gather(torch.tensor([found], device=accelerator.device)).min())
    if found == start:
        return config
    factor = start // found
    accumulation = config.gradient_accumulation_steps * factor
    accelerator.print(f"--auto_find_batch_size: {start} rows per device do not fit; training with {found} rows and "
                      f"--gradient_accumulation_steps {accumulation}, the same global batch")
    return dataclasses.replace(config, per_device_train_batch_size=found, gradient_accumulation_steps=accumulation)
