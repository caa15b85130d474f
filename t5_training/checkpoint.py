"""Checkpoints that are either complete or absent, and the atomic writes that exports share (export.py).

A checkpoint is `output_dir/step-NNNNNN/`: accelerate's `save_state` (weights, optimizer,
scheduler, RNG) plus `train_state.json` (step, data position, loss history, best metric). It
is written under a temporary name and renamed once everything is on disk; `checkpoint.json`
(the manifest) is the last file written. A folder without a manifest is never resumed from,
so a run killed mid-save resumes from the previous checkpoint.
"""
from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil

import torch
from accelerate.utils import DistributedType, extract_model_from_parallel
from safetensors import SafetensorError
from safetensors.torch import load_file

from t5_training.errors import UsageError, WriteError, first_line
from t5_training.interrupts import kill_point
from t5_training.reporting import write_json

# T5 ties its input and output embeddings: save_state stores the shared tensor once and warns
# each time that it "removed" the others, which reads like data loss on every checkpoint.
logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)

MANIFEST = "checkpoint.json"
STATE_FILE = "train_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def checkpoint_dir(output_dir: str, step: int) -> str:
    return os.path.join(output_dir, f"step-{step:06d}")


def is_complete(path: str) -> bool:
    """True if the manifest exists and every file it lists is there with the size it recorded."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            files = json.load(f)["files"]
        if isinstance(files, list):  # manifests of earlier versions list names only
            files = {name: os.path.getsize(os.path.join(path, name)) for name in files}
        return all(os.path.getsize(os.path.join(path, name)) == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def list_checkpoints(output_dir: str) -> list[str]:
    """Complete checkpoints in `output_dir`, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = _STEP_DIR.match(name)
        path = os.path.join(output_dir, name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def resolve_resume(resume_from_checkpoint: str | None, output_dir: str) -> str | None:
    """The checkpoint to resume from: 'auto' picks the newest complete one (None if there is none)."""
    if not resume_from_checkpoint:
        return None
    if resume_from_checkpoint == "auto":
        found = list_checkpoints(output_dir)
        return found[-1] if found else None
    if not os.path.isdir(resume_from_checkpoint):
        raise UsageError(f"--resume_from_checkpoint {resume_from_checkpoint!r} does not exist; "
                         "pass a step-NNNNNN folder or 'auto'")
    check_is_a_checkpoint(resume_from_checkpoint)
    if not is_complete(resume_from_checkpoint):
        raise UsageError(f"--resume_from_checkpoint {resume_from_checkpoint} is incomplete or damaged (its {MANIFEST} "
                         "is missing or lists files that are missing or truncated); pass an earlier checkpoint or 'auto'")
    return resume_from_checkpoint


def has_checkpoint_files(path: str) -> bool:
    """Whether the folder holds a checkpoint's own files, complete or not."""
    return any(os.path.exists(os.path.join(path, name)) for name in (MANIFEST, STATE_FILE))


def check_is_a_checkpoint(path: str) -> None:
    """Refuses a model export or a run's output folder as --resume_from_checkpoint by name: neither
    has a checkpoint's files, and calling them damaged would send the user looking for a fault."""
    if has_checkpoint_files(path):
        return
    if os.path.exists(os.path.join(path, "config.json")):
        raise UsageError(f"--resume_from_checkpoint {path} is a model export, not a checkpoint (no optimizer "
                         "state or data position): to train from its weights pass it as --model_name_or_path; "
                         "to continue its run pass one of the run's step-NNNNNN folders, or 'auto'")
    found = list_checkpoints(path)
    if found:
        raise UsageError(f"--resume_from_checkpoint {path} is a run's output folder: pass 'auto' with "
                         f"--output_dir {path}, or one of its checkpoints, e.g. {found[-1]}")


def save_checkpoint(accelerator, output_dir: str, state, scheduler=None, *, trainable_only: bool = False) -> str:
    """Saves everything needed to continue exactly, atomically. Returns the checkpoint folder.

    The scheduler goes into train_state.json as JSON rather than being registered with
    accelerate, whose loader for registered objects unpickles with weights_only=False.
    `trainable_only` leaves the frozen weights out (an adapter run, t5_training.adapters): they
    are the starting model's, which resuming loads again, and they are most of the bytes.
    """
    if scheduler is not None:
        state.scheduler = scheduler.state_dict()
    final = checkpoint_dir(output_dir, state.step)
    tmp = os.path.join(output_dir, f".tmp-{os.path.basename(final)}")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    # Every process writes (its RNG state at least), so a failure is agreed on before anyone
    # goes on: one process raising alone would leave the others in the next collective.
    agree_on_write(accelerator, attempt_write(lambda: _save_state(accelerator, tmp, trainable_only)), tmp, final,
                   output_dir)
    kill_point("save", state.step)

    def finish() -> None:
        write_json(os.path.join(tmp, STATE_FILE), state.state_dict())
        write_json(os.path.join(tmp, MANIFEST), {"step": state.step, "files": _file_sizes(tmp)})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)

    failure = attempt_write(finish) if accelerator.is_main_process else None
    agree_on_write(accelerator, failure, tmp, final, output_dir)
    return final


