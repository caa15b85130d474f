"""Where a tokenizer or model comes from, checked before transformers reads it: a local path that
does not exist or is a run's folder, a shipped model shape named bare ("t5-small"), a shape no model
can have, a config file that ships code, and a loader's error made one line that names the fix."""
from __future__ import annotations

import json
import os

from huggingface_hub.errors import StrictDataclassError

from t5_training import checkpoint
from t5_training.errors import UsageError, first_line


def check_local_path(name: str, what: str) -> None:
    """Refuses a name that can only be a local path (absolute, ./ ../ ~, several folders deep, or a .json
    file) where nothing exists, before transformers tries the hub with it and reports a network or
    repo-id error instead of the typo."""
    path = os.path.expanduser(name)
    if os.path.exists(path):
        check_not_a_run_folder(path, what)
        return
    local = (name.startswith(("/", ".", "~")) or name.endswith(".json")
             or len([part for part in name.split("/") if part]) > 2)
    if local:
        raise UsageError(f"{what} {name!r}: no such file or folder; check the path (a hub name has the form "
                         "'name' or 'org/name')")


def check_not_a_run_folder(path: str, what: str) -> None:
    """Refuses a training checkpoint or a run's output folder where a model is asked for: neither
    holds a config.json, and transformers would answer that the model is unrecognised."""
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")):
        return
    if checkpoint.has_checkpoint_files(path):
        raise UsageError(f"{what} {path!r} is a training checkpoint, not a model: continue its run with "
                         "--resume_from_checkpoint and that run's --output_dir, or start from the run's "
                         "final/ or best/ folder")
    exports = [sub for sub in ("final", "best") if os.path.exists(os.path.join(path, sub, "config.json"))]
    if exports:
        raise UsageError(f"{what} {path!r} is a run's output folder, not a model: pass its "
                         f"{' or '.join(sub + '/' for sub in exports)} folder, e.g. {os.path.join(path, exports[0])}")


# The model shapes in configs/: beside the package in a checkout, inside it in an installed wheel
# (pyproject maps configs/ to t5_training/configs), so a name works the same in both.
_PACKAGE = os.path.dirname(os.path.abspath(__file__))
SHIPPED_CONFIG_DIRS = (os.path.join(_PACKAGE, "configs"), os.path.join(os.path.dirname(_PACKAGE), "configs"))


def resolve_config_name(name: str) -> str:
    """A shipped model shape's JSON for a bare name ("t5-small"), else `name` unchanged.

    A path that exists wins, and so does a hub name that is not shipped: only names of files in
    configs/ are resolved here. "configs/t5-small.json", as README and the defaults write it, finds
    the shipped file too when run outside a checkout.
    """
    if os.path.exists(name):
        return name
    folder, base = os.path.split(os.path.normpath(name))
    if folder not in ("", "configs"):
        return name
    for folder in SHIPPED_CONFIG_DIRS:
        path = os.path.join(folder, base if base.endswith(".json") else f"{base}.json")
        if os.path.isfile(path):
            return path
    return name


# A T5 shape's sizes and counts; each must be a positive whole number (vocab_size is the tokenizer's).
SHAPE_FIELDS = ("d_model", "d_kv", "d_ff", "num_heads", "num_layers", "num_decoder_layers",
                "relative_attention_num_buckets", "relative_attention_max_distance")


def check_shape(config, source: str) -> None:
    """Refuses a model shape with a size or count below 1, which would crash in weight init or build no layers."""
    for name in SHAPE_FIELDS:
        value = getattr(config, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UsageError(f"--config_name {source}: {name} is {value!r}; it must be a whole number of at least 1")


def check_code_beside(config_path: str) -> None:
    """Refuses a config file whose auto_map names code of its own: transformers imports that code only
    from the folder or repo it sits in, and given the file alone fails with a repo-id error."""
    if not os.path.isfile(config_path):
        return
    try:
        with open(config_path, encoding="utf-8") as f:
            ships_code = "auto_map" in json.load(f)
    except (OSError, ValueError, TypeError):
        return  # transformers reports a file it cannot read, with its own first line
    if ships_code:
        folder = os.path.dirname(config_path) or "."
        raise UsageError(f"--config_name {config_path!r} names code of its own (auto_map), which loads only from "
                         f"its folder: pass --config_name {folder} (the config as config.json beside its code), and "
                         "--trust_remote_code if you trust that code")


def load_error(what: str, source: str, err: Exception) -> UsageError:
    """One line for a loader's error: its first line (all of a config field's type error, which puts
    the type on the next), or, where transformers refused to run the code a folder or repo ships, the
    flag that allows it."""
    text = str(err)
    if "trust_remote_code=True" in text:
        # transformers' own line names a hub URL even for a local folder and the Python argument, not our flag.
        return UsageError(f"{what} {source!r} ships its own code (auto_map in its config), which runs only with "
                          "--trust_remote_code: read that code, and pass --trust_remote_code if you trust it")
    if isinstance(err, StrictDataclassError):
        detail = " ".join(line.strip() for line in text.splitlines() if line.strip())
    else:
        detail = first_line(err)
    return UsageError(f"could not load {what} {source!r}: {detail[:300]}")
