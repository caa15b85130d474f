"""The training settings both scripts share, and one parser for flags and config files.

Flag names follow HF `Seq2SeqTrainingArguments` wherever the concept exists, so a flag, a W&B
sweep key and a `wandb.config` key are the same word. Each script subclasses `TrainingConfig`
with its own model and data fields: one frozen dataclass per script. A config holds the flags
as given (None: unset) and is never changed once built: derived values come from functions
(total steps, the precision actually used) or from read-only `resolved_<flag>` properties (the
learning rate and schedule an unset flag means), and records (`config_to_dict`) hold those.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Literal, Sequence, TypeVar

from transformers import HfArgumentParser

from t5_training import flag_words
from t5_training.errors import UsageError

C = TypeVar("C")

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "inverse_sqrt")
OPTIMIZERS = ("adamw_torch", "adafactor", "adamw_scale", "adafactor_hf")
# What an unset --learning_rate / --lr_scheduler_type means for each optimizer. Adafactor's are
# T5's fine-tuning recipe (constant 1e-3); pre_train_t5.py sets T5's pretraining values itself.
OPTIMIZER_DEFAULTS = {"adamw_torch": (3e-4, "linear"), "adamw_scale": (3e-4, "linear"),
                      "adafactor": (1e-3, "constant"), "adafactor_hf": (1e-3, "constant")}


@dataclass(frozen=True)
class TrainingConfig:
    """Settings of the shared training loop (`t5_training.loop`)."""

    output_dir: str = field(default="runs/default", metadata={"help": "Where checkpoints, exports and results go."})
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Start over in a non-empty output_dir: once the inputs are checked, delete "
                                         "what an earlier run wrote there (checkpoints, best/, final/, results, "
                                         "predictions, submission files); files no run writes stay."})
    max_steps: int = field(default=-1, metadata={"help": "Optimizer steps; overrides num_train_epochs when > 0."})
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 32
    gradient_accumulation_steps: int = 1
    learning_rate: float | None = field(
        default=None, metadata={"help": "Peak learning rate. Default: 1e-3 for adafactor and adafactor_hf (T5's "
                                        "fine-tuning rate), 3e-4 otherwise; under AdamW with --peft, the "
                                        "adapter's own (LoRA 5e-4, DoRA 1e-3, IA3 1e-1, prompt tuning 3e-1)."})
    lr_scheduler_type: Literal[SCHEDULERS] | None = field(
        default=None, metadata={"help": "Default: constant for adafactor and adafactor_hf (as T5 fine-tunes), "
                                        "linear otherwise."})
    warmup_steps: int = field(default=0, metadata={"help": "Warmup steps; when > 0 they override --warmup_ratio "
                                                            "(as in HF's Trainer)."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Warmup as a share of the run's steps, used while "
                                                                "--warmup_steps is 0."})
    weight_decay: float = 0.0
    optim: Literal[OPTIMIZERS] = field(
        default="adamw_torch",
        metadata={"help": "adamw_torch (fused AdamW); adafactor: T5's Adafactor (Mesh TF's defaults: updates scaled "
                          "by each weight's RMS, 2nd moment factored for dims >= 128); adamw_scale: AdamW with "
                          "RMS-scaled steps; adafactor_hf: HF's Adafactor with an external lr and NO parameter "
                          "scaling (not T5's recipe; the setting this project used before)"})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping; 0 turns it off."})
    max_nonfinite_steps: int = field(
        default=3, metadata={"help": "Stop after N skipped non-finite steps in a row; 0 skips them without stopping."}
    )
    seed: int = 42
    logging_steps: int = 10
    eval_steps: int = field(default=0, metadata={"help": "Evaluate every N steps; 0 evaluates at the end only."})
    save_steps: int = field(default=0, metadata={"help": "Checkpoint every N steps; 0 saves at the end only."})
    save_total_limit: int = field(default=2, metadata={"help": "Checkpoints kept in output_dir; 0 keeps all."})
    early_stopping_patience: int = field(
        default=0, metadata={"help": "Stop after N evaluations without improvement (needs --eval_steps); 0 never "
                                     "stops early."}
    )
    report_to: Literal["none", "wandb", "tensorboard", "all"] = "none"
    run_name: str | None = None
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "'auto' (newest complete checkpoint in output_dir, if any) or a path."}
    )
    gradient_checkpointing: bool = False
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = field(
        default="auto", metadata={"help": "'auto': bf16 on a GPU that has it, fp32 (no) on CPU."}
    )
    dataloader_num_workers: int = 0
    torch_compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    torch_compile_backend: str = field(default="inductor", metadata={"help": "torch.compile backend."})
    torch_compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = field(
        default="default", metadata={"help": "torch.compile mode: reduce-overhead replays CUDA graphs (fewer "
                                             "kernel launches, more memory), max-autotune also searches kernel "
                                             "configurations (a longer compile)."}
    )
    auto_find_batch_size: bool = field(
        default=False, metadata={"help": "Step the per-device batch down through the divisors of "
                                         "--per_device_train_batch_size (12: 6, 4, 3, 2, 1) until a worst-case "
                                         "step fits in memory, raising accumulation by the same factor so the "
                                         "global batch stays the same."}
    )

    @property
    def resolved_learning_rate(self) -> float:
        """The peak learning rate the run uses: --learning_rate, or the optimizer's default if unset."""
        return OPTIMIZER_DEFAULTS[self.optim][0] if self.learning_rate is None else self.learning_rate

    @property
    def resolved_lr_scheduler_type(self) -> str:
        """The schedule the run uses: --lr_scheduler_type, or the optimizer's default if unset."""
        return OPTIMIZER_DEFAULTS[self.optim][1] if self.lr_scheduler_type is None else self.lr_scheduler_type

    def check_given(self, given: frozenset[str]) -> None:
        """Refuses AdamW's flags, typed (`given`) even at their defaults, with an optimizer that has no betas or epsilon."""
        typed = [f"--{name}" for name in ("adam_beta1", "adam_beta2", "adam_epsilon") if name in given]
        if typed and self.optim not in ("adamw_torch", "adamw_scale"):
            one = len(typed) == 1
            raise UsageError(f"{' and '.join(typed)} {'sets' if one else 'set'} AdamW's moments, and --optim "
                             f"{self.optim} has none of them: drop {'it' if one else 'them'}, or use --optim "
                             "adamw_torch or adamw_scale")

    def __post_init__(self):
        self.check_training_flags()

    def check_training_flags(self) -> None:
        """One line for the first bad value among the training flags (a subclass calls it where its order needs)."""
        positive = ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
        for name in positive:
            if getattr(self, name) < 1:
                raise UsageError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.max_steps < -1:
            raise UsageError(f"--max_steps must be positive (or -1: train --num_train_epochs), got {self.max_steps}")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise UsageError("nothing to train: set --max_steps or --num_train_epochs to a positive number")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise UsageError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        # Counts, and what torch's AdamW would refuse with a traceback (epsilon) or clipping would ignore.
        for name in ("logging_steps", "eval_steps", "save_steps", "save_total_limit", "warmup_steps",
                     "early_stopping_patience", "dataloader_num_workers", "max_nonfinite_steps",
                     "adam_epsilon", "weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise UsageError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.resolved_learning_rate <= 0:
            raise UsageError(f"--learning_rate must be positive, got {self.resolved_learning_rate}")
        # What torch's AdamW and set_seed would refuse with a traceback, or AdamWScale would take.
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UsageError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.seed < 2**32:
            raise UsageError(f"--seed must be in [0, 2**32), got {self.seed}")
        if self.early_stopping_patience and not self.eval_steps:
            raise UsageError(f"--early_stopping_patience {self.early_stopping_patience} counts evaluations without "
                             "improvement, and --eval_steps 0 evaluates once, at the end: set --eval_steps N to "
                             "evaluate every N steps, or drop --early_stopping_patience")


@dataclass(frozen=True)
class ModelConfig:
    """Which model and tokenizer a script starts from (`t5_training.modeling`)."""

    model_name_or_path: str | None = field(default=None, metadata={"help": "Pretrained model: hub name or folder."})
    config_name: str | None = field(default=None, metadata={"help": "Model config JSON (or a configs/ name) for a "
                                                                     "from-scratch model; not with "
                                                                     "--model_name_or_path."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "Defaults to --model_name_or_path."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Run code shipped with a hub model."})
    dropout_rate: float | None = field(default=None, metadata={"help": "Overrides the model config's dropout."})
    freeze_encoder: bool = field(default=False, metadata={"help": "Train no encoder weights."})
    freeze_decoder: bool = field(default=False, metadata={"help": "Train no decoder weights."})
    freeze_embeddings: bool = field(default=False, metadata={"help": "Train neither the token embeddings nor "
                                                                     "the output layer."})

    def check_model_flags(self) -> None:
        """Refuses two sources of a model's shape: a pretrained model's weights come with their own config."""
        if self.model_name_or_path and self.config_name:
            raise UsageError(f"--model_name_or_path {self.model_name_or_path} loads a pretrained model with its own "
                             f"shape, and --config_name {self.config_name} shapes a model trained from scratch: pass "
                             "one of them (--dropout_rate changes a pretrained model's dropout)")


class _Parser(HfArgumentParser):
    """argparse prints usage and exits on a bad value; we want one line the caller can handle."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # For --help alone: parse_config reads the file and takes the flag out before argparse
        # parses, and SUPPRESS keeps it out of the parsed namespace.
        self.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                          help="A YAML or JSON file of flag: value pairs, read first: flags given beside it win.")

    def error(self, message):
        raise UsageError(message)


def parse_config(cls: type[C], argv: Sequence[str] | None) -> C:
    """Builds `cls` from command-line words, optionally starting from `--config FILE` (YAML/JSON).

    Values in the file come first, so any flag on the command line overrides them. Both
    `--flag value` and `--flag=value` (what a W&B agent passes) work. An unknown or misspelt
    flag, in the file or on the command line, raises `UsageError` naming the closest flag; so
    does a flag the config's `check_given` finds has nothing to do beside the others given.
    """
    parser = _Parser(cls, allow_abbrev=False)
    lists = {name: action.dest for action in parser._actions if action.nargs in ("+", "*") for name in action.option_strings}
    path, file_words, words = flag_words.split_config_file(flag_words.join_repeated_lists(list(argv or []), lists))
    known = sorted(name for action in parser._actions for name in action.option_strings if name != "--config")
    flag_words.refuse_unknown(words, known, "")
    flag_words.refuse_unknown(file_words, known, f" in --config file {path}")
    flag_words.refuse_file_lists(file_words, lists, path)
    words = file_words + words
    config, remaining = parser.parse_args_into_dataclasses(
        args=words, return_remaining_strings=True, look_for_args_file=False
    )
    if remaining:
        raise UsageError(f"unexpected argument {remaining[0]!r}; flags look like --name value")
    check_given = getattr(config, "check_given", None)
    if check_given is not None:
        check_given(given_flags(parser, words))
    return config


def given_flags(parser: HfArgumentParser, words: Sequence[str]) -> frozenset[str]:
    """The fields that `words` (the command line and the --config file's keys) set, whatever the value.

    A config's `check_given(given)` uses them to refuse a flag the user typed where the other
    flags leave it nothing to do: a value alone cannot tell a typed default from an untouched one.
    """
    fields = {option: action.dest for action in parser._actions for option in action.option_strings}
    names = (flag_words.flag_name(word) for word in words if word.startswith("--"))
    return frozenset(fields[name] for name in names if name in fields)


RESOLVED = "resolved_"


def config_to_dict(config) -> dict:
    """The config as plain values, as the run used them.

    A flag whose config has a `resolved_<flag>` property is recorded as that value, under the
    flag's own name: an unset --learning_rate or --lr_scheduler_type as the optimizer's default,
    pre_train_t5.py's unset --objective as the one it trains. So a record reads the same whether
    a value was typed or left to the default, and never holds None for a value the run had.
    Where a config is written: the trackers' config (W&B's `wandb.config`, tensorboard's hparams),
    through `config_for_trackers` from runtime.init_trackers. Results files and checkpoints hold
    no config; a checkpoint's scheduler state holds the learning rate the optimizer was built with.
    """
    return {name: getattr(config, RESOLVED + name, value) for name, value in dataclasses.asdict(config).items()}


def resolve_objective(objective: str | None, denoisers: str | None) -> str:
    """The pretraining objective of --objective and --denoisers (pre_train_t5.py, dataset_stats): an unset
    --objective is the mixture a --denoisers file lists (ul2), and span corruption without one."""
    if objective is not None:
        return objective
    return "ul2" if denoisers else "span_corruption"


REDACTED = "<redacted>"
# Words that make a name secret wherever they stand (AWS_SECRET_ACCESS_KEY, db_password), and the
# owners of an access token: "token" alone is no secret in a T5 config (tokenizer_name, mode_token,
# num_virtual_tokens are ordinary flags), but hub_token, HF_TOKEN and GITHUB_TOKEN are.
_SECRET_WORDS = {"secret", "secrets", "password", "passwd", "credential", "credentials", "apikey"}
_SECRET_PAIRS = {("api", "key"), ("private", "key"), ("access", "key")}
_TOKEN_OWNERS = {"hub", "hf", "auth", "access", "api", "bearer", "github", "gh", "gitlab", "wandb", "refresh",
                 "session", "oauth", "id"}


def is_secret_name(name: str, environment: bool = False) -> bool:
    """Whether a flag (or, with `environment`, an environment variable) is named like a secret.

    An environment variable ending in TOKEN counts whoever owns it (CI_JOB_TOKEN): only its value
    is looked for, in the values sent. A flag ending in token counts when it names an access token.
    """
    words = [word for word in re.split(r"[^a-z0-9]+", name.lower()) if word]
    if not words:
        return False
    if _SECRET_WORDS & set(words) or _SECRET_PAIRS & set(zip(words, words[1:])):
        return True
    return words[-1] == "token" and (environment or len(words) == 1 or words[-2] in _TOKEN_OWNERS)


def config_for_trackers(config, environ=None) -> dict:
    """The config as sent to W&B or tensorboard, with secrets taken out.

    A flag whose name looks secret is redacted, and so is any value that contains the value of
    a secret-looking environment variable (WANDB_API_KEY, HF_TOKEN, ...), wherever it was pasted.
    """
    environ = os.environ if environ is None else environ
    secrets = [value for name, value in environ.items() if is_secret_name(name, environment=True) and len(value) >= 8]

    def clean(name: str, value):
        if isinstance(value, (list, tuple)):
            # Trackers take scalars (tensorboard's hparams refuses a list): `--train_file a b` is sent as "a, b".
            return ", ".join(str(clean(name, item)) for item in value)
        if is_secret_name(name) and value not in (None, "", False):
            return REDACTED
        if isinstance(value, str) and any(secret in value for secret in secrets):
            return REDACTED
        return value

    return {name: clean(name, value) for name, value in config_to_dict(config).items()}
