"""Where a run executes: the Accelerator, the trackers, and everything `prepare` hands to the loop.

`build_accelerator` picks the setup of the device this process trains on (GPU or CPU, gloo,
DeepSpeed on CPU, mixed precision); `prepare` builds the optimizer and schedule and lets accelerate wrap the model and
loaders, returning them together as a `Prepared` run; `close` ends it on every process.
"""
from __future__ import annotations

import functools
import math
import netrc
import os
import sys
import urllib.parse
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from accelerate.utils import (DataLoaderConfiguration, DistributedType, GradientAccumulationPlugin,
                              InitProcessGroupKwargs, TorchDynamoPlugin)

from t5_training import teardown
from t5_training.config import TrainingConfig, config_for_trackers
from t5_training.device import runs_on_cuda, settle_cpu_run
from t5_training.errors import UsageError
from t5_training.components import model_summary
from t5_training.optim import build_optimizer, build_scheduler


def resolve_mixed_precision(requested: str) -> str:
    """'auto' is bf16 where this process trains on a GPU that supports it, and fp32 ('no') elsewhere:
    CPUs here lack bf16 units, also on a GPU host (see device.runs_on_cuda)."""
    if requested != "auto":
        return requested
    return "bf16" if runs_on_cuda() and torch.cuda.is_bf16_supported() else "no"


def check_wandb_login(report_to: str, environ=None, interactive: bool | None = None) -> None:
    """Refuses --report_to wandb where W&B could only fail: online, no API key, no terminal to ask for one.

    Checked before anything is written: wandb would raise from init_trackers, after the output
    folder was made (and, with --overwrite_output_dir, an earlier run in it deleted). A key is in
    WANDB_API_KEY, a token file (WANDB_IDENTITY_TOKEN_FILE) or the netrc entry `wandb login` writes.
    """
    environ = os.environ if environ is None else environ
    if report_to not in ("wandb", "all") or environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun"):
        return
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    if sys.stdin.isatty() if interactive is None else interactive:
        return  # wandb asks for the key
    host = urllib.parse.urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    try:
        if netrc.netrc(environ.get("NETRC")).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise UsageError(f"--report_to {report_to} needs a W&B API key, and none is set for {host}: run `wandb login` "
                     "(or set WANDB_API_KEY), set WANDB_MODE=offline to log locally and `wandb sync` later, or pass "
                     "--report_to tensorboard")


def build_accelerator(config: TrainingConfig, *, shapes: int | None = None) -> Accelerator:
    """An Accelerator for the device this process trains on: gloo and `cpu=True` off a GPU.

    `shapes` is how many training batch shapes there can be, for `--torch_compile`: 1 (pretraining's
    packed chunks), a bound (fine-tuning's widths, batching.compile_widths), or None where they vary
    without one (UL2's target widths).

    A process trains on the CPU where the host has no GPU or ACCELERATE_USE_CPU (which the Slurm
    scripts set on CPU nodes) says so (device.runs_on_cuda). Under `accelerate launch` with a
    DeepSpeed config, DeepSpeed then runs on the CPU itself (device.settle_cpu_run).
    """
    check_wandb_login(config.report_to)
    on_cpu = not runs_on_cuda()
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if on_cpu and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        # accelerate enables FSDP only on GPU-like devices; on a CPU it would train plain DDP.
        raise UsageError("FSDP needs GPUs (accelerate does not run it on CPUs); on CPUs shard with --config_file "
                         "accelerate_configs/deepspeed_zero3.yaml, or train data-parallel with --multi_gpu")
    if on_cpu:
        settle_cpu_run(deepspeed)
    else:
        # TF32 tensor cores for fp32 matmuls: about 8x the fp32 rate at a 10-bit mantissa,
        # which training tolerates (the weights and their updates stay fp32).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    precision = resolve_mixed_precision(config.mixed_precision)
    dynamo = _dynamo_plugin(config, shapes)
    if dynamo and on_cpu:
        save_whole_activations_for_backward()
    accelerator = Accelerator(
        cpu=on_cpu and not deepspeed,
        mixed_precision=precision,
        # Windows are exact multiples of the accumulation steps (see loop.train), so accumulation
        # never needs to follow the end of an epoch.
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=config.gradient_accumulation_steps, sync_with_dataloader=False, adjust_scheduler=False
        ),
        # Batches come from pinned memory where they go to a GPU (device.loader_workers): their copy
        # then need not wait for the GPU to finish the step before it.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=False, non_blocking=not on_cpu),
        log_with=None if config.report_to == "none" else config.report_to,
        project_dir=config.output_dir,
        # DeepSpeed on CPU must be told gloo, or it sizes batches for one process.
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")] if on_cpu and teardown.one_of_several_processes() else [],
        dynamo_plugin=dynamo,
    )
    _check_compile_settings_took(accelerator, dynamo)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        # accelerate would fill "auto" with 1.0; DeepSpeed clips inside its engine, so this is
        # where --max_grad_norm takes effect (0 turns clipping off, as without DeepSpeed).
        if ds_config.get("gradient_clipping") == "auto":
            ds_config["gradient_clipping"] = config.max_grad_norm
    if precision == "fp16":
        accelerator.print("warning: fp16 overflows in T5's feed-forward layers and tends to give NaN losses; "
                          "prefer --mixed_precision bf16")
    return accelerator


