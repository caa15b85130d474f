"""Whether this process trains on a CUDA GPU: the one answer that precision, padding, pinning and
DeepSpeed's setup follow.

A host's GPUs are not the device a process uses: the Slurm scripts set ACCELERATE_USE_CPU=1 on
CPU nodes, which may have GPUs too, and tests build `Accelerator(cpu=True)`. Asking
`torch.cuda.is_available()` alone would give such a CPU run bf16, batches padded for tensor cores
and pinned memory, none of which a CPU gains from.
"""
from __future__ import annotations

import os

import torch
from accelerate.utils import parse_flag_from_env


def runs_on_cuda(cpu: bool = False) -> bool:
    """True when this process trains on a CUDA GPU: the host has one, and neither `cpu` (accelerate's
    `cpu=True`), ACCELERATE_USE_CPU nor ACCELERATE_TORCH_DEVICE asks for another device."""
    if cpu or not torch.cuda.is_available() or parse_flag_from_env("ACCELERATE_USE_CPU"):
        return False
    named = os.environ.get("ACCELERATE_TORCH_DEVICE")
    return named is None or torch.device(named).type == "cuda"


def settle_cpu_run(deepspeed: bool) -> None:
    """Sets the environment of a process that trains on the CPU, before its Accelerator is built.

    Under DeepSpeed, ACCELERATE_USE_CPU (or `cpu=True`) would make accelerate silently drop
    DeepSpeed and train plain DDP, so it is turned off; on a host with GPUs accelerate would then
    pick a GPU, so the CPU is named as the device instead, which `runs_on_cuda` reads as well.
    """
    # DeepSpeed otherwise probes for a GPU and warns on every import.
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if deepspeed:
        os.environ["ACCELERATE_USE_CPU"] = "false"
        if torch.cuda.is_available():
            os.environ["ACCELERATE_TORCH_DEVICE"] = "cpu"


def loader_workers(config, persistent: bool = True) -> dict:
    """DataLoader arguments for `--dataloader_num_workers`, with pinned memory when batches go to a GPU.

    Pinned (page-locked) host memory lets the copy to the GPU run asynchronously; in a CPU run
    (on any host) it would only cost time. Workers stay alive across epochs (`persistent`), since
    starting them again each epoch costs a fork and a re-import per worker; a stream that is
    told its epoch through its dataset needs fresh workers, which copy the dataset anew.
    """
    workers = config.dataloader_num_workers
    return {"num_workers": workers, "pin_memory": runs_on_cuda(),
            "persistent_workers": persistent and workers > 0}


def rng_untouched(device: torch.device):
    """A context in which torch's RNG may be drawn from without changing what the run draws next.

    Work beside training (probing batch sizes, evaluating, exporting) draws from the RNG that
    dropout draws from: building a DataLoader iterator takes a seed from it, a model copy its
    initial weights. Forked, the training run is the same whether or not that work happened.
    The device the run uses is forked, not the host's: a CPU run on a GPU host must not touch the GPU.
    """
    return torch.random.fork_rng(devices=[torch.cuda.current_device()] if device.type == "cuda" else [])
