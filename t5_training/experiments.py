"""The experiments README's demo and the benchmarks share: paired fine-tuning runs, reuse, flag diffs.

demo.py, benchmarks/pretraining_transfer.py, benchmarks/peft.py and benchmarks/mixture_vs_single.py
build on these pieces: a tokenizer trained once, a corpus and labelled rows written as files the
scripts read, one pretraining run with T5's recipe, fine-tuning runs from pretrained weights and
from random init paired by seed, a finished run read back instead of trained again (and refused
when its flags differ), and the paired summary. The scripts' main() are reached through
t5_training.top_level at call time, so that importing this module imports neither script.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import statistics
from concurrent.futures import ProcessPoolExecutor

import torch

from t5_training import reporting, run_dir, top_level
from t5_training.errors import UsageError
from t5_training.tools.tokenizer import train_tokenizer

TINY = "t5-tiny"  # configs/t5-tiny.json, found by name from a checkout or an installed wheel
INITS = ("pretrained", "random init")


def make_tokenizer(path: str, texts, label_words, vocab_size: int) -> str:
    """Trains the tokenizer once; later runs reuse it."""
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        train_tokenizer(list(texts) + list(label_words), path, vocab_size=vocab_size, seed=0)
    return path


def write_corpus(folder: str, splits, column: str = "text") -> dict[str, str]:
    """The texts of `column` as text files, one per line (pretraining reads files, like a user's
    corpus), and the held-out rows with their labels as JSON lines for --validation_file.

    Pretraining sees only the training texts, so the held-out ones stay unseen.
    """
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for split in ("train", "validation"):
        paths[split] = os.path.join(folder, f"{split}.txt")
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(text + "\n" for text in splits[split][column])
    paths["validation_rows"] = write_labelled_rows(splits["validation"], len(splits["validation"]), None,
                                                   os.path.join(folder, "validation.jsonl"))
    return paths


def write_labelled_rows(split, n: int, seed: int | None, path: str) -> str:
    """`n` rows of `split` (drawn at random with `seed`; all of them, in order, when seed is None)
    as JSON lines that fine_tune_t5.py reads with --train_file / --validation_file."""
    if n > len(split):
        raise UsageError(f"asked for {n} labelled rows but the split has {len(split)}; ask for fewer")
    rows = split if seed is None else split.shuffle(seed=seed).select(range(n))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def pretrain(output_dir: str, tokenizer_dir: str, corpus: dict[str, str], steps: int, *flags: str) -> dict:
    """Pretrains configs/t5-tiny.json on the corpus with T5's recipe (Adafactor at 1e-2, no
    dropout); `flags` change it. Returns pre_train_t5.main's results ({"train": ..., "eval": ...}, the
    contents of the run's train_results.json and eval_results.json) plus "dir", the run's folder."""
    results = top_level.load("pre_train_t5").main([
        "--config_name", TINY, "--tokenizer_name", tokenizer_dir, "--train_file", corpus["train"],
        "--validation_file", corpus["validation"], "--output_dir", output_dir, "--overwrite_output_dir",
        "--max_seq_length", "128", "--per_device_train_batch_size", "32", "--max_steps", str(steps),
        "--optim", "adafactor", "--learning_rate", "1e-2", "--eval_steps", str(max(1, steps // 4)),
        "--logging_steps", "10", "--max_eval_samples", "64", "--save_total_limit", "1", "--seed", "0", *flags,
    ])
    return {**results, "dir": output_dir}


REUSE_RECORD = "fine_tune_flags.json"  # beside a reusable run: the flags it was trained with


def fine_tune_pairs(flags_by_seed: dict[int, list[str]], pretrained_model: str, config_name: str, folder: str,
                    reuse: bool = False, processes: int = 1) -> dict[int, dict[str, dict]]:
    """For each seed, fine-tunes the pretrained model and the same shape from random init, everything
    else equal (`flags_by_seed[seed]`: its rows, steps, learning rate).

    Returns {seed: {init: fine_tune_t5.main's results plus "dir"}}. With `reuse`, a run that
    already finished in its folder is read back instead of trained again (see reusable_result).
    `processes` > 1 trains that many runs at once, each in a process of its own on one CPU thread:
    a tiny model keeps one core busy but gains little from a second, so two runs side by side
    finish in about the time of one (each run's output then goes to `<its folder>.log`).
    """
    jobs = []
    for seed, flags in flags_by_seed.items():
        for init, model in (("pretrained", ["--model_name_or_path", pretrained_model]),
                            ("random init", ["--config_name", config_name])):
            run_folder = os.path.join(folder, f"{init.replace(' ', '_')}-seed{seed}")
            jobs.append((seed, init, run_folder, [*flags, *model, "--seed", str(seed)]))
    # Finished runs are read back (or refused) here, before any process starts: a rerun that only
    # adds seeds trains only the new pairs, and one with other flags stops at once.
    done = {job[2]: reusable_result(job[2], job[3]) for job in jobs} if reuse else {}
    todo = [(run_folder, argv) for _, _, run_folder, argv in jobs if done.get(run_folder) is None]
    if processes > 1 and len(todo) > 1:
        # spawn, not fork: the parent has run torch's thread pool, which a forked child cannot reuse.
        with ProcessPoolExecutor(min(processes, len(todo)), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=torch.set_num_threads, initargs=(1,)) as pool:
            trained = list(pool.map(_train_logged, *zip(*todo), [reuse] * len(todo)))
    else:
        trained = [train_once(run_folder, argv, reuse) for run_folder, argv in todo]
    done.update((run_folder, result) for (run_folder, _), result in zip(todo, trained))
    results: dict[int, dict[str, dict]] = {}
    for seed, init, run_folder, _ in jobs:
        results.setdefault(seed, {})[init] = {**done[run_folder], "dir": run_folder}
    return results


def _train_logged(run_folder: str, argv: list[str], record: bool) -> dict:
    """train_once with its output in `<run_folder>.log`: runs side by side would interleave theirs."""
    os.makedirs(os.path.dirname(run_folder) or ".", exist_ok=True)
    with open(f"{run_folder}.log", "w", encoding="utf-8") as log, \
            contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        return train_once(run_folder, argv, record)


def fine_tune_once(run_folder: str, argv: list[str], reuse: bool = True) -> dict:
    """fine_tune_t5.main's results for `argv` into `run_folder`; with `reuse`, a run that already finished
    there with the same flags is read back, and one with other flags is refused (refuse_other_flags)."""
    done = reusable_result(run_folder, argv) if reuse else None
    return train_once(run_folder, argv, reuse) if done is None else done


def reusable_result(run_folder: str, argv: list[str]) -> dict | None:
    """The results of a run that finished in `run_folder` with the flags `argv`; None if none finished
    there; UsageError if the one there was trained with other flags."""
    done = run_dir.read_results(run_folder)
    if done is not None:
        _check_reused(run_folder, argv)
    return done


def train_once(run_folder: str, argv: list[str], record: bool) -> dict:
    """fine_tune_t5.main for `argv` into `run_folder`; with `record`, the flags are kept beside the
    run, so that a later rerun can reuse it (reusable_result)."""
    done = top_level.load("fine_tune_t5").main([*argv, "--output_dir", run_folder, "--overwrite_output_dir"])
    if record:
        reporting.write_json(os.path.join(run_folder, REUSE_RECORD), {"argv": argv})
    return done


def _check_reused(run_folder: str, argv: list[str]) -> None:
    try:
        with open(os.path.join(run_folder, REUSE_RECORD), encoding="utf-8") as f:
            recorded = json.load(f).get("argv")
    except (OSError, ValueError, AttributeError):
        recorded = None
    refuse_other_flags(run_folder, recorded, argv)


def refuse_other_flags(run_folder: str, recorded: list[str] | None, argv: list[str]) -> None:
    """A finished run may stand in for this one only if `recorded`, its flags, are `argv`; else one line
    naming each changed flag (a rerun with another learning rate must not report the old runs)."""
    if recorded != argv:
        now, then = _flag_values(argv), _flag_values(recorded or [])
        changed = [f"{flag} {then.get(flag, '(unset)')} -> {now.get(flag, '(unset)')}"
                   for flag in sorted(set(now) | set(then)) if now.get(flag) != then.get(flag)]
        raise UsageError(f"{run_folder} holds a finished run trained with other flags "
                         f"({'; '.join(changed) if recorded else 'none recorded'}); "
                         "pass another --output_dir or delete it")


def _flag_values(argv: list[str]) -> dict[str, str]:
    """{--flag: its value} of a command line (a flag without a value maps to "")."""
    return {token: argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
            for i, token in enumerate(argv) if token.startswith("--")}


def summarize(runs: dict[int, dict[str, dict]], metric: str) -> dict:
    """A row per init (the metric per seed, its mean, the mean held-out loss) and the paired difference."""
    seeds = list(runs)
    table = [{"model": init, **{f"seed {s}": round(runs[s][init]["eval"][metric], 2) for s in seeds},
              "mean": round(statistics.mean(runs[s][init]["eval"][metric] for s in seeds), 2),
              "held-out loss": round(statistics.mean(runs[s][init]["eval"]["loss"] for s in seeds), 3)}
             for init in INITS]
    difference = reporting.paired_interval([runs[s]["pretrained"]["eval"][metric] for s in seeds],
                                           [runs[s]["random init"]["eval"][metric] for s in seeds])
    table.append({"model": "pretrained - random init",
                  **{f"seed {s}": round(runs[s]["pretrained"]["eval"][metric]
                                        - runs[s]["random init"]["eval"][metric], 2) for s in seeds},
                  "mean": round(difference["mean"], 2)})
    return {"table": table, "difference": difference}