def uses_deepspeed_zero3(accelerator: Accelerator) -> bool:
    """Whether DeepSpeed ZeRO stage 3 partitions the model's weights across the processes: every forward
    pass then needs all of them (generation's `synced_gpus`), and some adapters cannot run (DoRA)."""
    return (accelerator.distributed_type == DistributedType.DEEPSPEED
            and accelerator.state.deepspeed_plugin.zero_stage == 3)


def _dynamo_plugin(config: TrainingConfig, shapes: int | None) -> TorchDynamoPlugin | None:
    """`--torch_compile`: accelerate compiles the model in `prepare` and unwraps it for saving."""
    if not config.torch_compile:
        return None
    if config.torch_compile_mode != "default" and config.torch_compile_backend != "inductor":
        # Other backends would ignore the mode with a warning, and the run would not be what was asked.
        raise UsageError(f"--torch_compile_mode {config.torch_compile_mode} is a mode of the inductor backend; "
                         f"drop it or use --torch_compile_backend inductor")
    if shapes == 1:
        # One shape: torch's default (None) compiles a static graph, and makes a dimension symbolic
        # only once it changes (an epoch's last, smaller batch), not a new graph for every size.
        dynamic = None
    elif shapes:
        # A few shapes: a static graph for each (what CUDA graphs need, and the fastest kernels),
        # never one symbolic graph for all; dynamo keeps up to `recompile_limit` graphs of a frame
        # and would run the model uncompiled beyond them.
        dynamic = False
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, shapes)
    else:
        # Shapes without a bound: symbolic lengths at once, rather than a graph for every new length.
        dynamic = True
    try:
        return TorchDynamoPlugin(backend=config.torch_compile_backend, mode=config.torch_compile_mode,
                                 dynamic=dynamic)
    except (ValueError, KeyError):
        raise UsageError(f"--torch_compile_backend {config.torch_compile_backend!r} is not a torch.compile backend; "
                         "use inductor (the default) or aot_eager") from None


def save_whole_activations_for_backward() -> None:
    """Lets torch.compile's partitioner keep a viewed activation itself for the backward pass.

    T5's feed-forward block views its ReLU output (batch, length, d_ff) as a matrix for the next
    matmul. Without recomputable views the partitioner cannot derive the ReLU's backward mask from
    the saved matrix, so the forward pass stores a bool mask of every element as well, and
    inductor's CPU kernels store and load bool masks many times slower than eager's (torch 2.13):
    compiled pretraining ran slower than eager. With them, the mask is recomputed from the saved
    activation inside the backward kernel, and compiled runs faster than eager
    (docs/results/performance.md#compiling). Process-wide, as torch keeps the setting; set only
    where a CPU compiles, where it was measured.
    """
    import torch._functorch.config

    torch._functorch.config.recompute_views = True


def _check_compile_settings_took(accelerator: Accelerator, wanted: TorchDynamoPlugin | None) -> None:
    # accelerate keeps one state per process and ignores a later Accelerator's compile settings, so
    # a second run in one process (main() called twice) would silently train as the first did.
    wanted = wanted or TorchDynamoPlugin()  # what accelerate builds from the environment
    have = accelerator.state.dynamo_plugin
    if (have.backend, have.mode, have.dynamic) != (wanted.backend, wanted.mode, wanted.dynamic):
        raise UsageError(f"this process already trained with other --torch_compile settings ({have.backend.value}), "
                         "which accelerate keeps for the process's lifetime; run each training in a process of its own")


