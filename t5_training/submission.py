"""Leaderboard files from a model's predictions on the unlabelled test splits (fine_tune_t5.py --do_predict).

    python fine_tune_t5.py --benchmark glue --dataset_name sst2 --model_name_or_path runs/sst2/best \
        --do_train false --do_predict --data_dir ../shared/data/SST-2 --output_dir runs/sst2-test

Reading: `build_test_data` reads every test split as the entry's `Submission` lays it out (a row
may lack a label there, and only there), keeps each row's index from the test file and tokenizes
the rows as the eval splits are. Writing: GLUE's server takes one TSV per test set, named as the
registry says (`TestSplit.file`: CoLA.tsv, MNLI-m.tsv, AX.tsv, ...), with the header
`index<TAB>prediction` and every test row once, in the test file's order (`write_task_file`), and
all of them in one zip (`write_zip`); a run over several tasks calls the first once per task and
the second once. A predicted text maps to a label by the rules evaluation scores with, T5's
postprocessors (t5/data/postprocessors.py): the exact label word (`string_label_to_class_id`) or
`float(text)` (`string_to_float`). A class is written as the entry's `Submission.labels` (0/1, or a
label name), a score clipped to its `score_range`; a text that maps to nothing is written as the
`fallback`, counted and warned about (no_label.py). Every file written, its rows and fallback
rows, and the files the leaderboard needs that could not be written (GLUE's AX.tsv without the
diagnostic set) go to predict_results.json beside the zip (`finish`).
"""
from __future__ import annotations

import collections
import math
import os
import zipfile
from dataclasses import dataclass, field
from typing import Sequence

import datasets
import numpy as np

from t5_training.entries import TaskEntry, TestSplit
from t5_training import data, no_label, reporting
from t5_training.errors import UsageError
from t5_training.table_files import read_original_file
from t5_training.tasks import kind_of

SUBMISSION_DIR = "submission"
ZIP_NAME = "submission.zip"
RESULTS_FILE = "predict_results.json"
# Each test row's index in its test file; GLUE's hub test splits number their rows in `idx`.
INDEX = "index"
HUB_INDEX = "idx"


def load_test_splits(entry: TaskEntry, *, data_dir: str | None = None, trust_remote_code: bool = False,
                     log=print, warn=no_label.to_stderr) -> dict[str, datasets.Dataset]:
    """The entry's test splits with canonical columns and `index`: from --data_dir, else the hub.

    A required test file that is missing is a UsageError naming it; an optional one (GLUE's
    diagnostic set) is skipped with a loud `warn` line, since the leaderboard refuses a zip
    without its file, yet the others are worth predicting. Rows without a label get the kind's
    `unlabelled` value; an index that appears twice is a UsageError, since each row is scored once.
    """
    if entry.submission is None:
        raise UsageError("--do_predict writes a leaderboard's files, and this task has no test split; "
                         "drop --do_predict")
    splits = {}
    for test in entry.submission.splits:
        ds, source = _read_test_split(entry, test, data_dir, trust_remote_code)
        if ds is None:
            warn(missing_file_warning(entry, test, data_dir))
            continue
        if entry.target not in ds.column_names:  # GLUE's test files have no label column
            ds = ds.add_column(entry.target, [kind_of(entry).unlabelled] * len(ds))
        ds = data.canonical(entry, ds, test.name, keep=(INDEX,), unlabelled_ok=True, source=source)
        repeated = [i for i, n in collections.Counter(map(str, data.column_values(ds, INDEX))).items() if n > 1]
        if repeated:
            raise UsageError(f"{test.name} split: index {repeated[0]} appears more than once, and the leaderboard "
                             "scores each test row once; use the original test file")
        splits[test.name] = ds
    return splits


