"""Does pretraining pay off? Pretrained against random init, paired by seed, over recipes and label counts.

    python benchmarks/pretraining_transfer.py                  # BBC topics, T5's recipe, 5 label counts x 5 seeds, ~40 min
    python benchmarks/pretraining_transfer.py --task sst2 --labelled 500 2000
    python benchmarks/pretraining_transfer.py --recipes t5_adafactor adamw_scale prefix_lm --labelled 100
    python benchmarks/pretraining_transfer.py --recipes t5_adafactor prefix_lm ul2 --labelled 100

For each --recipe, one tiny T5 (configs/t5-tiny.json, 2.2M parameters) is pretrained on the
task's own training texts with their labels unused: in-domain unlabelled text, the setting
where a small pretraining budget has something to teach. Then, for every --labelled count and
--seed, that many labelled training rows are drawn with the seed, and two models are fine-tuned
on them with everything else equal (rows, steps, dropout, seed): the pretrained one and the
same shape from random init. Both are scored on the task's whole held-out split.

Tasks:
  bbc_topic  the BBC News corpus the demo uses: 1,777 training articles, 448 held out, 5 topics
  sst2       GLUE SST-2 from ../shared/data: 67,349 training sentences, the 872-sentence dev set

Prints, per recipe and label count, each model's mean and per-seed metric and held-out loss, and
the paired difference with its 95% Student t interval over the seeds; writes results.json and
transfer.png (the metric against the number of labelled rows, both models, with the interval).
A finished pretraining or fine-tuning run is read back, not repeated (runs are deterministic on
CPU), so a rerun with more seeds or label counts trains only what is missing; a finished
fine-tuning run whose flags differ (another --learning_rate, say) is refused in one line.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import DATA, REPO, TINY_CONFIG as TINY  # noqa: E402

from t5_training import data, experiments, reporting, run_dir  # noqa: E402
from t5_training.tasks import get_entry  # noqa: E402


# Pretraining flags on top of experiments.pretrain's (T5's recipe: Adafactor at 1e-2, no dropout).
RECIPES = {
    "t5_adafactor": [],
    # nanoT5's recipe scaled down: AdamW with RMS-scaled steps, cosine decay.
    "adamw_scale": ["--optim", "adamw_scale", "--lr_scheduler_type", "cosine", "--warmup_steps", "50"],
    # The demo's recipe before T5's Adafactor was fixed: plain AdamW, linear decay.
    "adamw_2e-3": ["--optim", "adamw_torch", "--learning_rate", "2e-3", "--lr_scheduler_type", "linear",
                   "--warmup_steps", "50"],
    "prefix_lm": ["--objective", "prefix_lm"],
    # UL2's seven denoisers at equal rates, each input led by its mode token; same steps of 32 x 128
    # encoder tokens as the others (its targets are longer, so a step costs more).
    "ul2": ["--objective", "ul2"],
}
TASKS = {
    # entry, where its rows come from, the text column, the source length that keeps most rows whole
    "bbc_topic": {"entry": ("embedded", "bbc_news"), "data_dir": None, "column": "text", "source_length": 128,
                  "vocab_size": 4000},
    "sst2": {"entry": ("glue", "sst2"), "data_dir": os.path.join(DATA, "SST-2"), "column": "sentence",
             "source_length": 64, "vocab_size": 8000},
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="bbc_topic")
    parser.add_argument("--recipes", nargs="+", choices=sorted(RECIPES), default=["t5_adafactor"])
    parser.add_argument("--pretrain_steps", type=int, default=1200, help="of 32 x 128 tokens")
    parser.add_argument("--labelled", type=int, nargs="+", default=[50, 100, 200, 500, 1777],
                        help="labelled training rows to fine-tune on (a count above the split's size is refused)")
    parser.add_argument("--fine_tune_steps", type=int, default=300, help="of 16 rows, whatever the label count")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="fine-tuning, AdamW, linear decay")
    parser.add_argument("--max_eval_samples", type=int, default=0,
                        help="score the first N held-out rows (0: all of them, as every table here does)")
    parser.add_argument("--processes", type=int, default=2,
                        help="fine-tuning runs trained at once, each on one CPU thread (1: one after another)")
    parser.add_argument("--output_dir", default=None, help="default: runs/pretraining_transfer/TASK")
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error(f"--processes must be at least 1, got {args.processes}")
    args.output_dir = args.output_dir or os.path.join(REPO, "runs", "pretraining_transfer", args.task)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    task = TASKS[args.task]
    entry = get_entry(*task["entry"])
    metric = entry.metric_to_optimize
    splits = data.load_splits(entry, data_dir=task["data_dir"])
    too_many = [n for n in args.labelled if n > len(splits["train"])]
    if too_many:
        raise SystemExit(f"--labelled {too_many[0]} is more than the {len(splits['train'])} training rows; ask for fewer")
    out = args.output_dir
    tokenizer = experiments.make_tokenizer(os.path.join(out, "tokenizer"), splits["train"][task["column"]],
                                           entry.label_words, task["vocab_size"])
    corpus = experiments.write_corpus(os.path.join(out, "corpus"), splits, task["column"])

    results = {"settings": vars(args), "recipes": {}}
    for recipe in args.recipes:
        pretrained = pretrain_once(os.path.join(out, f"pretrain-{recipe}-{args.pretrain_steps}"), tokenizer, corpus,
                                   args.pretrain_steps, RECIPES[recipe])
        rows = []
        for n in args.labelled:
            flags_by_seed = {seed: [
                "--benchmark", task["entry"][0], "--dataset_name", task["entry"][1], "--tokenizer_name", tokenizer,
                "--train_file", experiments.write_labelled_rows(splits["train"], n, seed,
                                                                os.path.join(out, "labelled", f"{n}-seed{seed}.jsonl")),
                "--validation_file", corpus["validation_rows"],
                "--max_source_length", str(task["source_length"]), "--max_target_length", "8",
                "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "64",
                "--learning_rate", str(args.learning_rate), "--max_steps", str(args.fine_tune_steps),
                "--warmup_steps", str(args.fine_tune_steps // 10), "--logging_steps", "50",
                "--dropout_rate", "0.1", "--save_total_limit", "1",
                "--max_eval_samples", str(args.max_eval_samples)] for seed in args.seeds}
            runs = experiments.fine_tune_pairs(flags_by_seed, os.path.join(pretrained["dir"], "final"), TINY,
                                               os.path.join(out, f"fine_tune-{recipe}-{args.pretrain_steps}",
                                                            f"labelled{n}"),
                                               reuse=True, processes=args.processes)
            rows.append(row_of(n, runs, metric))
        results["recipes"][recipe] = {"pretraining": {"eval": pretrained["eval"], "train": pretrained["train"]},
                                      "rows": rows}
        print_recipe(args, recipe, pretrained, rows, metric, len(splits["train"]))
    png = os.path.join(out, "transfer.png")
    save_plot(png, results["recipes"], metric, args.task)
    results["seconds"] = round(time.perf_counter() - started, 1)
    reporting.write_json(os.path.join(out, "results.json"), results)
    print(f"\nwrote {os.path.join(out, 'results.json')} and {png} ({results['seconds']:.0f} s)")
    return results


def pretrain_once(folder: str, tokenizer: str, corpus: dict, steps: int, flags: list[str]) -> dict:
    """experiments.pretrain, unless a finished run of the same recipe and steps is already there."""
    done = run_dir.read_results(folder)
    return {**done, "dir": folder} if done else experiments.pretrain(folder, tokenizer, corpus, steps, *flags)


def row_of(labelled: int, runs: dict, metric: str) -> dict:
    """One label count's figures: both models per seed, their means, held-out losses, the paired difference."""
    summary = experiments.summarize(runs, metric)
    by_model = {row["model"]: row for row in summary["table"]}
    seeds = list(runs)
    difference = summary["difference"]
    return {"labelled": labelled, "seeds": seeds,
            **{f"{init} {metric}": [runs[s][init]["eval"][metric] for s in seeds] for init in experiments.INITS},
            **{f"{init} loss": [runs[s][init]["eval"]["loss"] for s in seeds] for init in experiments.INITS},
            "pretrained mean": by_model["pretrained"]["mean"], "random init mean": by_model["random init"]["mean"],
            "difference": difference}


