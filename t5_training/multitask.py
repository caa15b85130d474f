"""The tasks of a fine-tuning run: one, or a mixture (--dataset_name all, or a comma list).

A single task is read, batched and scored as before. A mixture reads each task from its own
folder of --data_dir, laid out as the benchmark's download lays it out (GLUE: CoLA/, SST-2/, ...),
trains on one stream of every task's rows drawn at the mixing rates (mixture.MixtureSampler; a
batch may hold several tasks, each row with its own task prefix), evaluates every task's eval
splits with that task's metrics, logged as `<task>/<metric>`, and adds the benchmark's score
(`glue_score`), which picks its best model.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import datasets

from t5_training.entries import TaskEntry
from t5_training.registry import DATASET_VALS
from t5_training import data, evaluation, metrics, mixture, modeling, no_label, submission
from t5_training.errors import UsageError
from t5_training.loop import Objective
from t5_training.resume import batch_layout, global_batch
from t5_training.tasks import get_entry, kind_of, metric_key


@dataclass(frozen=True)
class Tasks:
    """A run's tasks in --dataset_name's order: their entries, tokenized data and (--do_predict) test splits."""

    entries: dict[str, TaskEntry]
    data: dict[str, data.TaskData]
    tests: dict[str, dict]

    @property
    def mixed(self) -> bool:
        return len(self.entries) > 1


def entries(config) -> dict[str, TaskEntry]:
    """{task: registry entry} for --benchmark and --dataset_name; one entry unless it names a mixture."""
    if config.benchmark not in DATASET_VALS:
        get_entry(config.benchmark, config.dataset_name)  # the one line naming the known benchmarks
    names = mixture.task_names(DATASET_VALS[config.benchmark], config.dataset_name)
    return {name: get_entry(config.benchmark, name) for name in names}


def task_dirs(config, found: Mapping[str, TaskEntry]) -> dict[str, str | None]:
    """Where each task's files are: --data_dir for one task; for a mixture, its folder inside --data_dir.

    Every missing folder is named in one line, before anything is read.
    """
    if len(found) == 1 or not config.data_dir:
        return {name: config.data_dir for name in found}
    if not os.path.isdir(config.data_dir):
        raise UsageError(f"--data_dir {config.data_dir!r} is not a directory; point it at the folder that holds the "
                         "tasks' folders (GLUE's download: CoLA/, SST-2/, ...)")
    unplaced = [name for name, entry in found.items() if not entry.folder]
    if unplaced:
        raise UsageError(f"task {unplaced[0]} has no folder in the registry (TaskEntry.folder), so a mixture cannot "
                         "find it in --data_dir; run it alone")
    missing = [f"{name} ({entry.folder}/)" for name, entry in found.items()
               if not os.path.isdir(os.path.join(config.data_dir, entry.folder))]
    if missing:
        raise UsageError(f"--data_dir {config.data_dir} has no folder for {', '.join(missing)}; add the folders as "
                         "GLUE's download lays them out, or leave those tasks out of --dataset_name")
    return {name: os.path.join(config.data_dir, entry.folder) for name, entry in found.items()}


def read_tasks(config, found: Mapping[str, TaskEntry], tokenizer, log=print, warn=no_label.to_stderr) -> Tasks:
    """Reads, checks and tokenizes every task (and its test splits with --do_predict), a log line per split
    and a `warn` line per missing optional test file; every source starts with --mode_token where one is given."""
    if len(found) > 1 and config.train_file:
        raise UsageError("a mixture reads each task from its own folder: pass --data_dir with the tasks' folders "
                         "instead of --train_file/--validation_file")
    dirs = task_dirs(config, found)
    mode = modeling.mode_token_id(tokenizer, config.mode_token)
    read, tests = {}, {}
    for name, entry in found.items():
        say = log if len(found) == 1 else (lambda line, name=name: log(f"{name} {line}"))
        read[name] = data.build_task_data(entry, config, tokenizer, say, train=config.do_train, data_dir=dirs[name],
                                          mode_token_id=mode)
        if config.do_predict:
            tests[name] = submission.build_test_data(entry, config, tokenizer, say, data_dir=dirs[name],
                                                     mode_token_id=mode, warn=warn)
    return Tasks(dict(found), read, tests)


def resolve_decodings(requested: str, tasks: Tasks, accelerator) -> dict[str, str]:
    """--eval_decoding per task; in a mixture 'score' applies to the tasks with label words, the others generate."""
    return {name: evaluation.resolve_decoding(
        requested if not tasks.mixed or kind_of(entry).closed_label_set else "auto", entry, accelerator)
        for name, entry in tasks.entries.items()}


def score_key(benchmark: str) -> str:
    """The result key of a mixture's benchmark score, e.g. glue_score (logged as eval/glue_score)."""
    return f"{benchmark}_score"