def missing_file_warning(entry: TaskEntry, test: TestSplit, data_dir: str) -> str:
    """The loud line for an optional test file that --data_dir lacks: what is lost, and where to get the file."""
    path = os.path.normpath(os.path.join(data_dir, entry.submission.local.splits[test.name]))
    hub = (f", or drop --data_dir to read every test split from the hub ({entry.hub_path}, "
           f"{test.hub_name or entry.hub_name}, split {test.hub_split or test.name})" if entry.hub_path else "")
    return (f"WARNING: {test.file} will not be written: there is no {path}, and the leaderboard refuses a "
            f"submission zip without {test.file}. Put the file there from the benchmark's download{hub}")


def _read_test_split(entry: TaskEntry, test: TestSplit, data_dir: str | None,
                     trust_remote_code: bool) -> tuple[datasets.Dataset | None, str]:
    """The split's rows (None for a missing optional file) and where they came from."""
    if data_dir:
        path = os.path.join(data_dir, entry.submission.local.splits[test.name])
        if not os.path.isfile(path):
            if test.optional:
                return None, path
            raise UsageError(f"--do_predict needs the test file {path}, which is not there; put the task's "
                             f"{os.path.basename(path)} in --data_dir, or drop --do_predict")
        return read_original_file(path, entry.submission.local), path
    if not entry.hub_path:
        raise UsageError("--do_predict reads the test files from --data_dir; pass the folder that holds them")
    name = test.hub_name or entry.hub_name
    ds = data.load_hub_split(entry.hub_path, name, test.hub_split or test.name, trust_remote_code)
    return (ds.rename_column(HUB_INDEX, INDEX) if HUB_INDEX in ds.column_names else ds,
            data.hub_dataset_name(entry.hub_path, name))


def build_test_data(entry: TaskEntry, config, tokenizer, log=print, *, data_dir: str | None = None,
                    mode_token_id: int | None = None, warn=no_label.to_stderr) -> dict[str, datasets.Dataset]:
    """Every row of every test split, tokenized and ordered for decoding as the eval splits are.

    Each split keeps `idx` (its row number, see data.ordered_for_decoding), `index` (the test
    file's, as text) and its source text. --max_eval_samples does not apply: a submission has
    every test row. `config` supplies data_dir (unless `data_dir` is given: a mixture's task folder),
    trust_remote_code and the two length limits; `mode_token_id` goes before every source, as in training;
    `warn` gets the loud line about an optional test file that is missing.
    """
    tests = {}
    for name, ds in load_test_splits(entry, data_dir=data_dir or config.data_dir,
                                     trust_remote_code=config.trust_remote_code, log=log, warn=warn).items():
        result = data.tokenize_split(ds, entry, tokenizer, config.max_source_length, config.max_target_length,
                                     mode_token_id)
        log(f"{name}: {len(ds)} rows; truncated: {result.truncated_sources} inputs to {config.max_source_length} "
            "tokens")
        indices = [str(i) for i in data.column_values(ds, INDEX)]
        tests[name] = data.ordered_for_decoding(result.dataset.add_column(INDEX, indices))
    return tests


def fallback(entry: TaskEntry, train_labels: Sequence) -> int | float:
    """What a prediction that maps to no label is written as.

    For classes, the most frequent training class (on a tie, the lower class id): the best guess
    without the input. For a score (STS-B), the training mean: the constant with the least squared
    error, and one near the middle of the predictions, so it disturbs Pearson's r least.
    """
    if not train_labels:
        raise ValueError("no training labels to take the fallback from")
    if entry.kind == "regression":
        return float(np.mean(train_labels))
    counts = collections.Counter(train_labels)
    return max(sorted(counts), key=counts.__getitem__)


def written_form(entry: TaskEntry, label: int | float) -> str:
    """A class id as the leaderboard names it, or a score clipped to the task's range, three decimals."""
    if entry.kind != "regression":
        return entry.submission.labels[label]
    low, high = entry.submission.score_range or (-math.inf, math.inf)
    return f"{min(max(label, low), high):.3f}"


