"""FineTuneConfig: the flags of fine_tune_t5.py (and `t5-fine-tune`), and the combinations it refuses.

The shared training and model flags come from t5_training/config.py, the adapter's from
adapters.py, the mixture's from mixture.py; this class adds the data and evaluation flags and
checks them together before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from t5_training import adapters, mixture
from t5_training.config import ModelConfig, TrainingConfig
from t5_training.errors import UsageError
from t5_training.registry import DATASET_VALS


@dataclass(frozen=True)
class FineTuneConfig(ModelConfig, adapters.AdapterConfig, mixture.MixtureConfig, TrainingConfig):
    """Flags of fine_tune_t5.py: the shared training and model flags, the adapter (--peft), the mixture, the data."""

    benchmark: str = field(default="glue", metadata={"help": "A key of DATASET_VALS: glue, seq2seq, embedded."})
    dataset_name: str = field(default="sst2", metadata={"help": "A task of the benchmark, e.g. sst2, mnli; or a "
                                                                "mixture: all, or a comma list (cola,sst2,mrpc)."})
    data_dir: str | None = field(default=None, metadata={"help": "Folder with the task's original files; for a "
                                                                 "mixture, the folder holding each task's folder."})
    train_file: str | None = field(default=None, metadata={"help": "CSV/TSV/JSONL training rows."})
    validation_file: str | None = field(default=None, metadata={"help": "CSV/TSV/JSONL evaluation rows."})
    max_source_length: int = 512
    mode_token: str | None = field(
        default=None, metadata={"help": "A token put before every source (training, evaluation, prediction), e.g. "
                                        "[NLU]: UL2 fine-tunes a model pretrained with --objective ul2 in a mode."})
    max_target_length: int = 64
    max_train_samples: int | None = field(default=None, metadata={"help": "Use the first N rows; 0 means all."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use the first N rows; 0 means all."})
    group_by_length: bool = field(default=False, metadata={"help": "Batch rows of similar length together, "
                                                                     "so dynamic padding pads little."})
    eval_decoding: Literal["auto", "generate", "score"] = field(
        default="auto", metadata={"help": "'score': one forward pass over the label candidates, with greedy "
                                          "decoding's exact predictions (classification); 'auto': score "
                                          "where it applies, else generate."}
    )
    rouge_use_stemmer: bool = field(
        default=False, metadata={"help": "Porter-stem words before ROUGE. T5 reports ROUGE unstemmed (the default); "
                                         "stemmed scores are higher and not comparable with T5's."})
    project_name: str = field(default="t5-fine-tune", metadata={"help": "Tracker (W&B) project."})
    do_train: bool = field(
        default=True, metadata={"help": "Train. false: only evaluate --model_name_or_path on the eval splits "
                                        "(and predict, with --do_predict): no optimizer, no checkpoints. An "
                                        "adapter run's best/ or final/ (prompt tuning's too) or its adapter/ "
                                        "loads with its base, through peft; no --peft."})
    do_predict: bool = field(
        default=False, metadata={"help": "Predict the unlabelled test splits with the final model and write the "
                                         "leaderboard's files: submission/<Task>.tsv and submission.zip, and "
                                         "predict_results.json (per file: outputs that named no label and were "
                                         "written as a fallback, warned about on stderr; files not written)."})

    @property
    def resolved_learning_rate(self) -> float:
        """--learning_rate; unset, an adapter's own rate under AdamW (adapters.LEARNING_RATES), else the
        optimizer's default. Adafactor keeps T5's 1e-3: its steps are relative to each weight's scale."""
        adapter_rate = adapters.default_learning_rate(self)
        if self.learning_rate is None and adapter_rate is not None and self.optim in ("adamw_torch", "adamw_scale"):
            return adapter_rate
        return super().resolved_learning_rate

    def __post_init__(self):
        # The order picks the error several bad flags get: model, adapter, training, this script's, the
        # mixture's (registry).
        self.check_model_flags()
        self.check_adapter_flags()
        self.check_training_flags()
        if self.max_source_length < 2 or self.max_target_length < 2:
            raise UsageError("--max_source_length and --max_target_length must be at least 2 (text + EOS)")
        for name in ("max_train_samples", "max_eval_samples"):
            if (getattr(self, name) or 0) < 0:
                raise UsageError(f"--{name} must be >= 0 (0 or unset means every row), got {getattr(self, name)}")
        if bool(self.train_file) != bool(self.validation_file):
            raise UsageError("pass both --train_file and --validation_file, or neither")
        if not self.do_train:
            self._check_evaluation_only()
        if self.benchmark in DATASET_VALS:  # an unknown one is named when the run starts
            self.check_mixture_flags(mixture.task_names(DATASET_VALS[self.benchmark], self.dataset_name))

    def check_given(self, given: frozenset[str]) -> None:
        """Refuses adapter flags under --do_train false, which reads an adapter with its settings, then the rest."""
        typed = [f"--{name}" for names in adapters.METHOD_FLAGS.values() for name in names if name in given]
        if typed and not self.do_train:
            raise UsageError(f"{' and '.join(typed)} set{'s' if len(typed) == 1 else ''} up an adapter to train, and "
                             "--do_train false trains nothing (an adapter is read from --model_name_or_path's export, "
                             f"with its own settings): drop {'it' if len(typed) == 1 else 'them'}")
        super().check_given(given)

    def _check_evaluation_only(self):
        if not self.model_name_or_path:
            raise UsageError("--do_train false evaluates a trained model: pass it as --model_name_or_path "
                             "(e.g. runs/sst2/best)")
        if self.resume_from_checkpoint:
            raise UsageError("--resume_from_checkpoint continues training; with --do_train false pass the model "
                             "as --model_name_or_path instead")
        if self.peft != "none":
            raise UsageError(f"--peft {self.peft} trains a new adapter; with --do_train false pass the trained "
                             "model's export (its best/ or final/, which hold the adapter and name its base) as "
                             "--model_name_or_path, without --peft")
        mixing = self.mixture_flags_set()
        if mixing:
            one = len(mixing) == 1
            raise UsageError(f"{' and '.join(mixing)} {'sets' if one else 'set'} how training draws rows from a "
                             "mixture's tasks, and --do_train false trains nothing (it evaluates every task on all its "
                             f"rows): drop {'it' if one else 'them'}")
