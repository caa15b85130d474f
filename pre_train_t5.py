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

import torch
from accelerate.utils import set_seed

import denoisers
from data_collator_t5 import DataCollatorForPrefixLM, DataCollatorForT5MLM
from t5_training import agreement, batch_size, corpus, data, evaluation, loop, run_dir, runtime
from t5_training.config import OPTIMIZERS, SCHEDULERS, ModelConfig, TrainingConfig, parse_config
from t5_training.samplers import EpochNumberedSampler
from t5_training.errors import UsageError, run_cli
from t5_training.modeling import check_lengths, load_tokenizer_and_model
from t5_training.modeling import has_sentinels


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

    def _check_objective(self):
        # An unset --objective is span corruption, or the mixture a --denoisers file lists.
        if self.objective is None:
            object.__setattr__(self, "objective", "ul2" if self.denoisers else "span_corruption")
        if self.denoisers and self.objective != "ul2":
            raise UsageError(f"--denoisers lists a mixture of denoisers, which --objective {self.objective} is not; "
                             "drop --objective (or pass --objective ul2)")
        if self.objective == "ul2" and (self.noise_density, self.mean_noise_span_length) != SPAN_NOISE:
            raise UsageError("--noise_density and --mean_noise_span_length are span corruption's; with --objective "
                             "ul2 each denoiser has its own: list them in a --denoisers file")

    def check_given(self, given: frozenset[str]) -> None:
        """Refuses span corruption's flags, typed (`given`) even at their defaults, with another objective."""
        typed = [f"--{name}" for name in ("noise_density", "mean_noise_span_length") if name in given]
        if not typed or self.objective == "span_corruption":
            return
        flags, one = " and ".join(typed), len(typed) == 1
        flags += " is span corruption's" if one else " are span corruption's"
        if self.objective == "ul2":
            raise UsageError(f"{flags}; with --objective ul2 each denoiser has its own: list them in a --denoisers "
                             "file")
        raise UsageError(f"{flags}; --objective prefix_lm corrupts no spans (it cuts each chunk into a prefix and its "
                         f"continuation): drop {'it' if one else 'them'}, or use --objective span_corruption")


def main(argv: list[str] | None = None) -> dict:
    """Parses, builds, prepares, resumes, trains and exports; returns the final results."""
    config = parse_config(PreTrainConfig, argv)
    resume_path = run_dir.check_output_dir(config)
    accelerator = runtime.build_accelerator(config, fixed_shapes=fixed_batch_shapes(config))
    set_seed(config.seed)
    tokenizer, model = load_tokenizer_and_model(config)
    collator = build_collator(config, tokenizer)
    check_lengths(model, max_seq_length=config.max_seq_length)

    train_data, eval_data = agreement.main_process_first(
        accelerator, lambda: build_corpus(config, tokenizer, collator.raw_length, accelerator))
    config = batch_size.find_batch_size(accelerator, config, model, lambda n: longest_batch(collator, tokenizer, n))
    train_loader, eval_loader = build_loaders(config, train_data, eval_data, collator)

    # A stream is not sharded by accelerate: each process already reads its own share of it.
    run = runtime.prepare(accelerator, config, model, train_loader, {"validation": eval_loader},
                          shard_train_loader=not config.streaming)
    drawn = mixture_record(config, collator)
    state = run_dir.resume(accelerator, config, resume_path, loop.TrainState(), run.scheduler,
                           streaming=config.streaming,
                           check=lambda saved, path: denoisers.check_same_mixture(saved.mixture, drawn, path))
    state.mixture = drawn
    runtime.init_trackers(accelerator, config, config.project_name)
    objective = loop.Objective("loss", greater_is_better=False)
    # A mixture's held-out loss is also reported per denoiser, as eval/<name>/loss.
    names = [d.name for d in collator.denoisers] if config.objective == "ul2" else []
    evaluate = evaluation.make_teacher_forced_evaluator(accelerator, run.eval_loaders["validation"], names)
    state = loop.train(accelerator, config, run, state, objective=objective, evaluate=evaluate,
                       export=run_dir.exporter(accelerator, tokenizer, config.output_dir))
    run_dir.export_final(accelerator, run.model, tokenizer, config.output_dir)
    results = run_dir.write_results(accelerator, config, state, objective, run.batches_per_epoch)
    runtime.close(accelerator)
    return results


