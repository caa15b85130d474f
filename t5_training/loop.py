"""The one training loop both scripts run: accumulate, step, log, evaluate, save, stop.

What a script differs in (how to evaluate, what to export) comes in as arguments; the loop
never asks which script called it. Run progress lives in `TrainState`, which is checkpointed
with the weights, so a resumed run continues from the same step, data position and RNG.

Loss normalization: the loss of an optimizer step is the mean over *all target tokens* of the
step (every micro-batch of the accumulation window, on every process). Averaging per-batch
means instead would weight a token in a short batch more than one in a long batch, so
`--gradient_accumulation_steps 4` would not equal a 4x larger batch. Here it does, and two
processes with batch B equal one process with batch 2B.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import (DataLoaderConfiguration, DistributedType, GradientAccumulationPlugin,
                             InitProcessGroupKwargs, TorchDynamoPlugin)
from tqdm.auto import tqdm

from t5_training import agreement, checkpoint, reporting, resume
from t5_training.config import TrainingConfig, config_for_trackers
from t5_training.errors import DivergedError, Preempted, UsageError
from t5_training.interrupts import PreemptionHandler, kill_point
from t5_training.modeling import model_summary
from t5_training.optim import build_optimizer, build_scheduler
from t5_training.step import guard_nonfinite, train_step, window_counts

EvaluateFn = Callable[[torch.nn.Module], dict]
ExportFn = Callable[[torch.nn.Module, str], None]


@dataclass
class TrainState:
    """Progress of a run. Everything here is saved in each checkpoint as JSON."""

    step: int = 0
    epoch: int = 0
    # The data position: rows of the epoch consumed, over all processes. Counted in rows rather
    # than batches, so that a run can resume with another per-device batch, accumulation or
    # number of processes (same global batch) and still see the same rows in the same order.
    samples_in_epoch: int = 0
    # The per-device batch, accumulation and processes of the run that saved (resume.batch_layout).
    batch_layout: dict = field(default_factory=dict)
    samples_seen: int = 0
    tokens_seen: int = 0
    train_seconds: float = 0.0
    losses: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    best_metric: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    nonfinite_in_a_row: int = 0
    scheduler: dict = field(default_factory=dict)

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, values: dict) -> None:
        values = dict(values)
        # Written before positions were counted in rows, in batches of a layout it did not
        # record; resume.continue_with_layout converts it.
        self.legacy_batches_in_epoch = values.pop("batches_in_epoch", None)
        for name, value in values.items():
            setattr(self, name, value)


@dataclass(frozen=True)
class Objective:
    """Which evaluation result decides the best model and early stopping."""

    metric: str
    greater_is_better: bool = True

    def improved(self, value: float, best: float | None) -> bool:
        if best is None or math.isnan(best):
            return not math.isnan(value)
        return value > best if self.greater_is_better else value < best


def resolve_mixed_precision(requested: str) -> str:
    """'auto' is bf16 where a GPU supports it and fp32 ('no') elsewhere: CPUs here lack bf16 units."""
    if requested != "auto":
        return requested
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def build_accelerator(config: TrainingConfig) -> Accelerator:
    """An Accelerator for this machine: gloo and `cpu=True` when there is no GPU.

    Under `accelerate launch` with a DeepSpeed config, DeepSpeed runs on the CPU itself; there
    accelerate's `cpu=True` (or ACCELERATE_USE_CPU, which the Slurm scripts set on CPU nodes)
    would silently drop DeepSpeed and train plain DDP, so it is turned off.
    """
    on_cpu = not torch.cuda.is_available()
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if on_cpu and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true":
        # accelerate enables FSDP only on GPU-like devices; on a CPU it would train plain DDP.
        raise UsageError("FSDP needs GPUs (accelerate does not run it on CPUs); on CPUs shard with --config_file "
                         "accelerate_configs/deepspeed_zero3.yaml, or train data-parallel with --multi_gpu")
    if on_cpu:
        # DeepSpeed otherwise probes for a GPU and warns on every import.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if deepspeed:
            os.environ["ACCELERATE_USE_CPU"] = "false"
    if torch.cuda.is_available():
        # TF32 tensor cores for fp32 matmuls: about 8x the fp32 rate at a 10-bit mantissa,
        # which training tolerates (the weights and their updates stay fp32).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    precision = resolve_mixed_precision(config.mixed_precision)
    accelerator = Accelerator(
        cpu=on_cpu and not deepspeed,
        mixed_precision=precision,
        # Windows are exact multiples of the accumulation steps (see `train`), so accumulation
        # never needs to follow the end of an epoch.
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=config.gradient_accumulation_steps, sync_with_dataloader=False, adjust_scheduler=False
        ),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=False),
        log_with=None if config.report_to == "none" else config.report_to,
        project_dir=config.output_dir,
        # DeepSpeed on CPU must be told gloo, or it sizes batches for one process.
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")] if on_cpu and _launched_distributed() else [],
        dynamo_plugin=_dynamo_plugin(config),
    )
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


def _dynamo_plugin(config: TrainingConfig) -> TorchDynamoPlugin | None:
    """`--torch_compile`: accelerate compiles the model in `prepare` and unwraps it for saving."""
    if not config.torch_compile:
        return None
    try:
        # Padded lengths vary from batch to batch: compile for symbolic shapes at once rather
        # than recompiling for every new length.
        return TorchDynamoPlugin(backend=config.torch_compile_backend, dynamic=True)
    except (ValueError, KeyError):
        raise UsageError(f"--torch_compile_backend {config.torch_compile_backend!r} is not a torch.compile backend; "
                         "use inductor (the default) or aot_eager") from None


def _launched_distributed() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init_trackers(accelerator: Accelerator, config: TrainingConfig, project: str) -> None:
    if config.report_to != "none":
        init_kwargs = {"wandb": {"name": config.run_name}} if config.run_name else {}
        accelerator.init_trackers(project, config=config_for_trackers(config), init_kwargs=init_kwargs)


def total_train_steps(config: TrainingConfig, per_epoch: int) -> int:
    """Optimizer steps in the run: --max_steps, or the epochs' micro-batches over accumulation."""
    if config.max_steps > 0:
        return config.max_steps
    if not per_epoch:
        raise UsageError("a streamed corpus has no length: set --max_steps")
    return max(1, math.ceil(config.num_train_epochs * per_epoch / config.gradient_accumulation_steps))


