"""Pretraining text: loading a corpus (its files read by text_files.py, or a hub dataset), tokenizing
it in fast batches, and packing it into chunks.

Packing joins documents end to end, as T5's span_corruption does (reduce_concat_tokens, then
split_tokens: no separator; the collator appends EOS to each corrupted input and target), and
cuts the token stream into chunks of exactly the raw length the span-corruption collator
expects (568 tokens for 512-token inputs), so no batch holds padding. `eos_between_documents`
puts an EOS after each document instead, which sentinels may then mask mid-chunk. Two forms:

* in memory (`pack_dataset`): the whole corpus is tokenized with `datasets.map` and cut with
  one reshape; only the final partial chunk (fewer than `chunk_length` tokens) is dropped.
* streaming (`PackedStream`): an iterable dataset for corpora larger than RAM. Documents are
  read lazily, split between processes and data-loader workers, tokenized in batches, packed
  with the remainder carried over, and shuffled in a bounded buffer. It cycles over its shard
  forever (pass p reshuffles with seed + p), so every process always has a next batch.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator, Sequence

import datasets
import numpy as np
import pyarrow.compute as pc
import torch

from t5_training.errors import UsageError, first_line
from t5_training.text_files import iter_documents


def load_documents(files: Sequence[str] | None, dataset_name: str | None, dataset_config_name: str | None,
                   split: str, text_column: str, streaming: bool):
    """A datasets.Dataset (or IterableDataset when streaming) with one `text` column."""
    if files:
        generator = lambda files, stamps: (  # noqa: E731
            {"text": d} for f in files for d in iter_documents(f, text_column))
        # datasets caches a generated dataset under a hash of gen_kwargs: each file's size and
        # modification time go in too, so an edited corpus is read again rather than served stale.
        stamps = [(os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
        gen_kwargs = {"files": list(files), "stamps": stamps}
        # datasets cannot build an empty dataset: say so plainly (this reads up to the first document).
        if next(generator(**gen_kwargs), None) is None:
            raise UsageError(f"{', '.join(files)}: no text (every line or row is blank)")
        if streaming:
            return datasets.IterableDataset.from_generator(generator, gen_kwargs=gen_kwargs)
        try:
            return datasets.Dataset.from_generator(generator, gen_kwargs=gen_kwargs)
        except datasets.exceptions.DatasetGenerationError as err:
            # datasets wraps what the generator raises; a bad line is the user's to fix, not a traceback.
            if isinstance(err.__cause__, UsageError):
                raise err.__cause__ from None
            raise
    try:
        ds = datasets.load_dataset(dataset_name, dataset_config_name, split=split, streaming=streaming)
    except (ConnectionError, OSError, ValueError) as err:
        raise UsageError(f"could not load {dataset_name} ({split}): {first_line(err)}; "
                         "offline, pass --train_file with local text") from None
    if text_column not in ds.column_names:
        raise UsageError(f"{dataset_name} has no column {text_column!r}; columns found: "
                         f"{', '.join(ds.column_names)}. Set --text_column")
    return ds.select_columns([text_column]).rename_column(text_column, "text") if text_column != "text" else \
        ds.select_columns(["text"])


def tokenize_documents(texts: list[str], tokenizer, eos_between_documents: bool = False) -> list[list[int]]:
    """Token ids of each document, followed by EOS if `eos_between_documents` (T5 packs without)."""
    # A T5 tokenizer's only special token is the EOS it appends.
    return tokenizer(texts, add_special_tokens=eos_between_documents)["input_ids"]


def pack_dataset(documents: datasets.Dataset, tokenizer, chunk_length: int, num_proc: int | None = None, *,
                 eos_between_documents: bool = False) -> datasets.Dataset:
    """Packs an in-memory corpus into rows of exactly `chunk_length` ids, plus an `idx` per row."""
    datasets.disable_progress_bars()  # the chunk count printed afterwards is the useful line
    tokenized = documents.map(
        lambda b: {"input_ids": tokenize_documents(b["text"], tokenizer, eos_between_documents)}, batched=True,
        remove_columns=documents.column_names, num_proc=num_proc, desc="tokenizing")
    column = tokenized.data.column("input_ids")
    # One flatten over the Arrow column: no Python loop over documents or tokens.
    stream = pc.list_flatten(column).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    num_chunks = len(stream) // chunk_length
    if num_chunks == 0:
        raise UsageError(f"the corpus has {len(stream)} tokens, fewer than one chunk of {chunk_length}; "
                         "add text or lower --max_seq_length")
    chunks = stream[: num_chunks * chunk_length].reshape(num_chunks, chunk_length)
    # numpy rows: the collator stacks them without converting 568 Python ints per row.
    return datasets.Dataset.from_dict({"input_ids": chunks, "idx": np.arange(num_chunks)}).with_format("numpy")


class PackedStream(torch.utils.data.IterableDataset):
    """Packed chunks from a lazily read corpus, split across processes and data-loader workers.

    Each of the `world_size * num_workers` readers takes every N-th document (or whole files,
    when there are at least as many files as readers), so together they read the corpus once
    per pass. `idx` numbers a chunk uniquely across readers and passes; the collator derives
    its masks from it. With `cycle`, the stream never ends: pass p shuffles with seed + p.
    """

    def __init__(self, sources: Sequence[str] | datasets.IterableDataset, tokenizer, chunk_length: int, *,
                 text_column: str = "text", shuffle_buffer: int = 0, seed: int = 0, cycle: bool = True,
                 rank: int = 0, world_size: int = 1, tokenize_batch: int = 256, eos_between_documents: bool = False):
        self.sources, self.tokenizer, self.chunk_length = sources, tokenizer, chunk_length
        self.text_column, self.shuffle_buffer, self.seed, self.cycle = text_column, shuffle_buffer, seed, cycle
        self.rank, self.world_size, self.tokenize_batch = rank, world_size, tokenize_batch
        self.eos_between_documents = eos_between_documents
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _reader(self) -> tuple[int, int]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def _documents(self, reader: int, readers: int) -> Iterator[str]:
        if isinstance(self.sources, datasets.IterableDataset):
            stream = self.sources
            if stream.n_shards >= readers:
                stream = stream.shard(num_shards=readers, index=reader)
                reader, readers = 0, 1
            # Batches via `iter`: plain iteration inside a data-loader worker would split the shards
            # between workers a second time (datasets does so itself), dropping documents.
            i = 0
            for batch in stream.iter(batch_size=1024):
                for text in batch["text"]:
                    if i % readers == reader:
                        yield text
                    i += 1
            return
        files = list(self.sources)
        if len(files) >= readers:
            files, reader, readers = files[reader::readers], 0, 1
        i = 0
        for path in files:
            for text in iter_documents(path, self.text_column):
                if i % readers == reader:
                    yield text
                i += 1

    def _chunks(self, reader: int, readers: int) -> Iterator[np.ndarray]:
        carry = np.zeros(0, dtype=np.int32)
        batch: list[str] = []

        def flush():
            nonlocal carry
            ids = tokenize_documents(batch, self.tokenizer, self.eos_between_documents)
            batch.clear()
            carry = np.concatenate([carry, *(np.asarray(doc, dtype=np.int32) for doc in ids)])
            whole = len(carry) // self.chunk_length * self.chunk_length
            chunks, carry = carry[:whole].reshape(-1, self.chunk_length), carry[whole:]
            return chunks

        for text in self._documents(reader, readers):
            batch.append(text)
            if len(batch) == self.tokenize_batch:
                yield from flush()
        if batch:
            yield from flush()

    def _one_pass(self, reader: int, readers: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
        if self.shuffle_buffer <= 1:
            yield from self._chunks(reader, readers)
            return
        buffer: list[np.ndarray] = []
        for chunk in self._chunks(reader, readers):
            if len(buffer) < self.shuffle_buffer:
                buffer.append(chunk)
                continue
            # Emit a random buffered chunk and keep the new one in its place.
            slot = int(rng.integers(len(buffer)))
            buffer[slot], chunk = chunk, buffer[slot]
            yield chunk
        rng.shuffle(buffer)
        yield from buffer

    def __iter__(self) -> Iterator[dict]:
        reader, readers = self._reader()
        passes = 0
        count = 0
        while True:
            rng = np.random.default_rng([self.seed, self.epoch, passes, reader])
            produced = False
            for chunk in self._one_pass(reader, readers, rng):
                produced = True
                yield {"input_ids": chunk, "idx": (count * readers + reader) * 65536 + self.epoch % 65536}
                count += 1
            passes += 1
            if not self.cycle or not produced:
                return


class StreamLoader(torch.utils.data.DataLoader):
    """A DataLoader over a `PackedStream`, left unprepared by accelerate: the stream shards itself.

    Its `set_epoch` reaches the stream, as a prepared loader's reaches its sampler, so that the
    training loop treats both alike.
    """

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)


class EpochChunks(torch.utils.data.Dataset):
    """Packed chunks read as `epoch * len + row` (samplers.EpochNumberedSampler), each with that number as
    its "idx": a chunk's masks, a pure function of the seed and its idx, are drawn anew every epoch, and
    alike in every run and under any batch split. Epoch 0's numbers are the chunks' own idx."""

    def __init__(self, chunks: datasets.Dataset):
        self.chunks = chunks

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, number: int) -> dict:
        return self.__getitems__([number])[0]

    def __getitems__(self, numbers: list[int]) -> list[dict]:
        # One read for the batch: a fraction of the time of one per row.
        rows = self.chunks[[number % len(self.chunks) for number in numbers]]["input_ids"]
        return [{"input_ids": ids, "idx": number} for ids, number in zip(rows, numbers)]


def take_chunks(stream: Iterable[dict], limit: int) -> datasets.Dataset:
    """The first `limit` chunks of a stream as an in-memory dataset (a fixed validation set)."""
    rows = [row for _, row in zip(range(limit), stream)]
    if not rows:
        raise UsageError("the validation corpus holds less than one chunk; add text or lower --max_seq_length")
    return datasets.Dataset.from_dict({"input_ids": np.stack([r["input_ids"] for r in rows]),
                                       "idx": np.arange(len(rows))}).with_format("numpy")
