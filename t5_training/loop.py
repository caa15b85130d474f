"""The one training loop both scripts run: accumulate, step, log, evaluate, save, stop.

What a script differs in (how to evaluate, what to export) comes in as arguments; the loop
never asks which script called it. Run progress lives in `TrainState`, which is checkpointed
with the weights, so a resumed run continues from the same step, data position and RNG.
One optimizer step is `step.train_step`; the run folder (saving, exports) is `run_dir`.

Loss normalization: the loss of an optimizer step is the mean over *all target tokens* of the
step (every micro-batch of the accumulation window, on every process). Averaging per-batch
means instead would weight a token in a short batch more than one in a long batch, so
`--gradient_accumulation_steps 4` would not equal a 4x larger batch. Here it does, and two
processes with batch B equal one process with batch 2B.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from t5_training import agreement, device, resume, run_dir
from t5_training.config import TrainingConfig
from t5_training.errors import Interrupted, Preempted, UsageError
from t5_training.interrupts import PreemptionHandler, kill_point
from t5_training.runtime import Prepared
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
    # What the run draws its rows from, for a resumed run to draw from the same: fine-tuning's mixture of
    # tasks (mixture.task_record), or pretraining's mixture of denoisers (denoisers.denoiser_record); empty
    # for one task or another objective.
    mixture: dict = field(default_factory=dict)
    # The adapter and its base, or {"peft": "none"} (adapter_record.describe): checked before resuming.
    adapter: dict = field(default_factory=dict)
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


def _micro_batches(accelerator: Accelerator, loader, state: TrainState, rows: int) -> Iterator[dict]:
    """Batches forever, epoch after epoch, starting at the state's saved data position.

    `rows` is a micro-batch's rows over all processes (per-device batch x processes): what the
    position advances by per micro-batch, so that it counts rows of the epoch.
    """
    while True:
        loader.set_epoch(state.epoch)
        skip = state.samples_in_epoch // rows
        produced = skip
        for batch in accelerator.skip_first_batches(loader, skip) if skip else loader:
            state.samples_in_epoch += rows
            produced += 1
            # A stream's loader is not prepared (corpus.StreamLoader): its batches still have to
            # reach the device; a prepared loader's are there already, and .to() returns them.
            yield {name: value.to(accelerator.device, non_blocking=True) for name, value in batch.items()}
        if not produced:
            # Otherwise an empty epoch would repeat forever (or hang the other processes).
            raise UsageError("the training data yields no batch on this process; add data or use fewer processes")
        state.epoch += 1
        state.samples_in_epoch = 0


def train(accelerator: Accelerator, config: TrainingConfig, run: Prepared, state: TrainState, *,
          evaluate: EvaluateFn, objective: Objective, export: ExportFn) -> TrainState:
    """Trains until `run.total_steps` (or early stopping), logging, evaluating and checkpointing.

    `evaluate(model)` returns metrics without the "eval/" prefix; the one named by `objective`
    picks the model exported as `best`. `export(model, name)` writes `output_dir/<name>/`.
    """
    model = run.model
    model.train()
    bar = tqdm(total=run.total_steps, initial=state.step, disable=not accelerator.is_local_main_process,
               desc="training", dynamic_ncols=True)
    state.batch_layout = resume.batch_layout(config, accelerator.num_processes)
    rows = resume.micro_batch_rows(state.batch_layout)
    batches = _micro_batches(accelerator, run.train_loader, state, rows)
    log = _PendingLosses(accelerator, config, run.scheduler, state, bar, run.batches_per_epoch * rows)
    stop = voted_stop = False
    # The bar is closed on every exit, so that an error's one line starts a line of its own.
    with PreemptionHandler(accelerator.print) as preemption, contextlib.closing(bar):
        if state.step < run.total_steps:
            # A process whose share of the data is empty fails on its first batch, alone: agreed
            # on, so every process stops with that error instead of waiting in the first all-reduce.
            first = agreement.on_every_process(accelerator, lambda: next(batches))
            batches = itertools.chain([first], batches)
        while state.step < run.total_steps and not stop:
            started = time.perf_counter()
            window = [next(batches) for _ in range(config.gradient_accumulation_steps)]
            counts = window_counts(accelerator, window, preemption.received is not None)
            loss = train_step(accelerator, model, run.optimizer, window, counts, config.max_grad_norm, state.step + 1)
            log.add(loss, counts)
            run.scheduler.step()
            state.step += 1
            at_end = state.step >= run.total_steps
            if at_end and accelerator.device.type == "cuda":
                # train_runtime ends when the last step has run on the GPU, not when it was queued.
                torch.cuda.synchronize(accelerator.device)
            state.train_seconds += time.perf_counter() - started
            bar.update(1)

            voted_stop |= maybe_log(config, state, log, at_end)
            if due(config.eval_steps, state.step, at_end):
                voted_stop |= log.flush()
                stop = evaluate_and_track(accelerator, config, model, state, evaluate, objective, export)
            # Several processes stop on the votes all-reduced with the token counts, so all agree;
            # they see them at the next logging step. One process reads its own signal flag.
            preempted = voted_stop if accelerator.num_processes > 1 else preemption.received is not None
            if at_end or stop or preempted or due(config.save_steps, state.step, False):
                log.flush()
                path = run_dir.save(accelerator, config, model, run.scheduler, state)
                if preempted and not at_end:
                    stopped = Interrupted if preemption.received == "SIGINT" else Preempted
                    raise stopped(f"{preemption.received or 'a signal'} received: saved {path} at step "
                                  f"{state.step}; rerun with --resume_from_checkpoint auto to continue")
    return state


def due(every: int, step: int, at_end: bool) -> bool:
    """Whether an every-N-steps action (0: never) falls on `step`, or the run is at its end."""
    return at_end or bool(every and step % every == 0)


def maybe_log(config: TrainingConfig, state: TrainState, log: "_PendingLosses", at_end: bool) -> bool:
    """Logs the pending steps at logging steps; returns whether a process voted to stop in them."""
    # Losses, counts and stop votes are read back only here (and before evaluating or saving),
    # where the non-finite guard also runs: no host sync in between.
    return log.flush() if due(max(config.logging_steps, 1), state.step, at_end) else False


class _PendingLosses:
    """The losses and counts of steps not yet read back from the device, and how they are logged."""

    def __init__(self, accelerator, config: TrainingConfig, scheduler, state: TrainState, bar, rows_per_epoch: int):
        self.accelerator, self.config, self.scheduler, self.state, self.bar = accelerator, config, scheduler, state, bar
        self.rows_per_epoch = rows_per_epoch
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def add(self, loss: torch.Tensor, counts: torch.Tensor) -> None:
        self.pending.append((loss, counts))

    def flush(self) -> bool:
        """Reads the pending steps back (one host sync), guards against non-finite steps, logs.

        Returns whether any process voted to stop (a preemption signal) in those steps.
        """
        if not self.pending:
            return False
        state = self.state
        values = torch.stack([loss.double() for loss, _ in self.pending]).tolist()
        _, samples, tokens, votes = torch.stack([counts for _, counts in self.pending]).sum(dim=0).tolist()
        first = state.step - len(self.pending) + 1
        self.pending.clear()
        for step, value in enumerate(values, start=first):
            guard_nonfinite(self.accelerator, self.config, state, step, applied=math.isfinite(value))
        state.losses.extend(values)
        state.samples_seen += int(samples)
        state.tokens_seen += int(tokens)
        lr = self.scheduler.get_last_lr()[0]
        logged = {"train/loss": sum(values) / len(values), "train/lr": lr}
        if self.rows_per_epoch:
            logged["train/epoch"] = state.epoch + state.samples_in_epoch / self.rows_per_epoch
        self.accelerator.log(logged, step=state.step)
        self.bar.set_postfix(loss=f"{values[-1]:.4f}", lr=f"{lr:.2e}")
        return votes > 0


def evaluate_and_track(accelerator, config, model, state: TrainState, evaluate, objective: Objective, export) -> bool:
    """Evaluates, logs, exports a new best model, and says whether early stopping triggers."""
    model.eval()
    # Evaluating and exporting leave the training RNG where they found it, so a run trains the
    # same whatever its --eval_steps (tests/loop_test.py::EvaluationLeavesTrainingAloneTest).
    with device.rng_untouched(accelerator.device):
        results = evaluate(model)
    kill_point("eval", state.step)
    model.train()
    accelerator.log({f"eval/{k}": v for k, v in results.items()}, step=state.step)
    state.evals.append({"step": state.step, **results})
    value = results[objective.metric]
    if objective.improved(value, state.best_metric):
        state.best_metric, state.best_step = value, state.step
        state.evals_without_improvement = 0
        with device.rng_untouched(accelerator.device):
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
