"""SIGKILL training runs at random points, resume each with `auto`, and compare with a run never killed.

For each script (fine_tune_t5.py on the topics of 64 BBC News articles, pre_train_t5.py on 200
of them, in memory and streamed: the corpus the demo uses, which ships with the package), one
reference run, then N kill points drawn at random from every point a run can die at once a
checkpoint exists: after any micro-batch (mid-accumulation included), during an evaluation, or
while a checkpoint is being written. Each killed run is resumed with
`--resume_from_checkpoint auto` and must equal the reference bitwise: every step's loss, the
final weights, and the evaluation results. The machinery is t5_training/kill_runs.py; the tests run
scenarios of the same shape at a few fixed points, on the data they make (tests/kill_harness.py).

    python benchmarks/random_kills.py                  # 10 points per script, ~10 min on 2 cores
    python benchmarks/random_kills.py --points 3 --scripts fine_tune

Prints, per script, `10/10 identical` or the first difference of each failing point, and
writes the results to --json. Exits 1 if any point differed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import TINY_CONFIG  # noqa: E402

from t5_training import data, experiments, kill_runs  # noqa: E402
from t5_training.tasks import get_entry  # noqa: E402

SCENARIOS = ("fine_tune", "pre_train", "pre_train_streaming")


def bbc_inputs(folder: str) -> dict:
    """The BBC News corpus in `folder`: a tokenizer trained on its training articles (1,000 pieces),
    the articles as text files, and 64 of them with their topics as fine-tuning rows."""
    entry = get_entry("embedded", "bbc_news")
    splits = data.load_splits(entry)
    tokenizer = experiments.make_tokenizer(os.path.join(folder, "tokenizer"), splits["train"]["text"],
                                           entry.label_words, 1000)
    corpus = experiments.write_corpus(os.path.join(folder, "corpus"), splits)
    rows = experiments.write_labelled_rows(splits["train"], 64, 0, os.path.join(folder, "labelled.jsonl"))
    task = ["--benchmark", "embedded", "--dataset_name", "bbc_news", "--train_file", rows,
            "--validation_file", corpus["validation_rows"], "--config_name", TINY_CONFIG, "--tokenizer_name", tokenizer,
            "--max_source_length", "64", "--max_target_length", "8", "--per_device_eval_batch_size", "32",
            "--logging_steps", "1", "--learning_rate", "1e-3"]
    return {"tokenizer": tokenizer, "corpus": corpus["train"], "task": task}


def scenario(name: str, inputs: dict, folder: str) -> kill_runs.Scenario:
    if name == "fine_tune":
        return kill_runs.fine_tune_scenario(inputs["task"])
    corpus, held_out = kill_runs.corpus_slice(inputs["corpus"], folder)
    return kill_runs.pre_train_scenario(corpus, held_out, inputs["tokenizer"], TINY_CONFIG,
                                        streaming=name == "pre_train_streaming")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10, help="kill points per script")
    parser.add_argument("--seed", type=int, default=0, help="draws the kill points")
    parser.add_argument("--scripts", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    parser.add_argument("--json", default="random_kills.json", help="where to write the results")
    args = parser.parse_args()

    results, failed = {}, False
    with tempfile.TemporaryDirectory() as root:
        inputs = bbc_inputs(root)
        for name in args.scripts:
            started = time.perf_counter()
            run = scenario(name, inputs, root)
            reference = kill_runs.reference_run(run, os.path.join(root, name, "reference"))
            points = kill_runs.random_points(run, args.points, args.seed)
            outcomes = {}
            for point in points:
                out = os.path.join(root, name, point.replace(":", "_"))
                try:
                    difference = kill_runs.first_difference(reference, kill_runs.kill_and_resume(run, out, point))
                except AssertionError as err:  # the kill or the resume itself went wrong
                    difference = str(err).splitlines()[0]
                outcomes[point] = difference or "identical"
                print(f"{name:20s} kill at {point:12s} -> {outcomes[point]}", flush=True)
            same = sum(v == "identical" for v in outcomes.values())
            failed |= same != len(points)
            seconds = time.perf_counter() - started
            print(f"{name}: {same}/{len(points)} identical ({run.max_steps} steps, accumulation "
                  f"{run.accumulation}, checkpoint every {run.save_steps}; {seconds:.0f} s)\n", flush=True)
            results[name] = {"identical": same, "points": outcomes, "seconds": round(seconds, 1)}
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
