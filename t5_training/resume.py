"""Resuming a checkpoint under another split of its global batch.

A checkpoint records its data position in rows of the epoch (`TrainState.samples_in_epoch`)
and the split it was trained with, per-device batch x accumulation x processes
(`TrainState.batch_layout`). Micro-batch k over all processes holds rows [k*b*P, (k+1)*b*P) of
the epoch's order, and that order depends on the seed, the epoch and the global batch only
(`--group_by_length` groups by global batch), so an optimizer step takes the same rows whatever
the split: a run resumed as 4 x 4 continues a run of 8 x 2 exactly, as `--auto_find_batch_size`
may choose on another GPU after a requeue. What cannot carry over is refused in one line
(another global batch; a stream split over other processes or data-loader workers) or, for the
one step that straddles the end of an epoch whose rows are not a whole number of micro-batches,
warned about.
"""
from __future__ import annotations

from t5_training import checkpoint
from t5_training.errors import UsageError


def batch_layout(config, num_processes: int) -> dict:
    """How a run splits its global batch, and how many data-loader workers read a stream."""
    return {"per_device": config.per_device_train_batch_size, "accumulation": config.gradient_accumulation_steps,
            "processes": num_processes, "workers": config.dataloader_num_workers}


def global_batch(layout: dict) -> int:
    return layout["per_device"] * layout["accumulation"] * layout["processes"]


def describe(layout: dict) -> str:
    return (f"{global_batch(layout)} ({layout['per_device']} per device x {layout['accumulation']} accumulation x "
            f"{layout['processes']} processes)")


def continue_with_layout(accelerator, config, state, path: str, *, epoch_rows: int | None,
                         streaming: bool = False) -> None:
    """Lets a resumed run continue exactly under another split of the same global batch, or refuses.

    `epoch_rows` is the training set's rows (None for a stream). accelerate restores its
    micro-batch counter as steps x the OLD accumulation; it is reset here to steps x the new
    one, so that every window ends on a synchronising micro-batch (otherwise, after 2 -> 3, no
    optimizer step would ever apply while finite losses were logged).
    """
    now = batch_layout(config, accelerator.num_processes)
    saved = {**now, **state.batch_layout} if state.batch_layout else _legacy_layout(accelerator, state, path, now)
    if global_batch(saved) != global_batch(now):
        raise UsageError(f"checkpoint {path} was trained with a global batch of {describe(saved)}, but this run has "
                         f"{describe(now)}; resume with the same global batch (any split of it), or start a new "
                         "run from its weights with --model_name_or_path")
    if streaming:
        _check_stream(saved, now, path)
    rows = now["per_device"] * now["processes"]
    # A finished epoch (the checkpoint's short last batch counted whole) resumes at the next.
    if state.samples_in_epoch % rows and not (epoch_rows and state.samples_in_epoch >= epoch_rows):
        raise UsageError(f"checkpoint {path} stopped {state.samples_in_epoch} rows into epoch {state.epoch}, which is "
                         f"not a whole number of this run's {now['per_device']} x {now['processes']}-row micro-batches; "
                         f"resume with {describe(saved)}")
    old_rows = saved["per_device"] * saved["processes"]
    if epoch_rows and old_rows != rows and (epoch_rows % old_rows or epoch_rows % rows):
        accelerator.print(f"warning: the epoch's {epoch_rows} rows are not a whole number of micro-batches of both "
                          f"{describe(saved)} and {describe(now)}: the step across each epoch end takes other rows "
                          "than the uninterrupted run's (a short last batch), and --num_train_epochs may count a step "
                          "more or fewer; every other step is the same")
    accelerator.step = state.step * now["accumulation"]
    state.batch_layout = now


def _check_stream(saved: dict, now: dict, path: str) -> None:
    # Each of the processes x workers readers of a stream takes its own share of the documents,
    # and a loader with several workers takes whole batches from them in turn.
    readers = lambda layout: (layout["processes"], max(layout["workers"], 1))  # noqa: E731
    if readers(saved) != readers(now):
        raise UsageError(f"checkpoint {path} streamed its corpus with {saved['processes']} processes x "
                         f"{saved['workers']} data-loader workers, this run has {now['processes']} x {now['workers']}: "
                         "each reads its own share of the stream, so the position does not carry over; resume with "
                         f"{saved['processes']} processes and --dataloader_num_workers {saved['workers']}")
    if now["workers"] > 1 and saved["per_device"] != now["per_device"]:
        raise UsageError(f"checkpoint {path} streamed batches of {saved['per_device']} from {now['workers']} "
                         f"data-loader workers in turn; with batches of {now['per_device']} the rows would come in "
                         f"another order: resume with --per_device_train_batch_size {saved['per_device']} and "
                         f"--gradient_accumulation_steps {saved['accumulation']}")


def _legacy_layout(accelerator, state, path: str, now: dict) -> dict:
    """The split of a checkpoint written before splits were recorded, which must equal this run's.

    Its position is `batches_in_epoch` micro-batches of its own split. The processes are told by
    its RNG files (one per process), the accumulation by accelerate's micro-batch counter, and
    the per-device batch by the rows seen: step x global batch, less the few rows missing from
    the short last batches of epochs.
    """
    processes = checkpoint.saved_process_count(path) or now["processes"]
    accumulation = accelerator.step // state.step if state.step else now["accumulation"]
    window = accumulation * processes
    per_device_fits = state.step * (now["per_device"] - 1) * window < state.samples_seen <= state.step * global_batch(now)
    if (processes, accumulation) != (now["processes"], now["accumulation"]) or not per_device_fits:
        raise UsageError(f"checkpoint {path} was written before batch splits were recorded and not with this run's "
                         f"{describe(now)} (it had {accumulation} accumulation x {processes} processes, "
                         f"{state.samples_seen} rows in {state.step} steps); resume it with the per-device batch, "
                         "accumulation and processes it was trained with")
    state.samples_in_epoch = vars(state).pop("batches_in_epoch", 0) * now["per_device"] * now["processes"]
    return now