def _micro_batches(accelerator: Accelerator, loader, state: TrainState, rows: int) -> Iterator[dict]:
    """Batches forever, epoch after epoch, starting at the state's saved data position.

    `rows` is a micro-batch's rows over all processes (per-device batch x processes): what the
    position advances by per micro-batch, so that it counts rows of the epoch.
    """
    while True:
        # A streaming loader is not prepared by accelerate (its dataset shards itself), so the
        # epoch goes to its dataset and its batches still have to reach the device.
        (loader if hasattr(loader, "set_epoch") else loader.dataset).set_epoch(state.epoch)
        skip = state.samples_in_epoch // rows
        produced = skip
        for batch in accelerator.skip_first_batches(loader, skip) if skip else loader:
            state.samples_in_epoch += rows
            produced += 1
            yield {name: value.to(accelerator.device) for name, value in batch.items()}
        if not produced:
            # Otherwise an empty epoch would repeat forever (or hang the other processes).
            raise UsageError("the training data yields no batch on this process; add data or use fewer processes")
        state.epoch += 1
        state.samples_in_epoch = 0


def batches_per_epoch(loader) -> int:
    """Micro-batches per epoch, or 0 for a stream that has no length."""
    try:
        return len(loader)
    except TypeError:
        return 0


def train(
    accelerator: Accelerator,
    config: TrainingConfig,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    loader,
    state: TrainState,
    *,
    total_steps: int,
    evaluate: EvaluateFn,
    objective: Objective,
    export: ExportFn,
) -> TrainState:
    """Trains until `total_steps` (or early stopping), evaluating, checkpointing and exporting.

    `evaluate(model)` returns metrics without the "eval/" prefix; the one named by `objective`
    picks the model exported as `best`. `export(model, name)` writes `output_dir/<name>/`.
    """
    model.train()
    bar = tqdm(total=total_steps, initial=state.step, disable=not accelerator.is_local_main_process,
               desc="training", dynamic_ncols=True)
    state.batch_layout = resume.batch_layout(config, accelerator.num_processes)
    rows = resume.micro_batch_rows(state.batch_layout)
    batches = _micro_batches(accelerator, loader, state, rows)
    pending: list[tuple[torch.Tensor, torch.Tensor]] = []
    per_epoch = batches_per_epoch(loader)
    stop = voted_stop = False
    # The bar is closed on every exit, so that an error's one line starts a line of its own.
    with PreemptionHandler(accelerator.print) as preemption, contextlib.closing(bar):
        if state.step < total_steps:
            # A process whose share of the data is empty fails on its first batch, alone: agreed
            # on, so every process stops with that error instead of waiting in the first all-reduce.
            first = agreement.on_every_process(accelerator, lambda: next(batches))
            batches = itertools.chain([first], batches)
        while state.step < total_steps and not stop:
            started = time.perf_counter()
            window = [next(batches) for _ in range(config.gradient_accumulation_steps)]
            counts = window_counts(accelerator, window, preemption.received is not None)
            loss = train_step(accelerator, model, optimizer, window, counts, config.max_grad_norm, state.step + 1)
            pending.append((loss, counts))
            scheduler.step()
            state.step += 1
            if state.step >= total_steps and accelerator.device.type == "cuda":
                # train_runtime ends when the last step has run on the GPU, not when it was queued.
                torch.cuda.synchronize(accelerator.device)
            state.train_seconds += time.perf_counter() - started
            bar.update(1)

            # Losses, counts and stop votes are read back at logging steps (and before evaluating
            # or saving), where the non-finite guard also runs: no host sync in between.
            flush = functools.partial(_flush_losses, accelerator, config, scheduler, state, pending, bar,
                                      per_epoch * rows)
            at_end = state.step >= total_steps
            if at_end or state.step % max(config.logging_steps, 1) == 0:
                voted_stop |= flush()
            if at_end or (config.eval_steps and state.step % config.eval_steps == 0):
                voted_stop |= flush()
                stop = _evaluate(accelerator, config, model, state, evaluate, objective, export)
            # Several processes stop on the votes all-reduced with the token counts, so all agree;
            # they see them at the next logging step. One process reads its own signal flag.
            preempted = voted_stop if accelerator.num_processes > 1 else preemption.received is not None
            if at_end or stop or preempted or (config.save_steps and state.step % config.save_steps == 0):
                flush()
                path = save(accelerator, config, model, scheduler, state)
                if preempted and not at_end:
                    raise Preempted(f"{preemption.received or 'a signal'} received: saved {path} at step "
                                    f"{state.step}; rerun with --resume_from_checkpoint auto to continue")
    return state


