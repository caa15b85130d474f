"""A GLUE mixture against each of its tasks fine-tuned alone on as many of its rows, from the same initial model.

    python benchmarks/mixture_vs_single.py       # SST-2, CoLA, MRPC, STS-B from ../shared/data, t5-tiny from scratch
    python benchmarks/mixture_vs_single.py --mixing examples_proportional --mixing_cap 8192 --steps 1000
    python benchmarks/mixture_vs_single.py --model_name_or_path PRETRAINED/final --tokenizer_name TOKENIZER
    python benchmarks/mixture_vs_single.py --quick --output runs/quick.json       # CI: that it works

1. Trains a SentencePiece tokenizer on the tasks' training sentences and saves one randomly
   initialised t5-tiny, which every run starts from; or, with --model_name_or_path, every run
   starts from that model (e.g. a pre_train_t5.py export) and its --tokenizer_name.
2. Trains the mixture (`fine_tune_t5.py --dataset_name sst2,cola,mrpc,stsb --data_dir DATA --mixing ...`)
   for --steps steps, with --do_predict: every task's dev metrics, the GLUE score, the submission files.
3. Reads the rows it trained on of each task (mixture_rates.json) and fine-tunes each task alone,
   same batch, learning rate and schedule, for as many steps as those rows fill.
4. Prints one table (each task's metrics both ways, SST-2's majority class) and writes JSON.
Each run is `fine_tune_t5.main` in this process; a finished run is read back, not repeated, and one
finished with other flags is refused in one line (pass another --output_dir).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys

from _harness import DATA, REPO, TINY_CONFIG, set_environment  # noqa: E402  (puts the repository on the path)

TASKS = ("sst2", "cola", "mrpc", "stsb")
# SST-2 dev: 428 negative, 444 positive.
SST2_MAJORITY = 100 * 444 / 872


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mixing", default="temperature", choices=("examples_proportional", "temperature", "equal"))
    parser.add_argument("--mixing_temperature", type=float, default=2.0)
    parser.add_argument("--mixing_cap", type=int, default=None)
    parser.add_argument("--steps", type=int, default=600, help="the mixture's optimizer steps")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")
    parser.add_argument("--output_dir", default=os.path.join(REPO, "runs", "mixture_vs_single"))
    parser.add_argument("--output", default=None, help="results JSON (default: OUTPUT_DIR/results.json)")
    parser.add_argument("--model_name_or_path", default=None,
                        help="the model every run starts from (default: a random t5-tiny saved once)")
    parser.add_argument("--tokenizer_name", default=None, help="its tokenizer (default: the model's folder)")
    parser.add_argument("--quick", action="store_true", help="10 steps of 16 on 200 rows a task: that it works")
    args = parser.parse_args(argv)
    if args.tokenizer_name and not args.model_name_or_path:
        parser.error("--tokenizer_name goes with --model_name_or_path; without it the benchmark trains its own")
    return args


def prepare(work: str, quick: bool) -> tuple[str, str]:
    """The tokenizer (trained on every task's training sentences) and the one initial model."""
    import torch

    from t5_training.modeling import load_model, load_tokenizer
    from t5_training.tools.tokenizer import train_tokenizer

    tokenizer_dir, model_dir = os.path.join(work, "tokenizer"), os.path.join(work, "initial_model")
    if os.path.isdir(model_dir):
        return tokenizer_dir, model_dir
    columns = {"SST-2": [0], "CoLA": [3], "MRPC": [3, 4], "STS-B": [7, 8]}
    texts = []
    for folder, wanted in columns.items():
        with open(os.path.join(DATA, folder, "train.tsv"), encoding="utf-8-sig") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        texts += [row[i] for row in rows[:2000 if quick else 20000] for i in wanted if i < len(row)]
    # Task prefixes, input keys and label words as pieces of their own, as in T5's vocabulary.
    words = ("sst2 cola mrpc stsb sentence: sentence1: sentence2: negative positive acceptable unacceptable "
             "equivalent not_equivalent 0.0 1.2 2.4 3.6 4.8 5.0")
    train_tokenizer(texts + [words] * 50, tokenizer_dir, vocab_size=1000 if quick else 2000)
    torch.manual_seed(0)
    load_model(None, TINY_CONFIG, load_tokenizer(tokenizer_dir)).save_pretrained(model_dir)
    return tokenizer_dir, model_dir


def fine_tune(args, out: str, tokenizer_dir: str, model_dir: str, *flags: str) -> dict:
    """One fine_tune_t5.py run (or the finished one read back, if it had these flags): its eval results."""
    from t5_training import experiments

    argv = ["--benchmark", "glue", "--model_name_or_path", model_dir, "--tokenizer_name", tokenizer_dir,
            "--per_device_train_batch_size", str(args.batch_size), "--per_device_eval_batch_size", "128",
            "--learning_rate", str(args.learning_rate), "--warmup_steps", "30", "--dropout_rate", "0",
            "--max_source_length", "128", "--max_target_length", "8", "--logging_steps", "50",
            "--save_total_limit", "1", "--seed", "0", "--group_by_length", *flags]
    if args.quick:
        argv += ["--max_train_samples", "200", "--max_eval_samples", "64"]
    print(f"$ fine_tune_t5.py {' '.join(argv)} --output_dir {out}", flush=True)
    return experiments.fine_tune_once(out, argv)["eval"]


def main(argv=None) -> dict:
    args = parse_args(argv)
    set_environment(args.threads or (1 if args.quick else 0))
    if args.quick:
        args.steps, args.batch_size = 10, 16
    os.makedirs(args.output_dir, exist_ok=True)
    if args.model_name_or_path:
        tokenizer_dir, model_dir = args.tokenizer_name or args.model_name_or_path, args.model_name_or_path
    else:
        tokenizer_dir, model_dir = prepare(args.output_dir, args.quick)
    mixing = ["--mixing", args.mixing]
    if args.mixing == "temperature":
        mixing += ["--mixing_temperature", str(args.mixing_temperature)]
    if args.mixing_cap:
        mixing += ["--mixing_cap", str(args.mixing_cap)]
    mixed_dir = os.path.join(args.output_dir, "mixture")
    mixed = fine_tune(args, mixed_dir, tokenizer_dir, model_dir, "--dataset_name", ",".join(TASKS),
                      "--data_dir", DATA, "--max_steps", str(args.steps), "--do_predict", *mixing)
    with open(os.path.join(mixed_dir, "mixture_rates.json"), encoding="utf-8") as f:
        rates = json.load(f)

    from t5_training.registry import GLUE
    from t5_training import multitask

    folders = {task: os.path.join(DATA, GLUE[task].folder) for task in TASKS}
    alone, table = {}, []
    for task in TASKS:
        steps = max(1, math.ceil(rates[task]["rows_trained"] / args.batch_size))
        alone[task] = fine_tune(args, os.path.join(args.output_dir, f"alone_{task}"), tokenizer_dir, model_dir,
                                "--dataset_name", task, "--data_dir", folders[task], "--max_steps", str(steps))
        for metric in GLUE[task].metrics:
            table.append({"task": task, "metric": metric, "rows": rates[task]["rows_trained"],
                          "rate": round(rates[task]["realised_rate"], 4), "alone_steps": steps,
                          "mixture": round(mixed[f"{task}/{metric}"], 2), "alone": round(alone[task][metric], 2)})
    alone_results = {f"{task}/{key}": value for task, result in alone.items() for key, value in result.items()}
    score_alone = multitask.benchmark_score({task: GLUE[task] for task in TASKS}, alone_results)
    results = {"settings": {k: v for k, v in vars(args).items() if k != "output"}, "rates": rates, "table": table,
               "glue_score": {"mixture": mixed["glue_score"], "alone": score_alone},
               "sst2_majority": SST2_MAJORITY,
               "submission": sorted(os.listdir(os.path.join(mixed_dir, "submission")))}
    print(f"\n{'task':6} {'metric':18} {'rows':>6} {'rate':>7} {'mixture':>8} {'alone':>8} (alone: steps)")
    for row in table:
        print(f"{row['task']:6} {row['metric']:18} {row['rows']:>6} {row['rate']:>7.4f} {row['mixture']:>8.2f} "
              f"{row['alone']:>8.2f} ({row['alone_steps']})")
    print(f"GLUE score over the four: mixture {mixed['glue_score']:.2f}, alone {score_alone:.2f}; "
          f"SST-2 majority class {SST2_MAJORITY:.2f}; submission files: {', '.join(results['submission'])}")
    with open(args.output or os.path.join(args.output_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    return results


if __name__ == "__main__":
    from t5_training.errors import run_cli

    sys.exit(run_cli(main, sys.argv[1:]))
