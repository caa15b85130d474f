"""`--slurm`: the sweep as a Slurm job array, one trial per array task (slurm/sweep_offline.sbatch)."""
from __future__ import annotations

import os
import subprocess

from t5_training.errors import CliError, UsageError
from t5_training.tools.sweep.config import RunnerConfig

# In the checkout, beside the package: <repo>/slurm/sweep_offline.sbatch.
SBATCH_SCRIPT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "slurm",
                                              "sweep_offline.sbatch"))


def slurm_array(config: RunnerConfig) -> list[str]:
    """The sbatch command whose array tasks each run one trial of this sweep."""
    array = f"0-{config.count - 1}" + (f"%{config.parallel}" if config.parallel else "")
    script = os.path.relpath(SBATCH_SCRIPT)
    return ["sbatch", f"--array={array}", script, config.sweep_file, config.output_dir,
            *(["--", *config.extra] if config.extra else [])]


def launch_slurm(config: RunnerConfig) -> None:
    command = slurm_array(config)
    print(" ".join(command), flush=True)
    if config.slurm == "submit":
        try:
            subprocess.run(command, check=True)
        except FileNotFoundError:
            raise UsageError("sbatch not found: run the command above on the cluster's login node") from None
        except subprocess.CalledProcessError as err:
            raise CliError(f"sbatch failed with exit code {err.returncode}") from None