def _flush_losses(accelerator, config: TrainingConfig, scheduler, state: TrainState, pending: list, bar,
                  rows_per_epoch: int) -> bool:
    """Reads the pending steps' losses and counts (one host sync), guards against non-finite steps, logs.

    Returns whether any process voted to stop (a preemption signal) in those steps.
    """
    if not pending:
        return False
    values = torch.stack([loss.double() for loss, _ in pending]).tolist()
    _, samples, tokens, votes = torch.stack([counts for _, counts in pending]).sum(dim=0).tolist()
    first = state.step - len(pending) + 1
    pending.clear()
    for step, value in enumerate(values, start=first):
        guard_nonfinite(accelerator, config, state, step, applied=math.isfinite(value))
    state.losses.extend(values)
    state.samples_seen += int(samples)
    state.tokens_seen += int(tokens)
    lr = scheduler.get_last_lr()[0]
    logged = {"train/loss": sum(values) / len(values), "train/lr": lr}
    if rows_per_epoch:
        logged["train/epoch"] = state.epoch + state.samples_in_epoch / rows_per_epoch
    accelerator.log(logged, step=state.step)
    bar.set_postfix(loss=f"{values[-1]:.4f}", lr=f"{lr:.2e}")
    return votes > 0


def _evaluate(accelerator, config, model, state: TrainState, evaluate, objective: Objective, export) -> bool:
    """Evaluates, logs, exports a new best model, and says whether early stopping triggers."""
    model.eval()
    results = evaluate(model)
    kill_point("eval", state.step)
    model.train()
    accelerator.log({f"eval/{k}": v for k, v in results.items()}, step=state.step)
    state.evals.append({"step": state.step, **results})
    value = results[objective.metric]
    if objective.improved(value, state.best_metric):
        state.best_metric, state.best_step = value, state.step
        state.evals_without_improvement = 0
        export(model, "best")
    else:
        state.evals_without_improvement += 1
    summary = ", ".join(f"{k} {v:.4g}" for k, v in results.items())
    accelerator.print(f"step {state.step}: {summary}")
    patience = config.early_stopping_patience
    if patience and state.evals_without_improvement >= patience:
        accelerator.print(f"early stopping: no improvement in {objective.metric} for {patience} evaluations")
        return True
    return False