def fixed_batch_shapes(config: PreTrainConfig) -> bool:
    """Whether every batch has one shape, for --torch_compile: span corruption's and the prefix LM's
    rows are as wide as their chunk; UL2 pads targets to the longest of the denoisers a batch drew."""
    return config.objective != "ul2"


def build_collator(config: PreTrainConfig, tokenizer):
    """The objective's collator; it fixes the raw chunk length the corpus is packed to."""
    if not has_sentinels(tokenizer):
        raise UsageError(f"tokenizer {config.tokenizer_name or config.model_name_or_path!r} has no sentinel tokens "
                         "<extra_id_0..99>; train one with `python -m t5_training.tokenizer`")
    if config.objective == "prefix_lm":
        return DataCollatorForPrefixLM(tokenizer, raw_length=config.max_seq_length - 1, seed=config.seed)
    if config.objective == "ul2":
        return build_mixture_collator(config, tokenizer)
    try:
        return DataCollatorForT5MLM(tokenizer, input_length=config.max_seq_length, noise_density=config.noise_density,
                                    mean_noise_span_length=config.mean_noise_span_length, seed=config.seed)
    except ValueError as err:
        raise UsageError(str(err)) from None


def mixture_record(config: PreTrainConfig, collator) -> dict:
    """What a UL2 run draws from, for its checkpoints; other objectives record nothing."""
    if config.objective != "ul2":
        return {}
    return denoisers.describe(collator.denoisers, collator.rates, collator.input_length)


def build_mixture_collator(config: PreTrainConfig, tokenizer) -> denoisers.DataCollatorForDenoiserMixture:
    """--objective ul2: UL2's mixture of denoisers, or the one --denoisers lists; each batch row draws its own."""
    mixture, rates = denoisers.read_mixture(config.denoisers)
    missing = denoisers.missing_mode_tokens(tokenizer, mixture)
    if missing:
        raise UsageError(
            f"tokenizer {config.tokenizer_name or config.model_name_or_path!r} has no mode tokens {missing}, which "
            "--objective ul2 puts before each input; train one with `python -m t5_training.tokenizer` (it adds "
            f"{', '.join(denoisers.MODE_TOKENS)}), or add them with tokenizer.add_special_tokens("
            f"{{'additional_special_tokens': {missing}}}), save it and resize the model's embeddings "
            "(model.resize_token_embeddings(len(tokenizer)))")

    def build(input_length: int):
        return denoisers.DataCollatorForDenoiserMixture(tokenizer, input_length=input_length, denoisers=mixture,
                                                        rates=rates, seed=config.seed)

    try:
        return build(config.max_seq_length)
    except ValueError as err:
        # Too many noise spans for the sentinels: the longest input that fits is the fix to offer.
        fits = next((n for n in range(config.max_seq_length - 1, 7, -1) if _builds(build, n)), None)
        hint = f"; --max_seq_length {fits} fits" if fits else ""
        raise UsageError(f"--max_seq_length {config.max_seq_length}: {err}{hint}") from None


def _builds(build, input_length: int) -> bool:
    try:
        build(input_length)
    except ValueError:
        return False
    return True


def longest_batch(collator, tokenizer, n: int) -> dict:
    """n rows at the longest lengths the objective gives: the batch --auto_find_batch_size tries.

    Span corruption's and prefix LM's batches all have one shape; a mixture pads its targets to
    the longest its rows drew, so the probe's are widened to the longest any denoiser writes.
    """
    # "idx" keeps the probe from drawing from the collator's own random stream.
    batch = collator([{"input_ids": [tokenizer.unk_token_id] * collator.raw_length, "idx": i} for i in range(n)])
    if isinstance(collator, denoisers.DataCollatorForDenoiserMixture):
        extra = collator.target_length - batch["labels"].size(1)
        batch["labels"] = torch.nn.functional.pad(batch["labels"], (0, extra), value=-100)
        batch["decoder_input_ids"] = torch.nn.functional.pad(batch["decoder_input_ids"], (0, extra),
                                                             value=tokenizer.pad_token_id)
    return batch