def _save_state(accelerator, folder: str, trainable_only: bool) -> None:
    if not trainable_only:
        accelerator.save_state(folder)
    elif accelerator.distributed_type == DistributedType.DEEPSPEED:
        accelerator.save_state(folder, exclude_frozen_parameters=True)
    else:
        handle = accelerator.register_save_state_pre_hook(_keep_trainable)
        try:
            accelerator.save_state(folder)
        finally:
            handle.remove()


def _keep_trainable(models, weights, output_dir) -> None:
    """accelerate's pre-save hook: the state dicts about to be written become the trainable weights only,
    named as in the unwrapped model, so that the checkpoint resumes under any number of processes."""
    for i, model in enumerate(models):
        weights[i] = {name: param.detach() for name, param in _trainable(model).items()}


def _trainable(model) -> dict:
    return {name: param for name, param in extract_model_from_parallel(model).named_parameters() if param.requires_grad}


def _load_state(accelerator, folder: str, trainable_only: bool) -> None:
    if not trainable_only:
        accelerator.load_state(folder)
    elif accelerator.distributed_type == DistributedType.DEEPSPEED:
        accelerator.load_state(folder, load_module_strict=False)
    else:
        handle = accelerator.register_load_state_pre_hook(_load_trainable)
        try:
            accelerator.load_state(folder)
        finally:
            handle.remove()


def _load_trainable(models, input_dir) -> None:
    """accelerate's pre-load hook: loads a trainable-only checkpoint, which must hold exactly the
    model's trainable tensors, and takes the models off accelerate's list so it loads nothing more."""
    for i, model in enumerate(models):
        weights = load_file(os.path.join(input_dir, "model.safetensors" if i == 0 else f"model_{i}.safetensors"))
        trainable = _trainable(model)
        if set(weights) != set(trainable):
            # Not damage: adapter_record.check_resume names the setting that differs where the
            # checkpoint records it or its tensors show it; this is what is left.
            raise UsageError(f"checkpoint {input_dir} holds {len(weights)} adapter weights where this run's adapter "
                             f"trains {len(trainable)}, under other names: it was written with other --peft settings "
                             "or for another model; resume it with those, or start a new run in another --output_dir")
        with torch.no_grad():
            for name, param in trainable.items():
                param.copy_(weights[name])
    models.clear()


def attempt_write(write) -> OSError | None:
    """Runs `write()`; returns the OSError it raised (a full disk, a read-only folder), else None."""
    try:
        write()
    except OSError as err:
        return err
    except Exception as err:  # noqa: BLE001 - only I/O failures are kept, the rest re-raised
        # The Rust writers (tokenizers, safetensors) raise plain exceptions that end in
        # "(os error 28)" rather than an OSError.
        code = _RUST_OS_ERROR.search(str(err))
        if code is None:
            raise
        return OSError(int(code.group(1)), os.strerror(int(code.group(1))))
    return None


def agree_on_write(accelerator, failure: OSError | None, partial: str, target: str, output_dir: str) -> None:
    """Raises WriteError on every process if `failure` happened on any, after removing `partial`.

    One all-reduce decides (a barrier when no process failed), so all processes stop together.
    The message names the target, the free space left and the newest complete checkpoint in
    `output_dir`, which is only looked up when a write failed.
    """
    failed = failure is not None
    if accelerator.num_processes > 1:
        flag = torch.tensor([float(failed)], device=accelerator.device)
        failed = bool(accelerator.reduce(flag, reduction="sum").item())
    else:
        accelerator.wait_for_everyone()
    if not failed:
        return
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    intact = list_checkpoints(output_dir)
    kept = f"{intact[-1]} is intact" if intact else "no earlier checkpoint exists"
    raise WriteError(f"{could_not_write(target, failure)}; {kept}, and nothing half-written was left: free space "
                     "and rerun with --resume_from_checkpoint auto")