def save(accelerator, config, model, scheduler, state: TrainState) -> str:
    """Checkpoints the run (never with non-finite weights) and rotates old checkpoints; returns the folder."""
    ensure_finite_weights(model, f"step {state.step}")
    path = checkpoint.save_checkpoint(accelerator, config.output_dir, state, scheduler)
    if accelerator.is_main_process:
        checkpoint.rotate_checkpoints(config.output_dir, config.save_total_limit, keep_step=state.best_step)
    accelerator.wait_for_everyone()
    return path


def ensure_finite_weights(model: torch.nn.Module, where: str) -> None:
    """Raises DivergedError instead of letting NaN or inf weights reach a checkpoint or an export."""
    # Under ZeRO-3 a parameter is an empty placeholder and this process's shard is `ds_tensor`.
    shards = [getattr(p, "ds_tensor", p) for p in model.parameters()]
    finite = torch.stack([torch.isfinite(t).all() for t in shards]).all()
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        # Sharded weights (ZeRO-3, FSDP) differ between processes: all must take the same
        # decision, or one would raise while the others wait in the next collective.
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        flag = finite.to(device=device, dtype=torch.int32)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        finite = flag.bool()
    if not bool(finite):
        raise DivergedError(f"the weights are not finite at {where}, so they were not saved; the last saved "
                            "checkpoint is intact. Lower --learning_rate, or use --mixed_precision bf16 over fp16")