def print_recipe(args, recipe: str, pretrained: dict, rows: list[dict], metric: str, train_rows: int) -> None:
    evaluation, training = pretrained["eval"], pretrained["train"]
    print(f"\n{args.task}, recipe {recipe}: pretrained {args.pretrain_steps} steps on the {train_rows:,} training "
          f"texts (labels unused), {training['train_tokens']:,} tokens seen, {training['train_runtime']:.0f} s; "
          f"held-out loss {evaluation['loss']:.3f}, span token accuracy {evaluation['accuracy']:.1f}%")
    print(f"fine-tuned {args.fine_tune_steps} steps of 16 at {args.learning_rate:g}, seeds {args.seeds}; "
          f"held-out {metric} and loss\n")
    table = []
    for row in rows:
        d = row["difference"]
        table.append({
            "labelled": row["labelled"], "pretrained": row["pretrained mean"], "random init": row["random init mean"],
            "difference": round(d["mean"], 2),
            "95% interval": f"{d['low']:+.2f} to {d['high']:+.2f}" if d["pairs"] > 1 else "-",
            "wins": f"{d['wins']}/{d['pairs']}",
            "loss pretrained / random": " / ".join(f"{statistics.mean(row[f'{init} loss']):.3f}"
                                                   for init in experiments.INITS),
            "per seed (pretrained | random)": " ".join(f"{v:.1f}" for v in row[f"pretrained {metric}"]) + " | "
                                              + " ".join(f"{v:.1f}" for v in row[f"random init {metric}"]),
        })
    print(reporting.format_table(table))


def save_plot(path: str, recipes: dict, metric: str, task: str) -> None:
    """The held-out metric against the number of labelled rows: each recipe's pretrained model
    and random init (the same for every recipe, drawn once), with the paired interval as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (recipe, result) in enumerate(recipes.items()):
        rows = result["rows"]
        counts = [row["labelled"] for row in rows]
        pretrained = [row["pretrained mean"] for row in rows]
        # The interval is of the difference; drawn on the pretrained mean it shows how sure the gap is.
        low = [row["pretrained mean"] - row["random init mean"] - row["difference"]["low"] for row in rows]
        high = [row["difference"]["high"] - (row["pretrained mean"] - row["random init mean"]) for row in rows]
        bars = None if any(v != v for v in low + high) else [low, high]  # NaN with one seed
        ax.errorbar(counts, pretrained, yerr=bars, marker="o", capsize=3,
                    label=f"pretrained ({recipe}); bars: 95% interval of the gain")
        if i == 0:
            ax.plot(counts, [row["random init mean"] for row in rows], marker="s", color="gray", label="random init")
    ax.set_xscale("log")
    ax.set_xlabel("labelled training rows")
    ax.set_ylabel(f"held-out {metric}")
    ax.set_title(f"{task}: pretrained vs random init, paired seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from t5_training.errors import run_cli

    sys.exit(run_cli(main, sys.argv[1:]))
