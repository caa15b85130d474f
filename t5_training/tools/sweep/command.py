"""A trial's command: the YAML's `command:` with its macros filled in as a W&B agent fills them."""
from __future__ import annotations

import sys

from t5_training.errors import UsageError


def trial_command(sweep: dict, trial: dict, trial_dir: str, extra: tuple[str, ...]) -> list[str]:
    """The YAML's command with its macros filled in exactly as a W&B agent does, then the runner's flags."""
    # W&B's own builders: the same --flag=value words, ${envvar:NAME} expansion and formats.
    from wandb.sdk.launch.sweeps import utils as wandb_sweep_utils

    macros = wandb_sweep_utils.create_sweep_command_args({"args": {k: {"value": v}
                                                                   for k, v in trial["params"].items()}})
    # The agent runs "python"; this runner's own interpreter keeps trials in its environment.
    macros.update(env=["/usr/bin/env"], interpreter=[sys.executable], program=[sweep.get("program", "")])
    words = []
    for word in map(str, wandb_sweep_utils.create_sweep_command(list(sweep.get("command") or []))):
        if word.startswith("${") and word.endswith("}"):
            if word[2:-1] not in macros or word == "${program}" and not sweep.get("program"):
                raise UsageError(f"the sweep's command uses {word}, which this runner cannot fill in; "
                                 "use ${program} (with program:), ${args}, ${env} or ${interpreter}")
            words += macros[word[2:-1]]
        else:
            words.append(word)
    return [*words, f"--output_dir={trial_dir}", "--overwrite_output_dir=true", "--resume_from_checkpoint=auto",
            *extra]