def finish(accelerator: Accelerator, config: TrainingConfig, state: TrainState, objective: Objective,
           per_epoch: int) -> dict:
    """Writes train_results.json, eval_results.json and loss_curve.png; prints the metric table.

    Throughput counts time spent in optimizer steps only (not evaluation or saving), and
    tokens are non-padding input plus target tokens over all processes.
    """
    # Micro-batches per process per epoch -> rows per epoch, the unit of the data position.
    rows_per_epoch = per_epoch * resume.micro_batch_rows(resume.batch_layout(config, accelerator.num_processes))
    seconds = max(state.train_seconds, 1e-9)
    train_results = {
        "train_loss": sum(state.losses) / len(state.losses) if state.losses else float("nan"),
        "train_runtime": round(state.train_seconds, 3),
        "train_samples_per_second": round(state.samples_seen / seconds, 3),
        "train_tokens_per_second": round(state.tokens_seen / seconds, 3),
        "train_steps": state.step,
        # Non-padding input + target tokens: how much text the model has seen (over all processes).
        "train_tokens": state.tokens_seen,
        "train_samples": state.samples_seen,
        "epoch": round(state.epoch + state.samples_in_epoch / rows_per_epoch, 4) if rows_per_epoch else None,
    }
    last_eval = {k: v for k, v in (state.evals[-1] if state.evals else {}).items() if k != "step"}
    eval_results = {**last_eval, "best_metric": state.best_metric, "best_step": state.best_step,
                    "metric_to_optimize": objective.metric}
    if accelerator.is_main_process:
        reporting.write_json(os.path.join(config.output_dir, "train_results.json"), train_results)
        reporting.write_json(os.path.join(config.output_dir, "eval_results.json"), eval_results)
        if state.losses:
            reporting.save_loss_curves(os.path.join(config.output_dir, "loss_curve.png"),
                                       {"training loss": {"train": state.losses}})
        rows = [{"metric": k, "value": v} for k, v in last_eval.items()]
        rows += [{"metric": k, "value": v} for k, v in train_results.items()]
        accelerator.print(reporting.format_table(rows))
    return {"train": train_results, "eval": eval_results}


def fit(accelerator: Accelerator, config: TrainingConfig, model, tokenizer, train_loader, eval_loaders: dict, *,
        make_evaluate: Callable[[dict], EvaluateFn], objective: Objective, resume_path: str | None,
        project_name: str, prepare_train_loader: bool = True) -> dict:
    """Everything after the data is ready, shared by both scripts: prepare, resume, train, export.

    `make_evaluate(prepared_eval_loaders)` builds the evaluation. A streaming train loader is
    not prepared (`prepare_train_loader=False`): its dataset already splits work between
    processes. Returns the results written to train_results.json and eval_results.json.
    """
    accelerator.print(model_summary(model))
    deepspeed_plugin = accelerator.state.deepspeed_plugin
    if accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        # On the device before the optimizer is built, so that AdamW can use its fused GPU
        # kernel; `prepare` would move it anyway. DeepSpeed and FSDP place shards themselves.
        model.to(accelerator.device)
    optimizer = build_optimizer(model, config, deepspeed_plugin.deepspeed_config if deepspeed_plugin else None)
    to_prepare = [model, optimizer, *eval_loaders.values()] + ([train_loader] if prepare_train_loader else [])
    model, optimizer, *prepared = accelerator.prepare(*to_prepare)
    if prepare_train_loader:
        train_loader = prepared.pop()
    prepared_evals = dict(zip(eval_loaders, prepared))
    per_epoch = batches_per_epoch(train_loader)
    total_steps = total_train_steps(config, per_epoch)
    scheduler = build_scheduler(optimizer, config, total_steps)

    state = TrainState()
    if resume_path:
        # Before the output folder is touched: a checkpoint refused here leaves no trace.
        # Each process reads its own RNG file: a damaged one fails on that process alone.
        agreement.on_every_process(accelerator, lambda: checkpoint.load_checkpoint(accelerator, resume_path, state,
                                                                                    scheduler))
        resume.continue_with_layout(accelerator, config, state, resume_path, streaming=not prepare_train_loader)
        accelerator.print(f"resumed from {resume_path} at step {state.step}")
    checkpoint.start_output_dir(accelerator, config.output_dir, resuming=bool(resume_path))
    init_trackers(accelerator, config, project_name)

    def export(model, name: str) -> None:
        checkpoint.export_model(accelerator, model, tokenizer, os.path.join(config.output_dir, name))

    state = train(accelerator, config, model, optimizer, scheduler, train_loader, state, total_steps=total_steps,
                  evaluate=make_evaluate(prepared_evals), objective=objective, export=export)
    ensure_finite_weights(model, "the end of training")
    export(model, "final")
    results = finish(accelerator, config, state, objective, per_epoch)
    # Every process reaches the end before the process group is destroyed: a gloo peer torn down
    # while another still holds the connection can abort at exit ("terminate called ...").
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return results
