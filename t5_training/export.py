"""Model exports (`best/`, `final/`) that load with `from_pretrained`, without this project.

An export is written under `<path>.tmp` and renamed over `<path>` once complete, through the
same write-and-agree steps as a checkpoint (checkpoint.attempt_write, checkpoint.agree_on_write),
so a failed export leaves the previous one as it was.
"""
from __future__ import annotations

import os
import shutil
from typing import Callable

from transformers.utils import logging as hf_logging

from t5_training import adapters
from t5_training.checkpoint import agree_on_write, attempt_write


def model_state_dict(accelerator, model) -> dict | None:
    """The whole model's weights under their own names (gathered under ZeRO-3: None off its rank 0).

    torch.compile's wrapper holds the model as `_orig_mod`, which accelerate leaves in every name;
    without it the export loads with from_pretrained whether or not the run compiled.
    """
    state_dict = accelerator.get_state_dict(model)
    if state_dict is None:
        return None
    return {name.replace("_orig_mod.", ""): tensor for name, tensor in state_dict.items()}


def export_model(accelerator, model, tokenizer, path: str) -> None:
    """`save_pretrained` of the unwrapped model (gathered under ZeRO-3) and its tokenizer, atomically.

    An adapter model writes its adapter and, where it merges, the merged model (adapters.save_pretrained).
    """
    state_dict = model_state_dict(accelerator, model)
    hf_logging.disable_progress_bar()  # one shard per export; a bar per save only clutters logs
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)

    def fill(tmp: str) -> None:
        if adapters.is_adapter_model(unwrapped):
            adapters.save_pretrained(unwrapped, state_dict, tmp, final=path)
        else:
            unwrapped.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    failure = attempt_write(lambda: write_folder_whole(path, fill)) if accelerator.is_main_process else None
    agree_on_write(accelerator, failure, partial_folder(path), path, os.path.dirname(os.path.abspath(path)))


def partial_folder(path: str) -> str:
    """Where a folder is written before it takes `path`'s place."""
    return os.path.normpath(path) + ".tmp"


def write_folder_whole(path: str, fill: Callable[[str], None]) -> None:
    """`fill(folder)` into partial_folder(path), then that folder in `path`'s place: a reader finds
    the previous folder or the complete new one, never half of one. Exports and the tokenizer's
    folder are written so."""
    tmp = partial_folder(path)
    shutil.rmtree(tmp, ignore_errors=True)
    fill(tmp)
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