def could_not_write(target: str, failure: OSError | None) -> str:
    """"could not write TARGET (reason; N MiB free in its folder)": what every failed write says first."""
    reason = (failure.strerror or type(failure).__name__) if failure is not None else "failed on another process"
    folder = os.path.dirname(os.path.abspath(target))
    free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
    return f"could not write {target} ({reason}; {free / 2**20:.1f} MiB free in {folder})"


def _file_sizes(folder: str) -> dict[str, int]:
    """Every file under `folder` (DeepSpeed writes subfolders) by relative path, with its size."""
    sizes = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            sizes[os.path.relpath(path, folder)] = os.path.getsize(path)
    return dict(sorted(sizes.items()))


def load_checkpoint(accelerator, path: str, state, scheduler=None, *, trainable_only: bool = False) -> None:
    """Restores model, optimizer, RNG, `state` and `scheduler` from a complete checkpoint.

    Every tensor file is read with weights_only=True (accelerate's default), so a checkpoint
    cannot run code. One that fails to load is reported as a UsageError naming it.
    `trainable_only`: the checkpoint was saved so (see save_checkpoint).
    """
    if any(name.startswith("custom_checkpoint_") for name in os.listdir(path)):
        raise UsageError(f"checkpoint {path} was written by an earlier version that pickled its scheduler "
                         "(custom_checkpoint_*.pkl), which is not unpickled for safety; resume it with that "
                         "version, or start over with --overwrite_output_dir")
    try:
        _load_state(accelerator, path, trainable_only)
        with open(os.path.join(path, STATE_FILE), encoding="utf-8") as f:
            state.load_state_dict(json.load(f))
        if scheduler is not None:
            scheduler.load_state_dict(state.scheduler)
    except UsageError:
        raise
    except (OSError, RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError, SafetensorError) as err:
        if str(err).startswith("Error(s) in loading state_dict"):
            raise UsageError(_another_model(path, str(err))) from None
        reason = first_line(err)
        raise UsageError(f"checkpoint {path} could not be loaded ({type(err).__name__}: {reason[:200]}); it is "
                         "damaged: pass an earlier checkpoint, or 'auto' after deleting this one") from None


def _another_model(path: str, error: str) -> str:
    """The line for a checkpoint whose model's tensors are not this run's (torch's load_state_dict
    `error`): the checkpoint is whole, the run builds another model."""
    detail = " ".join(line.strip() for line in error.splitlines()[1:] if line.strip()).rstrip(". ")
    hint = "resume with the flags that wrote it (--config_name, --peft and the like)"
    if detail == 'Missing key(s) in state_dict: "lm_head.weight"':
        hint = ("it was written before this project gave T5 v1.1's output layer weights of its own (as Google's T5 "
                "v1.1 has): finish that run with the version that started it, or start afresh")
    return f"checkpoint {path} holds another model than this run builds ({detail[:200]}): {hint}"


def rotate_checkpoints(output_dir: str, keep: int, keep_step: int | None = None) -> None:
    """Deletes the oldest complete checkpoints so that `keep` remain (0 keeps all).

    The newest is always among those kept, and so is the checkpoint of `keep_step` (the best
    evaluation) when it exists, so that rotation never loses the run's best state.
    """
    if keep <= 0:
        return
    protected = checkpoint_dir(output_dir, keep_step) if keep_step is not None else None
    for path in list_checkpoints(output_dir)[:-keep]:
        if path != protected:
            shutil.rmtree(path, ignore_errors=True)


def check_output_dir(output_dir: str, overwrite: bool, resume_from_checkpoint: str | None) -> str | None:
    """Checks that the run may write to `output_dir`; returns the checkpoint to resume from, if any.

    A non-empty folder is only written to when resuming from it or with --overwrite_output_dir.
    Runs first, on every process, and writes nothing: the folder is created (and an earlier run
    in it deleted) once every input has been checked (`run_dir.start_output_dir`), so a refused
    run leaves no trace.
    """
    resume = resolve_resume(resume_from_checkpoint, output_dir)
    if resume or not os.path.isdir(output_dir) or not os.listdir(output_dir):
        return resume
    if not overwrite:
        if resume_from_checkpoint == "auto":
            raise UsageError(f"--output_dir {output_dir} is not empty but holds no complete checkpoint to resume; "
                             "add --overwrite_output_dir to start over there, or choose a new folder")
        raise UsageError(f"--output_dir {output_dir} is not empty; pass --overwrite_output_dir to start over there, "
                         "--resume_from_checkpoint auto to continue, or choose a new folder")
    return None
