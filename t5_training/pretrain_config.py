"""PreTrainConfig: the flags of pre_train_t5.py (and `t5-pretrain`), and the combinations it refuses.

The shared training and model flags come from t5_training/config.py, with T5's pretraining
defaults in place of fine-tuning's; this class adds the corpus and the objective.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from t5_training.config import OPTIMIZERS, SCHEDULERS, ModelConfig, TrainingConfig, resolve_objective
from t5_training.errors import UsageError


SPAN_NOISE = (0.15, 3.0)  # T5's noise density and mean span length, the span-corruption defaults


@dataclass(frozen=True)
class PreTrainConfig(ModelConfig, TrainingConfig):
    """Flags of pre_train_t5.py: the shared training and model flags, plus the corpus and objective."""

    output_dir: str = "runs/pretrain"
    learning_rate: float = 1e-2
    optim: Literal[OPTIMIZERS] = "adafactor"
    lr_scheduler_type: Literal[SCHEDULERS] = "inverse_sqrt"
    warmup_steps: int = 10000
    dropout_rate: float | None = field(default=0.0, metadata={"help": "T5 1.1 pretrains without dropout."})
    train_file: list[str] | None = field(default=None, metadata={"help": "Text, JSONL or parquet files (globs)."})
    validation_file: list[str] | None = field(default=None, metadata={"help": "Held-out files; else the "
                                                                                "corpus's last chunks."})
    dataset_name: str | None = field(default=None, metadata={"help": "A hub dataset instead of files."})
    dataset_config_name: str | None = None
    text_column: str = "text"
    streaming: bool = field(default=False, metadata={"help": "Read the corpus lazily (larger than RAM)."})
    shuffle_buffer_size: int = field(default=10000, metadata={"help": "Chunks held for shuffling a stream."})
    objective: Literal["span_corruption", "prefix_lm", "ul2"] | None = field(
        default=None, metadata={"help": "span_corruption (the default), prefix_lm, or ul2: UL2's mixture of "
                                        "seven denoisers, or the one --denoisers lists (the default with it)."})
    denoisers: str | None = field(
        default=None, metadata={"help": "A YAML list of denoisers for --objective ul2, each with name, kind (span "
                                        "or prefix), mean_noise_span_length, noise_density, mode_token, rate."})
    max_seq_length: int = field(default=512, metadata={"help": "Encoder input length after corruption."})
    noise_density: float = field(
        default=SPAN_NOISE[0], metadata={"help": "Span corruption's share of noise tokens (not with --objective "
                                                 "prefix_lm or ul2)."})
    eos_between_documents: bool = field(
        default=False, metadata={"help": "Put an EOS after each document when packing. T5 packs documents end "
                                         "to end (the default) and appends EOS after corruption only."})
    mean_noise_span_length: float = field(
        default=SPAN_NOISE[1], metadata={"help": "Span corruption's mean noise span length (not with --objective "
                                                 "prefix_lm or ul2)."})
    max_eval_samples: int = field(default=200, metadata={"help": "Validation chunks."})
    preprocessing_num_workers: int | None = None
    project_name: str = field(default="t5-pretrain", metadata={"help": "Tracker (W&B) project."})

    def __post_init__(self):
        self.check_model_flags()
        super().__post_init__()
        if not self.train_file and not self.dataset_name:
            raise UsageError("no corpus: pass --train_file (text, jsonl or parquet files) or --dataset_name")
        if self.streaming and self.max_steps <= 0:
            raise UsageError("a streamed corpus has no length: set --max_steps")
        if not 0 < self.noise_density < 1:
            raise UsageError(f"--noise_density must be in (0, 1), got {self.noise_density}")
        for name, least in (("mean_noise_span_length", 1), ("max_seq_length", 8), ("max_eval_samples", 1)):
            if getattr(self, name) < least:
                raise UsageError(f"--{name} must be at least {least}, got {getattr(self, name)}")
        self._check_objective()

    @property
    def resolved_objective(self) -> str:
        """The objective the run trains: --objective, or if unset the mixture a --denoisers file lists, else span
        corruption."""
        return resolve_objective(self.objective, self.denoisers)

    def _check_objective(self):
        if self.denoisers and self.resolved_objective != "ul2":
            raise UsageError(f"--denoisers lists a mixture of denoisers, which --objective {self.resolved_objective} "
                             "is not; drop --objective (or pass --objective ul2)")
        if self.resolved_objective == "ul2" and (self.noise_density, self.mean_noise_span_length) != SPAN_NOISE:
            raise UsageError("--noise_density and --mean_noise_span_length are span corruption's; with --objective "
                             "ul2 each denoiser has its own: list them in a --denoisers file")

    def check_given(self, given: frozenset[str]) -> None:
        """Refuses span corruption's flags, typed (`given`) even at their defaults, with another objective;
        then the shared flags' checks."""
        super().check_given(given)
        typed = [f"--{name}" for name in ("noise_density", "mean_noise_span_length") if name in given]
        if not typed or self.resolved_objective == "span_corruption":
            return
        flags, one = " and ".join(typed), len(typed) == 1
        flags += " is span corruption's" if one else " are span corruption's"
        if self.resolved_objective == "ul2":
            raise UsageError(f"{flags}; with --objective ul2 each denoiser has its own: list them in a --denoisers "
                             "file")
        raise UsageError(f"{flags}; --objective prefix_lm corrupts no spans (it cuts each chunk into a prefix and its "
                         f"continuation): drop {'it' if one else 'them'}, or use --objective span_corruption")
