"""What an adapter checkpoint was trained with, recorded in it and checked before it is resumed.

A checkpoint of a `--peft` run holds the adapter's weights alone (checkpoint.save_checkpoint's
`trainable_only`): resuming takes the adapter's settings from this run's flags and its frozen base
from --model_name_or_path again (or draws it again from --config_name and --seed). Either may have
changed since, and neither shows in the adapter's tensors when only a number such as --lora_alpha
differs. So every fine-tuning checkpoint records (`TrainState.adapter`, from `describe`) the method,
the settings that decide what the adapter computes, and its base: where it came from and a
fingerprint of its frozen weights. `check_resume` compares them with this run's before anything is
loaded and refuses a difference in one line that names the setting, both values and the fix; without
it, a mismatch failed inside the load and was reported as a damaged checkpoint.

Checkpoints written before this record: what their tensors show (the method, and LoRA's targets,
rank and DoRA; IA3's targets; the number of virtual tokens) is checked; alpha, dropout and the base
cannot be, and are taken as this run's.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch
from safetensors import SafetensorError, safe_open

from t5_training import adapters, checkpoint
from t5_training.errors import UsageError

# The flags that decide what each method's adapter computes and how it trains, in the order a
# difference is reported. --prompt_init and --prompt_init_text only choose the starting values,
# which the checkpoint's replace, so they are recorded but not checked.
CHECKED = {
    "lora": ("lora_target_modules", "lora_r", "lora_alpha", "lora_dropout", "use_dora"),
    "ia3": ("ia3_target_modules", "ia3_feedforward_modules"),
    "prompt_tuning": ("num_virtual_tokens",),
}
_RECORDED = {**CHECKED, "prompt_tuning": ("num_virtual_tokens", "prompt_init", "prompt_init_text")}
# Values sampled from each frozen tensor for the fingerprint: enough that another seed or another
# pretrained model differs, few enough to cost nothing on a large model or a GPU.
_SAMPLES = 64


def describe(config, model) -> dict:
    """This run's record: {"peft": method} and, with an adapter, its "settings" and its "base".

    `model` is the model `adapters.apply` returned, before accelerate prepares it (ZeRO-3 would
    partition its weights). Target modules are recorded as peft resolved them, so that leaving
    --lora_target_modules unset and naming the default targets are the same.
    """
    if not adapters.in_use(config):
        return {"peft": "none"}
    resolved = model.active_peft_config
    settings = {name: getattr(config, name) for name in _RECORDED[config.peft]}
    for name, attribute in (("lora_target_modules", "target_modules"), ("ia3_target_modules", "target_modules"),
                            ("ia3_feedforward_modules", "feedforward_modules")):
        if name in settings:
            settings[name] = ",".join(sorted(getattr(resolved, attribute) or ()))
    base = {"model_name_or_path": config.model_name_or_path, "config_name": config.config_name,
            # A base drawn at random is decided by the seed it was drawn with.
            "seed": None if config.model_name_or_path else config.seed,
            "fingerprint": fingerprint(model)}
    return {"peft": config.peft, "settings": settings, "base": base}


def fingerprint(model) -> str | None:
    """A hash of values sampled evenly from every frozen weight, or None where they are partitioned (ZeRO-3)."""
    digest = hashlib.sha256()
    for param in model.parameters():
        if param.requires_grad:
            continue
        if hasattr(param, "ds_id"):  # DeepSpeed ZeRO-3 holds a shard of it on this process
            return None
        flat = param.detach().reshape(-1)
        picks = torch.linspace(0, flat.numel() - 1, min(_SAMPLES, flat.numel()), device=flat.device).long()
        digest.update(str(tuple(param.shape)).encode())
        # float64 holds every value of every float type exactly, so the bytes depend on the values alone.
        digest.update(flat[picks].to(torch.float64).cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def saved_record(path: str) -> dict:
    """The record checkpoint `path` holds; for one written before records, what its tensors show ({} if nothing)."""
    try:
        with open(os.path.join(path, checkpoint.STATE_FILE), encoding="utf-8") as f:
            record = json.load(f).get("adapter")
    except (OSError, ValueError, AttributeError):
        return {}  # the load that follows names what is wrong with the file
    return record if record else inferred_record(os.path.join(path, "model.safetensors"))


def inferred_record(weights: str) -> dict:
    """The method and settings that a checkpoint's tensor names and shapes show (DeepSpeed's files are not read)."""
    try:
        with safe_open(weights, framework="pt") as f:
            shapes = {name: f.get_slice(name).get_shape() for name in f.keys()}
    except (OSError, SafetensorError, ValueError):
        return {}

    def targets(marker: str) -> str:
        return ",".join(sorted({name.split(marker)[0].rsplit(".", 1)[-1] for name in shapes if marker in name}))

    if any(".lora_A." in name for name in shapes):
        rank = next(shape[0] for name, shape in shapes.items() if ".lora_A." in name)
        return {"peft": "lora", "settings": {"lora_target_modules": targets(".lora_A."), "lora_r": rank,
                                             "use_dora": any("lora_magnitude_vector" in name for name in shapes)}}
    if any(".ia3_l." in name for name in shapes):
        return {"peft": "ia3", "settings": {"ia3_target_modules": targets(".ia3_l.")}}
    prompt = [shape for name, shape in shapes.items() if name.startswith("prompt_encoder.")]
    if prompt:
        return {"peft": "prompt_tuning", "settings": {"num_virtual_tokens": prompt[0][0]}}
    return {"peft": "none"}


def check_resume(path: str | None, now: dict) -> None:
    """Refuses to resume checkpoint `path` (None: not resuming) with another adapter or base than it was trained with."""
    if path:
        check_same_adapter(saved_record(path), now, path)


def _flag(name: str, value) -> str:
    if isinstance(value, bool):
        return f"--{name} {str(value).lower()}"
    return f"--{name} {value}" if value not in (None, "") else f"no --{name}"


def _base(base: dict) -> str:
    if base.get("model_name_or_path"):
        return f"--model_name_or_path {base['model_name_or_path']}"
    return f"--config_name {base.get('config_name')} drawn with --seed {base.get('seed')}"


def check_same_adapter(saved: dict, now: dict, path: str) -> None:
    """Refuses, in one line naming the setting, the checkpoint's value, this run's and the fix, a resume whose
    adapter or base differs from the checkpoint's. `saved` may be partial (an older checkpoint's, inferred)."""
    if not saved:
        return
    new_run = "or start a new run in another --output_dir"
    if saved["peft"] != now["peft"]:
        fix = "without --peft" if saved["peft"] == "none" else "with " + " ".join(
            [f"--peft {saved['peft']}"] + [_flag(name, saved["settings"][name]) for name in CHECKED[saved["peft"]]
                                          if name in saved.get("settings", {})])
        raise UsageError(f"checkpoint {path} was trained with --peft {saved['peft']}, but this run has --peft "
                         f"{now['peft']}; resume it {fix}, {new_run}")
    for name in CHECKED.get(now["peft"], ()):
        if name in saved.get("settings", {}) and saved["settings"][name] != now["settings"][name]:
            was, have = _flag(name, saved["settings"][name]), _flag(name, now["settings"][name])
            raise UsageError(f"checkpoint {path} was trained with {was}, but this run has {have}; resume it with "
                             f"{was}, {new_run}")
    before, base = saved.get("base"), now.get("base")
    if not before or not base:
        return
    if before["fingerprint"] and base["fingerprint"]:
        if before["fingerprint"] == base["fingerprint"]:
            return  # the same frozen weights, wherever they were loaded from
    elif _base(before) == _base(base):
        return
    moved = " (that model has changed since)" if _base(before) == _base(base) else ""
    raise UsageError(f"checkpoint {path} adapts the frozen base model of {_base(before)}{moved}, but this run's "
                     f"base ({_base(base)}) has other weights; resume it with {_base(before)}, {new_run}")