def write_task_file(entry: TaskEntry, test: TestSplit, indices: Sequence[str], predictions: Sequence[str],
                    train_labels: Sequence, folder: str) -> tuple[str, int]:
    """Writes `folder/<test.file>`: the header, then `index<TAB>prediction` for each test row, in order.

    `indices` and `predictions` are the test split's, in its row order. Returns the file's path
    and how many predictions mapped to no label (written as the `fallback`).
    """
    if len(indices) != len(predictions):
        raise ValueError(f"{len(indices)} test rows but {len(predictions)} predictions")
    default = fallback(entry, train_labels)
    labels = [no_label.label_of(entry, text) for text in predictions]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, test.file)
    with open(f"{path}.tmp", "w", encoding="utf-8", newline="") as f:
        f.write("index\tprediction\n")
        f.writelines(f"{index}\t{written_form(entry, default if label is None else label)}\n"
                     for index, label in zip(indices, labels))
    os.replace(f"{path}.tmp", path)
    return path, labels.count(None)


def write_zip(path: str, files: Sequence[str]) -> str:
    """Zips `files` into `path`, each at the archive's top level as the leaderboard reads them."""
    with zipfile.ZipFile(f"{path}.tmp", "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in files:
            archive.write(name, arcname=os.path.basename(name))
    os.replace(f"{path}.tmp", path)
    return path


@dataclass
class TaskFiles:
    """One task's part of a submission, for `finish`.

    `files`: {leaderboard file: {"rows", "no_label", "no_label_share", "written_as"}}, as
    predict_results.json records them; `paths`: the files written; `missing`: the leaderboard files
    of test splits that were not there to predict (GLUE's AX.tsv without the diagnostic set).
    """

    files: dict[str, dict] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def write_task_files(entry: TaskEntry, tests: dict[str, datasets.Dataset], predictions: dict[str, list[str]],
                     train_labels: Sequence, output_dir: str, log=print, warn=no_label.to_stderr) -> TaskFiles:
    """A task's leaderboard files in output_dir/submission/: a line printed per file, and a `warn` line
    for a file with rows that fell back (no_label.warning: loud when they are most)."""
    folder = os.path.join(output_dir, SUBMISSION_DIR)
    part = TaskFiles()
    default = written_form(entry, fallback(entry, train_labels))
    why = "the training mean" if entry.kind == "regression" else "the most frequent training label"
    for test in entry.submission.splits:
        if test.name not in tests:
            part.missing.append(test.file)
            continue
        indices = data.in_row_order(tests[test.name], INDEX)
        path, missed = write_task_file(entry, test, indices, predictions[test.name], train_labels, folder)
        log(f"{path}: {len(indices)} rows; {missed} predictions matched no label and were written as "
            f"{default}, {why}")
        warned = no_label.warning(path, missed, len(indices), default)
        if warned:
            warn(warned)
        # The count write_task_file already made, not a second pass over the predictions.
        share = missed / len(indices) if indices else 0.0
        part.files[test.file] = {"rows": len(indices), "no_label": missed, "no_label_share": share,
                                 "written_as": default}
        part.paths.append(path)
    return part


def finish(output_dir: str, parts: Sequence[TaskFiles], log=print, warn=no_label.to_stderr) -> dict:
    """output_dir/submission.zip holding every task's files, and predict_results.json; returns what that holds:
    {"files": {file: its counts}, "missing": [leaderboard files not written], "zip": the zip's path}.

    Prints what the zip holds, then warns loudly once more, where a long run's output ends, about
    files that are mostly fallback and about each missing file: the leaderboard refuses the zip.
    """
    files = {name: counts for part in parts for name, counts in part.files.items()}
    missing = [name for part in parts for name in part.missing]
    path = write_zip(os.path.join(output_dir, ZIP_NAME), [p for part in parts for p in part.paths])
    log(f"{path}: {', '.join(files)}")
    lines = [no_label.zip_warning(path, files)]
    lines += [f"WARNING: {path} lacks {name}, which the leaderboard requires: it will refuse this zip until "
              f"{name} is in it (see the warning about {name} above)" for name in missing]
    for line in filter(None, lines):
        warn(line)
    results = {"files": files, "missing": missing, "zip": path}
    reporting.write_json(os.path.join(output_dir, RESULTS_FILE), results)
    return results
