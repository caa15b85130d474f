"""Evaluation of a model whose weights are sharded across the processes (DeepSpeed ZeRO-3, FSDP).

Evaluation calls into the model's parts (the encoder once, then the decoder on its output, or
`generate`) instead of through the wrapper's forward, so it must arrange two things the wrapper's
forward would: the root unit's own weights (the shared embedding and final layer norms, which no
block owns) gathered for the call, and every process running the same forward passes, since each
sharded block gathers its weights from all of them as it runs (generation's `synced_gpus`).
"""
from __future__ import annotations

import contextlib

from accelerate.utils import DistributedType
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

from t5_training.runtime import uses_deepspeed_zero3


def _without_compile(model):
    return getattr(model, "_orig_mod", model)


def is_fsdp(model) -> bool:
    """Whether `model` is sharded by FSDP: wrapped (FSDP1) or converted in place (FSDP2's fully_shard)."""
    return isinstance(_without_compile(model), (FullyShardedDataParallel, FSDPModule))


def shards_weights(accelerator, model=None) -> bool:
    """Whether every process must run each forward pass with the others: ZeRO-3 or FSDP, as launched
    (the accelerator) or as the model is (FSDP applied outside accelerate's prepare)."""
    return (uses_deepspeed_zero3(accelerator) or accelerator.distributed_type == DistributedType.FSDP
            or (model is not None and is_fsdp(model)))


@contextlib.contextmanager
def root_weights_gathered(model):
    """The FSDP root unit's own weights whole inside the block (on every process: a collective), so
    that its parts can be called directly; the blocks gather theirs when they run. Else nothing."""
    model = _without_compile(model)
    if isinstance(model, FullyShardedDataParallel):
        with FullyShardedDataParallel.summon_full_params(model, recurse=False, writeback=False):
            yield
    elif isinstance(model, FSDPModule):
        # Before any forward through the root (evaluation before training), the first sharded block
        # called would take itself for the root and the root's own forward would then fail; only
        # that forward initialises the root, and torch offers no public call for it.
        model._get_fsdp_state()._lazy_init()
        model.unshard()
        try:
            yield
        finally:
            model.reshard()
    else:
        yield
