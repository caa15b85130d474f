"""Pretraining's data path, as fine-tuning's is t5_training/data.py and multitask.py: the objective's
collator, the corpus packed into chunks (or streamed), the batch that sizes --auto_find_batch_size,
and the loaders.

The collator comes first because it fixes the raw chunk length the corpus is packed to (span
corruption's input length before corruption; a mixture's longest denoiser).
"""
from __future__ import annotations

import torch

from t5_training import corpus, denoisers, device, text_files
from t5_training.collators import DataCollatorForPrefixLM, DataCollatorForT5MLM
from t5_training.errors import UsageError
from t5_training.modeling import has_sentinels
from t5_training.samplers import EpochNumberedSampler


def fixed_batch_shapes(config) -> bool:
    """Whether every batch has one shape, for --torch_compile: span corruption's and the prefix LM's
    rows are as wide as their chunk; UL2 pads targets to the longest of the denoisers a batch drew."""
    return config.resolved_objective != "ul2"


def build_collator(config, tokenizer):
    """The objective's collator; it fixes the raw chunk length the corpus is packed to."""
    if not has_sentinels(tokenizer):
        raise UsageError(f"tokenizer {config.tokenizer_name or config.model_name_or_path!r} has no sentinel tokens "
                         "<extra_id_0..99>; train one with `python -m t5_training.tokenizer`")
    if config.resolved_objective == "prefix_lm":
        return DataCollatorForPrefixLM(tokenizer, raw_length=config.max_seq_length - 1, seed=config.seed)
    if config.resolved_objective == "ul2":
        return build_mixture_collator(config, tokenizer)
    return built_or_refused(lambda n: DataCollatorForT5MLM(
        tokenizer, input_length=n, noise_density=config.noise_density,
        mean_noise_span_length=config.mean_noise_span_length, seed=config.seed), config.max_seq_length)


# The flags that shape each objective's chunks and masks, as its checkpoints record them (after "objective").
RECORDED_FLAGS = {"span_corruption": ("max_seq_length", "noise_density", "mean_noise_span_length"),
                  "prefix_lm": ("max_seq_length",)}


def drawn_from(config, collator) -> dict:
    """What the run's batches are drawn from, as its checkpoints record it (TrainState.mixture): UL2's
    mixture of denoisers (denoisers.denoiser_record), or the objective and the flags that shape its chunks."""
    if config.resolved_objective == "ul2":
        return denoisers.denoiser_record(collator.denoisers, collator.rates, collator.input_length)
    objective = config.resolved_objective
    return {"objective": objective, **{name: getattr(config, name) for name in RECORDED_FLAGS[objective]}}


def check_same_objective(saved: dict, now: dict, path: str) -> None:
    """Refuses to resume from a checkpoint pretrained with another objective, or with other flags shaping
    its chunks and masks: its data position would not point at the batches an uninterrupted run sees next,
    and its best loss would be another task's. A checkpoint of an earlier version records nothing for
    span corruption or the prefix LM, and resumes as before."""
    ul2_saved, ul2_now = "denoisers" in saved, "denoisers" in now
    if saved == now or (not saved and not ul2_now):
        return
    if ul2_now and (ul2_saved or not saved):
        denoisers.check_same_denoisers(saved, now, path)
    elif ul2_saved:
        denoisers.check_same_denoisers(saved, {}, path)  # its message for a UL2 checkpoint and another objective

    def flags(record):  # in RECORDED_FLAGS' order: a checkpoint's JSON comes back with its keys sorted
        if "denoisers" in record:
            return "--objective ul2"
        names = ("objective", *RECORDED_FLAGS[record["objective"]])
        return " ".join(f"--{name} {record[name]}" for name in names)

    raise UsageError(f"checkpoint {path} was pretrained with {flags(saved)}, and this run asks for {flags(now)}; "
                     "resume with the checkpoint's flags, or start a new run from its weights with "
                     "--model_name_or_path")


def build_mixture_collator(config, tokenizer) -> denoisers.DataCollatorForDenoiserMixture:
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

    return built_or_refused(build, config.max_seq_length)


def built_or_refused(build, max_seq_length: int):
    """`build(max_seq_length)`, a collator; where it refuses the length (more noise spans than the
    tokenizer has sentinels), one line that offers the longest input that fits."""
    try:
        return build(max_seq_length)
    except ValueError as err:
        fits = next((n for n in range(max_seq_length - 1, 7, -1) if _builds(build, n)), None)
        hint = f"; --max_seq_length {fits} fits" if fits else ""
        raise UsageError(f"--max_seq_length {max_seq_length}: {err}{hint}") from None


def _builds(build, input_length: int) -> bool:
    try:
        build(input_length)
    except ValueError:
        return False
    return True


def make_longest_batch(collator, tokenizer):
    """`n -> batch` of n rows at the longest lengths the objective gives: the batch --auto_find_batch_size tries.

    Span corruption's and prefix LM's batches all have one shape; a mixture pads its targets to
    the longest its rows drew, so the probe's are widened to the longest any denoiser writes.
    """
    return lambda n: _longest_batch(collator, tokenizer, n)


def _longest_batch(collator, tokenizer, n: int) -> dict:
    # "idx" keeps the probe from drawing from the collator's own random stream.
    batch = collator([{"input_ids": [tokenizer.unk_token_id] * collator.raw_length, "idx": i} for i in range(n)])
    if isinstance(collator, denoisers.DataCollatorForDenoiserMixture):
        extra = collator.target_length - batch["labels"].size(1)
        batch["labels"] = torch.nn.functional.pad(batch["labels"], (0, extra), value=-100)
        batch["decoder_input_ids"] = torch.nn.functional.pad(batch["decoder_input_ids"], (0, extra),
                                                             value=tokenizer.pad_token_id)
    return batch


def build_corpus(config, tokenizer, chunk_length: int, accelerator):
    """(train data, validation chunks): packed in memory, or a stream when --streaming."""
    files = text_files.expand_files(config.train_file) if config.train_file else None
    held_out = text_files.expand_files(config.validation_file, "--validation_file") if config.validation_file else None
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
    # No held-out files: the corpus's last chunks (a tenth of it, at least one) become the validation set.
    n_eval = min(config.max_eval_samples, max(1, len(packed) // 10))
    if len(packed) < 2:
        raise UsageError("the corpus packs into a single chunk: add text or pass --validation_file")
    accelerator.print(f"corpus: {len(packed) - n_eval} training and {n_eval} validation chunks of {chunk_length} tokens")
    return packed.select(range(len(packed) - n_eval)), packed.select(range(len(packed) - n_eval, len(packed)))


def build_loaders(config, train_data, eval_data, collator):
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
                         **device.loader_workers(config, not config.streaming), **order)
    # Workers and pinning as for training: each evaluation reads the whole held-out set.
    evaluation_loader = torch.utils.data.DataLoader(eval_data, batch_size=config.per_device_eval_batch_size,
                                                    collate_fn=collator, **device.loader_workers(config))
    return train, evaluation_loader
