"""Resuming under another split of the same global batch: the batch layout and the data position.

A run's global batch is per-device batch x accumulation x processes. Micro-batch k over all
processes holds rows [k*b*P, (k+1)*b*P) of the epoch's order (accelerate deals a loader's batches
to the processes in turn), so a data position counted in rows (`TrainState.samples_in_epoch`)
means the same rows under any split of the same global batch. A checkpoint records the layout
it was saved with (`TrainState.batch_layout`); `continue_with_layout` checks a resumed run's
against it.
"""
from __future__ import annotations

from t5_training.errors import UsageError


def batch_layout(config, num_processes: int) -> dict:
    """How a run splits its global batch: per-device batch x accumulation x processes."""
    return {"per_device": config.per_device_train_batch_size, "accumulation": config.gradient_accumulation_steps,
            "processes": num_processes}


def global_batch(layout: dict) -> int:
    return layout["per_device"] * layout["accumulation"] * layout["processes"]


def micro_batch_rows(layout: dict) -> int:
    """Rows one micro-batch takes over all processes: what the data position advances by."""
    return layout["per_device"] * layout["processes"]


def _describe(layout: dict) -> str:
    return (f"{global_batch(layout)} ({layout['per_device']} per device x {layout['accumulation']} accumulation x "
            f"{layout['processes']} processes)")


def continue_with_layout(accelerator, config, state, path: str, *, streaming: bool = False) -> None:
    """Lets a resumed run continue exactly under another split of the same global batch.

    A different global batch is refused: the rows per optimizer step, the schedule's meaning of
    a step and the data position would all change. accelerate restores its micro-batch counter
    as steps x the OLD accumulation; it is reset here so that every window ends on a
    synchronising micro-batch.
    """
    now = batch_layout(config, accelerator.num_processes)
    saved = state.batch_layout or now
    if state.legacy_batches_in_epoch is not None:
        # Written before positions were counted in rows, without its layout: taken as this run's.
        state.samples_in_epoch = state.legacy_batches_in_epoch * micro_batch_rows(now)
        state.legacy_batches_in_epoch = None
    if global_batch(saved) != global_batch(now):
        raise UsageError(f"checkpoint {path} was trained with a global batch of {_describe(saved)}, but this run has "
                         f"{_describe(now)}; resume with the same global batch (any split of it), or start a new "
                         "run from its weights with --model_name_or_path")
    if streaming and saved["processes"] != now["processes"]:
        raise UsageError(f"checkpoint {path} streamed its corpus over {saved['processes']} processes, this run has "
                         f"{now['processes']}: each process reads its own share of a stream, so the position does not "
                         f"carry over; resume with {saved['processes']} processes")
    if state.samples_in_epoch % micro_batch_rows(now):
        raise UsageError(f"checkpoint {path} stopped {state.samples_in_epoch} rows into epoch {state.epoch}, which is "
                         f"not a whole number of this run's {now['per_device']} x {now['processes']}-row micro-batches; "
                         f"resume with {_describe(saved)}")
    accelerator.step = state.step * config.gradient_accumulation_steps
