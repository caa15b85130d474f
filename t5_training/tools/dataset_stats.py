"""Token-length statistics of a task or a pretraining corpus, to choose max lengths before training.

    python -m t5_training.dataset_stats --benchmark glue --dataset_name sst2 \
        --data_dir ../shared/data/SST-2 --tokenizer_name t5-small --png runs/sst2_lengths.png
    # your own rows, as fine_tune_t5.py takes them; only the dev split, first 1000 rows:
    python -m t5_training.dataset_stats --train_file train.jsonl --validation_file dev.jsonl \
        --benchmark seq2seq --dataset_name summarization --model_name_or_path t5-small --splits validation \
        --max_samples 1000
    # a pretraining corpus: document lengths and how many chunks they pack into
    python -m t5_training.dataset_stats --corpus_file 'corpus/*.txt' --tokenizer_name runs/tok

Rows are loaded, formatted and tokenized by the very functions fine_tune_t5.py uses
(`data.load_splits`, `data.tokenize_split`), so the counts include the task prefix and EOS and
are those of the text the model sees. Prints per split a report for sources and targets;
`--json` and `--png` also write it as numbers and as histograms.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Literal, Sequence

import datasets
import numpy as np
import pyarrow.compute as pc

from t5_training import denoisers
from t5_training.collators import compute_input_and_target_lengths
from t5_training import corpus, data, reporting, text_files
from t5_training.config import parse_config, resolve_objective
from t5_training.errors import UsageError, run_cli
from t5_training.modeling import load_tokenizer
from t5_training.tasks import get_entry
from t5_training.tools import length_plots
from t5_training.tools.length_stats import PERCENTILES, SUGGESTION_RULE, length_stats

BAR_WIDTH = 40


@dataclass(frozen=True)
class StatsConfig:
    """Flags of `python -m t5_training.dataset_stats`; the names are fine_tune_t5.py's and pre_train_t5.py's."""

    benchmark: str = field(default="glue", metadata={"help": "A key of DATASET_VALS: glue, seq2seq, embedded."})
    dataset_name: str = field(default="sst2", metadata={"help": "A task of the benchmark, e.g. sst2, mnli."})
    data_dir: str | None = field(default=None, metadata={"help": "Folder with the task's original files."})
    train_file: str | None = field(default=None, metadata={"help": "CSV/TSV/JSONL training rows."})
    validation_file: str | None = field(default=None, metadata={"help": "CSV/TSV/JSONL evaluation rows."})
    trust_remote_code: bool = False
    tokenizer_name: str | None = field(default=None, metadata={"help": "Defaults to --model_name_or_path."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "Its tokenizer is used."})
    max_source_length: int = field(default=512, metadata={"help": "The input length you plan to train with."})
    max_target_length: int = field(default=64, metadata={"help": "The target length you plan to train with."})
    max_samples: int | None = field(default=None, metadata={"help": "First N rows of each split; 0 means all."})
    splits: list[str] | None = field(default=None, metadata={"help": "Splits to report; default: all of them."})
    corpus_file: list[str] | None = field(default=None, metadata={"help": "Pretraining text/JSONL/parquet files "
                                                                            "(globs) instead of a task."})
    text_column: str = "text"
    max_seq_length: int = field(default=512, metadata={"help": "Pretraining encoder input length."})
    objective: Literal["span_corruption", "prefix_lm", "ul2"] | None = field(
        default=None, metadata={"help": "How pre_train_t5.py packs the corpus: span_corruption (the default), "
                                        "prefix_lm, or ul2 (UL2's mixture, or the one --denoisers lists)."})
    denoisers: str | None = field(default=None, metadata={"help": "A YAML mixture of denoisers, as pre_train_t5.py "
                                                                  "reads it (implies --objective ul2)."})
    noise_density: float = 0.15
    eos_between_documents: bool = field(
        default=False, metadata={"help": "Put an EOS after each document when packing. T5 packs documents end "
                                         "to end (the default) and appends EOS after corruption only."})
    mean_noise_span_length: float = 3.0
    png: str | None = field(default=None, metadata={"help": "Write length histograms to this PNG."})
    json: str | None = field(default=None, metadata={"help": "Write the statistics to this JSON file."})

    def __post_init__(self):
        if self.max_source_length < 2 or self.max_target_length < 2:
            raise UsageError("--max_source_length and --max_target_length must be at least 2 (text + EOS)")
        if (self.max_samples or 0) < 0:
            raise UsageError(f"--max_samples must be >= 0 (0 or unset means every row), got {self.max_samples}")
        if self.corpus_file and (self.data_dir or self.train_file or self.validation_file):
            raise UsageError("--corpus_file reads a pretraining corpus: drop --data_dir/--train_file/"
                             "--validation_file, or drop --corpus_file to inspect a task")
        if self.denoisers and self.resolved_objective != "ul2":
            raise UsageError(f"--denoisers lists a mixture of denoisers, which --objective {self.resolved_objective} "
                             "is not; drop --objective (or pass --objective ul2)")
        if self.max_seq_length < 8 or not 0 < self.noise_density < 1 or self.mean_noise_span_length < 1:
            raise UsageError("--max_seq_length must be >= 8, --noise_density in (0, 1), "
                             "--mean_noise_span_length >= 1")
        for flag, path, suffix in (("--png", self.png, ".png"), ("--json", self.json, ".json")):
            if path and not path.lower().endswith(suffix):
                raise UsageError(f"{flag} {path!r} must end in {suffix}")
            if path and not os.path.isdir(os.path.dirname(path) or "."):
                raise UsageError(f"{flag} {path}: folder {os.path.dirname(path)!r} does not exist; create it first")

    @property
    def resolved_objective(self) -> str:
        """How the corpus is packed, as pre_train_t5.py decides it: a --denoisers file implies its mixture."""
        return resolve_objective(self.objective, self.denoisers)


def main(argv: Sequence[str] | None = None) -> dict:
    """Parses, loads the tokenizer, measures, prints the report and writes --json/--png; returns the stats."""
    config = parse_config(StatsConfig, argv)
    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(config.tokenizer_name or config.model_name_or_path, config.trust_remote_code)
    stats = corpus_stats(config, tokenizer) if config.corpus_file else task_stats(config, tokenizer)
    print(format_report(stats))
    if config.json:
        reporting.write_json(config.json, stats)
    if config.png:
        length_plots.save_histograms(config.png, stats)
    return stats


def task_stats(config: StatsConfig, tokenizer) -> dict:
    """Source and target lengths of each split, tokenized as fine-tuning tokenizes them."""
    entry = get_entry(config.benchmark, config.dataset_name)
    known = (entry.train_split, *entry.eval_splits)
    for split in config.splits or ():
        if split not in known:
            raise UsageError(f"unknown --splits {split!r} for {config.benchmark}/{config.dataset_name}; "
                             f"its splits: {', '.join(known)}")
    raw = data.load_splits(entry, data_dir=config.data_dir, train_file=config.train_file,
                           validation_file=config.validation_file, trust_remote_code=config.trust_remote_code)
    for split in config.splits or ():
        if split not in raw:
            raise UsageError(f"no {split} split was loaded; pass the file for it "
                             f"(--{'train' if split == entry.train_split else 'validation'}_file)")
    splits = {}
    for split in (s for s in known if s in raw and s in (config.splits or known)):
        ds = raw[split]
        if config.max_samples:
            ds = ds.select(range(min(config.max_samples, len(ds))))
        # No limit: untruncated lengths, from the function that tokenizes for training.
        tokenized = data.tokenize_split(ds, entry, tokenizer, sys.maxsize, sys.maxsize).dataset
        splits[split] = {
            "source": length_stats(_lengths(tokenized, "input_ids"), config.max_source_length, "--max_source_length"),
            "target": length_stats(_lengths(tokenized, "labels"), config.max_target_length, "--max_target_length"),
        }
    if config.train_file or config.validation_file:
        where = ", ".join(f"{split} file {path}" for split, path in
                          ((entry.train_split, config.train_file), (entry.eval_splits[0], config.validation_file)) if path)
    elif config.data_dir or entry.package_corpus:
        where = config.data_dir or f"the {entry.package_corpus.package} package"
    else:
        where = f"the hub ({entry.hub_path})"
    return {
        "title": f"{config.benchmark}/{config.dataset_name} from {where}",
        "tokenizer": config.tokenizer_name or config.model_name_or_path,
        "counted": "tokens of the formatted text, task prefix and EOS included, as fine_tune_t5.py tokenizes it",
        "splits": splits,
        "suggested": {column: max(s[column]["suggested_length"] for s in splits.values())
                      for column in ("source", "target")},
    }


def corpus_stats(config: StatsConfig, tokenizer) -> dict:
    """Document lengths of a pretraining corpus and the chunks pre_train_t5.py would pack them into."""
    chunk, how, read = packing(config)  # first: a bad --denoisers file fails before any text is read
    files = text_files.expand_files(config.corpus_file, "--corpus_file")
    documents = corpus.load_documents(files, None, None, "train", config.text_column, streaming=False)
    if config.max_samples:
        documents = documents.select(range(min(config.max_samples, len(documents))))
    tokenized = documents.map(lambda b: {"input_ids": corpus.tokenize_documents(b["text"], tokenizer,
                                                                                            config.eos_between_documents)},
                              batched=True, remove_columns=documents.column_names)
    lengths = _lengths(tokenized, "input_ids")
    total = int(lengths.sum())
    return {
        "title": f"corpus {' '.join(config.corpus_file)}: {len(files)} file{'s' * (len(files) != 1)}",
        "tokenizer": config.tokenizer_name or config.model_name_or_path,
        "counted": ("tokens of each document plus the EOS that separates packed documents"
                    if config.eos_between_documents else
                    "tokens of each document, packed end to end without an EOS between them (as T5 packs)"),
        "splits": {"corpus": {"document": length_stats(lengths, chunk, None)}},
        "packing": {"chunk_length": chunk, "objective": how, "tokens": total, "chunks": total // chunk,
                    "dropped_tokens": total % chunk, **({"denoiser_raw_lengths": read} if read else {})},
    }


def packing(config: StatsConfig) -> tuple[int, str, dict | None]:
    """(chunk length, how the objective uses a chunk, raw tokens each denoiser reads or None), as pre_train_t5.py packs."""
    read = None
    if config.resolved_objective == "prefix_lm":
        chunk, how = config.max_seq_length - 1, "prefix LM: split into input and target"
    elif config.resolved_objective == "ul2":
        mixture, rates = denoisers.read_mixture(config.denoisers)
        read = dict(zip((d.name for d in mixture), denoisers.mixture_lengths(config.max_seq_length, mixture)[0]))
        chunk = max(read.values())
        # Each row reads the first tokens its own denoiser needs and drops the rest of its chunk.
        kept = sum(r * n for r, n in zip(rates, read.values())) / sum(rates) / chunk
        how = (f"{'UL2' if config.denoisers is None else config.denoisers}'s mixture of {len(mixture)} denoisers, "
               f"{config.max_seq_length} encoder tokens; rows read {min(read.values())} to {chunk} tokens of "
               f"each chunk, {100 * (1 - kept):.1f}% of the packed tokens dropped at these rates")
    else:
        chunk = compute_input_and_target_lengths(config.max_seq_length, config.noise_density,
                                                 config.mean_noise_span_length)[0]
        how = (f"span corruption at {config.noise_density:g} noise, mean span {config.mean_noise_span_length:g}: "
               f"{config.max_seq_length} encoder tokens")
    return chunk, how, read


def _lengths(ds: datasets.Dataset, column: str) -> np.ndarray:
    # Arrow knows each list's length: no Python loop over the rows. The arrow format, not ds.data,
    # so that rows left out by a select() are left out here too.
    lengths = pc.list_value_length(ds.with_format("arrow")[column])
    return lengths.to_numpy(zero_copy_only=False).astype(np.int64)


def format_report(stats: dict) -> str:
    """The statistics as a plain-text report."""
    lines = [f"{stats['title']}", f"tokenizer: {stats['tokenizer']}", f"counted: {stats['counted']}",
             "pN: the smallest length that N% of rows fit in (so it truncates at most 100-N% of them)"]
    if "suggested" in stats:
        lines.append(f"suggested length: {SUGGESTION_RULE}")
    for split, columns in stats["splits"].items():
        rows = next(iter(columns.values()))["rows"]
        lines += ["", f"== {split}: {rows:,} {'documents' if 'packing' in stats else 'rows'} =="]
        for column, column_stats in columns.items():
            lines += ["", *format_column(column, column_stats)]
    if "packing" in stats:
        p = stats["packing"]
        lines += ["", f"packed for pretraining ({p['objective']}):",
                  f"  {p['tokens']:,} tokens make {p['chunks']:,} chunks of {p['chunk_length']} tokens; "
                  f"the last {p['dropped_tokens']:,} tokens are dropped"]
    if "suggested" in stats:
        lines += ["", "suggested for every split shown: "
                      f"--max_source_length {stats['suggested']['source']} "
                      f"--max_target_length {stats['suggested']['target']}"]
    return "\n".join(lines)


def format_column(column: str, s: dict) -> list[str]:
    """One column's block: summary line, truncation, suggestion and text histogram."""
    header = f"{column} ({s['flag']} {s['max_length']})" if s["flag"] else column
    summary = "   ".join([f"mean {s['mean']:.1f}", f"min {s['min']}", *(f"p{q} {s[f'p{q}']}" for q in PERCENTILES),
                          f"max {s['max']}"])
    if s["flag"]:
        cut = [f"truncated at {s['max_length']}: {_rows(s['truncated_rows'], s['truncated_percent'])}",
               f"suggested {s['flag']} {s['suggested_length']}: truncates "
               f"{_rows(s['suggested_truncated_rows'], s['suggested_truncated_percent'])}"]
    else:
        cut = [f"longer than one chunk ({s['max_length']} tokens): "
               f"{_rows(s['truncated_rows'], s['truncated_percent'], 'documents')}, split across chunks"]
    return [header, f"  {summary}", *(f"  {line}" for line in cut), *format_histogram(s["histogram"])]


def format_histogram(hist: dict) -> list[str]:
    """Rows per bin of token lengths, with a bar of '#' scaled to the largest bin (at least one
    '#' for a bin with any row, so a lone long row stays visible)."""
    edges, counts = hist["edges"], hist["counts"]
    labels = [f"{lo}" if hi - lo == 1 else f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:])]
    total, top = sum(counts), max(counts)
    label_width, count_width = max(len("tokens"), *map(len, labels)), max(len("rows"), len(f"{top:,}"))
    lines = [f"  {'tokens':>{label_width}}  {'rows':>{count_width}}  {'share':>7}"]
    for label, count in zip(labels, counts):
        bar = "#" * max(round(BAR_WIDTH * count / top), 1 if count else 0)
        line = f"  {label:>{label_width}}  {count:>{count_width},}  {_percent(100 * count / total):>7}  {bar}"
        lines.append(line.rstrip())
    return lines


def _rows(rows: int, percent: float, noun: str = "rows") -> str:
    return f"{rows:,} {noun} ({_percent(percent)})"


def _percent(value: float) -> str:
    # "0.00%" would hide the one long row a user is looking for.
    return "<0.01%" if 0 < value < 0.005 else f"{value:.2f}%"


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
