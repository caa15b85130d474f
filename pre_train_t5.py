"""Pretrain a T5 model with span corruption (or prefix LM, or UL2's mixture of denoisers) on a text corpus.

    accelerate launch pre_train_t5.py --config_name configs/t5-small.json --tokenizer_name runs/tok \
        --train_file 'corpus/*.txt' --output_dir runs/pt --max_steps 100000
    accelerate launch pre_train_t5.py --objective ul2 --max_seq_length 384 ...   # or --denoisers mixture.yaml
    accelerate launch pre_train_t5.py --dataset_name allenai/c4 --dataset_config_name en --streaming ...
    accelerate launch fine_tune_t5.py --model_name_or_path runs/pt/final --dataset_name sst2 ...

Defaults follow T5: Adafactor at 1e-2, inverse-sqrt decay after 10k steps, no dropout (T5 1.1),
512-token inputs with 15% noise in spans of mean length 3. Writes the same files as
fine_tune_t5.py; `final/` is a `save_pretrained` model that fine_tune_t5.py loads directly.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Literal

from accelerate.utils import set_seed

from t5_training import agreement, batch_size, denoisers, loop, pretrain_data, run_dir, runtime, teacher_forced
from t5_training.config import OPTIMIZERS, SCHEDULERS, ModelConfig, TrainingConfig, parse_config, resolve_objective
from t5_training.errors import UsageError, run_cli
from t5_training.modeling import check_lengths, load_tokenizer_and_model


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
        super().__post_init__()
        if not self.train_file and not self.dataset_name:
            raise UsageError("no corpus: pass --train_file (text, jsonl or parquet files) or --dataset_name")
        if self.streaming and self.max_steps <= 0:
            raise UsageError("a streamed corpus has no length: set --max_steps")
        if not 0 < self.noise_density < 1:
            raise UsageError(f"--noise_density must be in (0, 1), got {self.noise_density}")
        if self.mean_noise_span_length < 1 or self.max_seq_length < 8 or self.max_eval_samples < 1:
            raise UsageError("--mean_noise_span_length must be >= 1, --max_seq_length >= 8, --max_eval_samples >= 1")
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
        """Refuses span corruption's flags, typed (`given`) even at their defaults, with another objective."""
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


def main(argv: list[str] | None = None) -> dict:
    """Parses, builds, prepares, resumes, trains and exports; returns the final results."""
    config = parse_config(PreTrainConfig, argv)
    resume_path = run_dir.check_output_dir(config)
    accelerator = runtime.build_accelerator(config, fixed_shapes=pretrain_data.fixed_batch_shapes(config))
    set_seed(config.seed)
    tokenizer, model = load_tokenizer_and_model(config)
    collator = pretrain_data.build_collator(config, tokenizer)
    check_lengths(model, max_seq_length=config.max_seq_length)

    train_data, eval_data = agreement.main_process_first(
        accelerator, lambda: pretrain_data.build_corpus(config, tokenizer, collator.raw_length, accelerator))
    longest = pretrain_data.make_longest_batch(collator, tokenizer)
    config = batch_size.find_batch_size(accelerator, config, model, longest)
    train_loader, eval_loader = pretrain_data.build_loaders(config, train_data, eval_data, collator)

    # A stream is not sharded by accelerate: each process already reads its own share of it.
    run = runtime.prepare(accelerator, config, model, train_loader, {"validation": eval_loader},
                          shard_train_loader=not config.streaming)
    drawn = pretrain_data.drawn_from(config, collator)
    state = run_dir.resume(accelerator, config, resume_path, loop.TrainState(), run.scheduler,
                           streaming=config.streaming,
                           check=lambda saved, path: denoisers.check_same_denoisers(saved.mixture, drawn, path))
    state.mixture = drawn
    runtime.init_trackers(accelerator, config, config.project_name)
    objective = loop.Objective("loss", greater_is_better=False)
    # A mixture's held-out loss is also reported per denoiser, as eval/<name>/loss.
    names = [d.name for d in collator.denoisers] if config.resolved_objective == "ul2" else []
    evaluate = teacher_forced.make_evaluator(accelerator, run.eval_loaders["validation"], names)
    state = loop.train(accelerator, config, run, state, objective=objective, evaluate=evaluate,
                       export=run_dir.exporter(accelerator, tokenizer, config.output_dir))
    run_dir.export_final(accelerator, run.model, tokenizer, config.output_dir)
    results = run_dir.write_results(accelerator, config, state, objective, run.batches_per_epoch)
    runtime.close(accelerator)
    return results


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
