"""The runner's settings: the flags of `python -m t5_training.sweep`."""
from __future__ import annotations

from dataclasses import dataclass

from t5_training.errors import UsageError


@dataclass(frozen=True)
class RunnerConfig:
    """Flags of `python -m t5_training.sweep`."""

    sweep_file: str
    output_dir: str
    count: int = 1
    seed: int = 0
    poll_seconds: float = 10.0
    slurm: str | None = None
    parallel: int = 0
    extra: tuple[str, ...] = ()

    def __post_init__(self):
        if self.count < 1:
            raise UsageError(f"--count must be at least 1, got {self.count}")
        if self.poll_seconds <= 0:
            raise UsageError(f"--poll_seconds must be positive, got {self.poll_seconds}")
        if self.parallel < 0:
            raise UsageError(f"--parallel must be >= 0 (0: no limit), got {self.parallel}")