def build_corpus(config: PreTrainConfig, tokenizer, chunk_length: int, accelerator):
    """(train data, validation chunks): packed in memory, or a stream when --streaming."""
    files = corpus.expand_files(config.train_file) if config.train_file else None
    held_out = corpus.expand_files(config.validation_file, "--validation_file") if config.validation_file else None
    if config.streaming:
        source = files or corpus.load_documents(None, config.dataset_name, config.dataset_config_name, "train",
                                                config.text_column, streaming=True)
        train = corpus.PackedStream(source, tokenizer, chunk_length, text_column=config.text_column,
                                    shuffle_buffer=config.shuffle_buffer_size, seed=config.seed,
                                    rank=accelerator.process_index, world_size=accelerator.num_processes,
                                    eos_between_documents=config.eos_between_documents)
        if held_out is None and files:
            raise UsageError("--streaming needs --validation_file: a stream cannot hold out its own end")
        val_source = held_out or corpus.load_documents(None, config.dataset_name, config.dataset_config_name,
                                                       "validation", config.text_column, streaming=True)
        stream = corpus.PackedStream(val_source, tokenizer, chunk_length, text_column=config.text_column, cycle=False,
                                     eos_between_documents=config.eos_between_documents)
        return train, corpus.take_chunks(stream, config.max_eval_samples)
    documents = corpus.load_documents(files, config.dataset_name, config.dataset_config_name, "train",
                                      config.text_column, streaming=False)
    packed = corpus.pack_dataset(documents, tokenizer, chunk_length, config.preprocessing_num_workers,
                                 eos_between_documents=config.eos_between_documents)
    if held_out:
        val_docs = corpus.load_documents(held_out, None, None, "validation", config.text_column, streaming=False)
        val = corpus.pack_dataset(val_docs, tokenizer, chunk_length, eos_between_documents=config.eos_between_documents)
        return packed, val.select(range(min(config.max_eval_samples, len(val))))
    # No held-out files: the corpus's last chunks (at most a tenth of it) become the validation set.
    n_eval = min(config.max_eval_samples, max(1, len(packed) // 10))
    if len(packed) < 2:
        raise UsageError("the corpus packs into a single chunk: add text or pass --validation_file")
    accelerator.print(f"corpus: {len(packed) - n_eval} training and {n_eval} validation chunks of {chunk_length} tokens")
    return packed.select(range(len(packed) - n_eval)), packed.select(range(len(packed) - n_eval, len(packed)))


def build_loaders(config: PreTrainConfig, train_data, eval_data, collator):
    """A training loader (shuffled per epoch, or the stream's own order) and a fixed validation loader."""
    if config.streaming:
        loader_class, order = corpus.StreamLoader, {}
    else:
        loader_class = torch.utils.data.DataLoader
        # As in fine-tuning: an order that depends only on (seed, epoch), and a private generator. Chunks
        # are numbered per epoch, so that each epoch draws their masks anew.
        order = {"sampler": EpochNumberedSampler(len(train_data), config.seed),
                 "generator": torch.Generator().manual_seed(config.seed)}
        train_data = corpus.EpochChunks(train_data)
    train = loader_class(train_data, batch_size=config.per_device_train_batch_size, collate_fn=collator,
                         **data.loader_workers(config, not config.streaming), **order)
    # Workers and pinning as for training: each evaluation reads the whole held-out set.
    evaluation_loader = torch.utils.data.DataLoader(eval_data, batch_size=config.per_device_eval_batch_size,
                                                    collate_fn=collator, **data.loader_workers(config))
    return train, evaluation_loader


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