def objective(benchmark: str, tasks: Tasks) -> Objective:
    """The metric the best model is picked by: the task's own, or a mixture's benchmark score."""
    if tasks.mixed:
        return Objective(score_key(benchmark), True)
    entry = next(iter(tasks.entries.values()))
    return Objective(entry.metric_to_optimize, entry.greater_is_better)


def task_score(entry: TaskEntry, results: Mapping[str, float]) -> float:
    """One task's score in a benchmark score: the unweighted mean of its metrics over its eval splits.

    GLUE (Wang et al. 2018, "GLUE: A Multi-Task Benchmark and Analysis Platform for NLU", §4, and
    gluebenchmark.com): a task with two metrics (MRPC and QQP: F1 and accuracy; STS-B: Pearson
    and Spearman) counts their unweighted mean. MNLI's matched and mismatched accuracies count as
    one task, their mean, as T5 groups them (t5/evaluation/eval_utils.py, METRIC_NAMES and
    compute_avg_glue: both in the group "MNLI"). `results` is keyed as the task logs (metric_key).
    """
    keys = [metric_key(entry, split, key) for split in entry.eval_splits for name in entry.metrics
            for key in metrics.metric_keys(name)]
    return sum(results[key] for key in keys) / len(keys)


def benchmark_score(found: Mapping[str, TaskEntry], results: Mapping[str, float]) -> float:
    """The macro-average of `task_score` over the tasks; `results` keyed `<task>/<metric key>`.

    Over all nine GLUE tasks this is GLUE's score; the diagnostic set (AX) has no labels and no
    part in it. Over a subset it is the same average over the tasks trained.
    """
    scores = [task_score(entry, {key[len(name) + 1:]: value for key, value in results.items()
                                 if key.startswith(f"{name}/")})
              for name, entry in found.items()]
    return sum(scores) / len(scores)


def combined_train(tasks: Tasks) -> datasets.Dataset:
    """The training rows the run draws from: one task's, or every task's end to end with their index `idx`."""
    splits = [task.train for task in tasks.data.values()]
    if not tasks.mixed:
        return splits[0]
    rows = datasets.concatenate_datasets([data.model_columns(split) for split in splits])
    return rows.add_column("idx", list(range(len(rows))))


def eval_splits(tasks: Tasks) -> dict[str, datasets.Dataset]:
    """Every eval split of the run, keyed by split for one task, by `<task>/<split>` for a mixture."""
    return {f"{name}/{split}" if tasks.mixed else split: ds
            for name, task in tasks.data.items() for split, ds in task.evals.items()}


def build_loaders(tasks: Tasks, config, tokenizer, decoder_start_token_id: int, num_processes: int = 1):
    """The training loader (a mixture's draws its rows with a MixtureSampler) and every task's eval loaders.

    Eval loaders are keyed as `eval_splits` keys them.
    """
    if not tasks.mixed:
        return data.build_loaders(next(iter(tasks.data.values())), config, tokenizer, decoder_start_token_id,
                                  num_processes)
    train = combined_train(tasks)
    sizes = {name: len(task.train) for name, task in tasks.data.items()}
    rates = mixture.mixing_rates(sizes, config.mixing or "examples_proportional", config.mixing_cap,
                                 config.mixing_temperature)
    batch = global_batch(batch_layout(config, num_processes))
    # An epoch of the mixture is as many rows as its tasks hold together, in whole global batches.
    epoch_rows = max(batch, sum(sizes.values()) // batch * batch)
    lengths = [len(ids) for ids in data.column_values(train, "input_ids")] if config.group_by_length else None
    sampler = mixture.MixtureSampler(list(sizes.values()), list(rates.values()), epoch_rows, config.seed,
                                     lengths=lengths, batch_size=batch)
    return (data.train_loader(train, sampler, config, tokenizer, decoder_start_token_id),
            data.ordered_loaders(eval_splits(tasks), config, tokenizer, decoder_start_token_id))


def make_evaluator(accelerator, config, tasks: Tasks, eval_loaders: dict, tokenizer, decodings: dict):
    """`evaluate(model) -> results`: one task's metrics as before, or each task's as `<task>/<key>` plus the score.

    A mixture writes predictions_<task>_<split>.tsv; one task predictions_<split>.tsv.
    """
    evaluators = {}
    for name, entry in tasks.entries.items():
        task = tasks.data[name]
        loaders = {split: eval_loaders[f"{name}/{split}" if tasks.mixed else split] for split in task.evals}
        evaluators[name] = evaluation.make_generation_evaluator(
            accelerator, entry, task, loaders, tokenizer, config.output_dir, decodings[name], config.max_target_length,
            config.rouge_use_stemmer, file_prefix=f"{name}_" if tasks.mixed else "")
    if not tasks.mixed:
        return next(iter(evaluators.values()))

    def evaluate(model) -> dict:
        results = {f"{name}/{key}": value for name, fn in evaluators.items() for key, value in fn(model).items()}
        results[score_key(config.benchmark)] = benchmark_score(tasks.entries, results)
        return results

    return evaluate
