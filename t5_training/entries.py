"""The types of a registry entry (`constants.DATASET_VALS[benchmark][task]` is a `TaskEntry`).

constants.py holds the entries users edit; these classes are their schema, plain frozen data
with no behaviour: `t5_training.tasks` builds the formatting and scoring functions from an
entry. They live in the package so that the package's modules can name them without reading
the registry (only `t5_training.registry` does).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Literal, Mapping

Kind = Literal["classification", "regression", "seq2seq"]


@dataclass(frozen=True)
class LocalFiles:
    """The layout of a dataset's original delimited files inside `--data_dir`.

    `columns` renames file columns to the entry's column names. Without a header the file
    columns are named by position ("0", "1", ...). Columns that are not renamed are dropped.
    """

    splits: Mapping[str, str]
    columns: Mapping[str, str]
    header: bool = True
    delimiter: str = "\t"
    # GLUE TSVs contain bare quotes inside sentences: QUOTE_NONE keeps them as text.
    quoting: int = csv.QUOTE_NONE
    # utf-8-sig drops MRPC's byte-order mark, which would otherwise hide the first column.
    encoding: str = "utf-8-sig"


@dataclass(frozen=True)
class PackageCorpus:
    """A labelled corpus shipped inside a Python package: one folder per label word, one file per text.

    Files are sorted by name within each label folder; every `validation_every`-th file goes to
    the validation split, so the split is the same on every machine and needs no seed. The
    training rows are then shuffled with a fixed seed, so that their first N cover every label.
    """

    package: str
    root: str
    validation_every: int = 5


@dataclass(frozen=True)
class TestSplit:
    """One unlabelled test split and the file its predictions go to on the benchmark's leaderboard.

    `name` is the split's key in `Submission.local.splits` and, unless `hub_split` says
    otherwise, its hub split name; `hub_name` is the hub config when not the entry's own
    (GLUE's diagnostic set is its own config, "ax", predicted with the MNLI model).
    """

    name: str
    file: str
    hub_name: str | None = None
    hub_split: str | None = None
    # Predicted only where its file is present: GLUE's download keeps the diagnostic set apart.
    optional: bool = False


@dataclass(frozen=True)
class Submission:
    """How a leaderboard takes a task's test predictions (fine_tune_t5.py --do_predict).

    `local` is the layout of the unlabelled test files in --data_dir: it differs from the
    labelled files' (CoLA's test file has a header, QQP's numbers its rows in an `id` column),
    and maps the file's row number column to `index`. `labels` is what each class id is written
    as; a regression's scores are clipped to `score_range`.
    """

    splits: tuple[TestSplit, ...]
    local: LocalFiles
    labels: tuple[str, ...] = ()
    score_range: tuple[float, float] | None = None


@dataclass(frozen=True)
class TaskEntry:
    """One dataset cast as text to text. See the module docstring."""

    prefix: str
    inputs: tuple[str, ...]
    target: str = "label"
    kind: Kind = "classification"
    label_words: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ("accuracy",)
    metric_to_optimize: str = "accuracy"
    greater_is_better: bool = True
    # Write "key: value" for each input column (GLUE); False joins bare values (summarize:).
    show_keys: bool = True
    # Split names the scripts use; each is a hub split name and a key of `local.splits`.
    train_split: str = "train"
    eval_splits: tuple[str, ...] = ("validation",)
    hub_path: str | None = None
    hub_name: str | None = None
    local: LocalFiles | None = None
    package_corpus: PackageCorpus | None = None
    submission: Submission | None = None
    # The task's folder in the benchmark's own download (GLUE's: CoLA/, SST-2/, ...): a mixture's
    # --data_dir holds one per task (README, "Multi-task training").
    folder: str | None = None