def init_trackers(accelerator: Accelerator, config: TrainingConfig, project: str) -> None:
    if config.report_to != "none":
        init_kwargs = {"wandb": {"name": config.run_name}} if config.run_name else {}
        accelerator.init_trackers(project, config=config_for_trackers(config), init_kwargs=init_kwargs)


def batches_per_epoch(loader) -> int:
    """Micro-batches per epoch, or 0 for a stream that has no length."""
    try:
        return len(loader)
    except TypeError:
        return 0


def total_train_steps(config: TrainingConfig, per_epoch: int) -> int:
    """Optimizer steps in the run: --max_steps, or the epochs' micro-batches over accumulation."""
    if config.max_steps > 0:
        return config.max_steps
    if not per_epoch:
        raise UsageError("a streamed corpus has no length: set --max_steps")
    return max(1, math.ceil(config.num_train_epochs * per_epoch / config.gradient_accumulation_steps))


@dataclass
class Prepared:
    """What the loop trains: the wrapped model, its optimizer and schedule, the loaders, the run's length."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_loader: object
    eval_loaders: dict
    batches_per_epoch: int
    total_steps: int


def prepare(accelerator: Accelerator, config: TrainingConfig, model: torch.nn.Module, train_loader,
            eval_loaders: dict, *, shard_train_loader: bool = True) -> Prepared:
    """Builds the optimizer and schedule, and wraps model, optimizer and loaders for this setup.

    `shard_train_loader=False` leaves the training loader as it is: a stream whose dataset
    already gives each process its own share (pre_train_t5.py --streaming).
    """
    accelerator.print(model_summary(model))
    # The config's accumulation is the one source: --auto_find_batch_size may have raised it
    # since the Accelerator was built, and accelerate's own counter must follow.
    accelerator.gradient_accumulation_steps = config.gradient_accumulation_steps
    deepspeed_plugin = accelerator.state.deepspeed_plugin
    if accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        # On the device before the optimizer is built, so that AdamW can use its fused GPU
        # kernel; `prepare` would move it anyway. DeepSpeed and FSDP place shards themselves.
        model.to(accelerator.device)
    optimizer = build_optimizer(model, config, deepspeed_plugin.deepspeed_config if deepspeed_plugin else None)
    to_prepare = [model, optimizer, *eval_loaders.values()] + ([train_loader] if shard_train_loader else [])
    model, optimizer, *prepared = accelerator.prepare(*to_prepare)
    if shard_train_loader:
        train_loader = prepared.pop()
    per_epoch = batches_per_epoch(train_loader)
    total_steps = total_train_steps(config, per_epoch)
    scheduler = build_scheduler(optimizer, config, total_steps)
    return Prepared(model, optimizer, scheduler, train_loader, dict(zip(eval_loaders, prepared)), per_epoch,
                    total_steps)


def prepare_inference(accelerator: Accelerator, model: torch.nn.Module, loaders: dict) -> tuple[torch.nn.Module, dict]:
    """The model and ordered loaders wrapped for this setup, with no optimizer: a run that only evaluates."""
    accelerator.print(model_summary(model))
    model, *prepared = accelerator.prepare(model, *loaders.values())
    return model, dict(zip(loaders, prepared))


def prepare_loaders(accelerator: Accelerator, loaders: dict) -> dict:
    """Loaders split across processes, their batches sent to the device, after the model was prepared."""
    return {name: accelerator.prepare_data_loader(loader) for name, loader in loaders.items()}


def close(accelerator: Accelerator) -> None:
    """Ends the trackers once every process has finished.

    Every process reaches the end before the process group is destroyed: a gloo peer torn down
    while another still holds the connection can abort at exit ("terminate called ...").
    The group itself ends after the model, once the script's main() has returned (teardown).
    """
    accelerator.wait_for_everyone()
    teardown.keep_process_group()
    accelerator.end_training()


def warn(accelerator):
    """Prints a warning line on stderr, once (on the main process), apart from the run's ordinary output."""
    return functools.partial(accelerator.print, file=sys.stderr, flush=True)
