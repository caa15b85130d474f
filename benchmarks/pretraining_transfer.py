"""Does pretraining pay off? A tiny T5 pretrained on WikiText-2, then fine-tuned on SST-2, against the same model from random init.

1. Train a SentencePiece tokenizer on WikiText-2 (T5 special ids, 100 sentinels).
2. Pretrain configs/t5-tiny.json with span corruption on WikiText-2 (the corpus's last chunks
   held out), printing the held-out loss as it falls.
3. Fine-tune on the first --train_rows rows of SST-2, once from the pretrained weights and
   once from random init: same tokenizer, shape, steps, dropout and seed, at each learning
   rate of --learning_rates and each seed. Both are scored on the whole SST-2 dev set (872
   sentences). Each model is reported at each rate and at its best rate (by mean accuracy
   over the seeds), so neither is judged at a rate that suits only the other.

    python benchmarks/pretraining_transfer.py       # ~35 min pretraining + ~20 min fine-tuning, 2 CPU cores

Pretraining resumes (`--resume_from_checkpoint auto`), and a fine-tuning run that finished
is read back rather than repeated (runs are deterministic on CPU), so a second invocation
with the same --output_dir and more --seeds only trains what is new. Prints a table and
writes results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import fine_tune_t5  # noqa: E402  (the repository root must be on the path first)
import pre_train_t5  # noqa: E402
from t5_training import reporting  # noqa: E402
from t5_training.tokenizer import train_tokenizer  # noqa: E402

DATA = os.environ.get("SHARED_DATA") or os.path.normpath(os.path.join(REPO, "..", "shared", "data"))
WIKITEXT = [os.path.join(DATA, "wikitext-2", "tokenized", name) for name in ("valid.txt", "test.txt")]
TINY = os.path.join(REPO, "configs", "t5-tiny.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="runs/pretraining_transfer")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--pretrain_steps", type=int, default=4000)
    parser.add_argument("--train_rows", type=int, default=500, help="SST-2 training rows used to fine-tune")
    parser.add_argument("--fine_tune_steps", type=int, default=300)
    parser.add_argument("--learning_rates", type=float, nargs="+", default=[3e-4, 1e-3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    args = parser.parse_args()

    started = time.perf_counter()
    tokenizer = os.path.join(args.output_dir, "tokenizer")
    if not os.path.isfile(os.path.join(tokenizer, "tokenizer.json")):
        lines = [line for path in WIKITEXT for line in open(path, encoding="utf-8") if line.strip()]
        train_tokenizer(lines, tokenizer, vocab_size=args.vocab_size)

    pretrain_dir = os.path.join(args.output_dir, "pretrain")
    pre_train_t5.main([
        "--config_name", TINY, "--tokenizer_name", tokenizer, "--train_file", *WIKITEXT,
        "--output_dir", pretrain_dir, "--resume_from_checkpoint", "auto", "--max_seq_length", "128",
        "--per_device_train_batch_size", "32", "--max_steps", str(args.pretrain_steps),
        # nanoT5's recipe scaled down: AdamW with RMS-scaled steps, cosine decay.
        "--optim", "adamw_scale", "--learning_rate", "1e-2", "--lr_scheduler_type", "cosine",
        "--warmup_steps", str(max(1, args.pretrain_steps // 20)), "--eval_steps", str(max(1, args.pretrain_steps // 4)),
        "--save_steps", str(max(1, args.pretrain_steps // 4)), "--logging_steps", "100", "--max_eval_samples", "128",
    ])
    evals = pretrained_evals(pretrain_dir)

    models = {"pretrained": ["--model_name_or_path", os.path.join(pretrain_dir, "final")],
              "random init": ["--config_name", TINY]}
    results = {"pretraining": evals, "fine_tuning": []}
    for lr in args.learning_rates:
        for seed in args.seeds:
            for name, model in models.items():
                out = os.path.join(args.output_dir, f"sst2_{name.replace(' ', '_')}_lr{lr:g}_seed{seed}")
                tuned = finished(out) or fine_tune_t5.main([
                    "--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", os.path.join(DATA, "SST-2"),
                    "--tokenizer_name", tokenizer, *model, "--output_dir", out, "--overwrite_output_dir",
                    "--max_train_samples", str(args.train_rows), "--max_eval_samples", "0",
                    "--max_source_length", "64", "--max_target_length", "8", "--per_device_train_batch_size", "32",
                    "--per_device_eval_batch_size", "128", "--learning_rate", str(lr),
                    "--max_steps", str(args.fine_tune_steps), "--warmup_steps", str(args.fine_tune_steps // 10),
                    "--dropout_rate", "0.1", "--logging_steps", "50", "--seed", str(seed),
                ])
                results["fine_tuning"].append({"model": name, "learning_rate": lr, "seed": seed,
                                               "accuracy": tuned["eval"]["accuracy"], "dev_loss": tuned["eval"]["loss"]})
    rows = [summarize(results["fine_tuning"], name, lr) for lr in args.learning_rates for name in models]
    best = [max((row for row in rows if row["model"] == name), key=lambda row: row["accuracy (mean)"])
            for name in models]
    results["table"], results["best"] = rows, best
    reporting.write_json(os.path.join(args.output_dir, "results.json"), results)
    print(f"\npretraining: {args.pretrain_steps} steps of 32 x 141 tokens on WikiText-2; held-out loss "
          + " -> ".join(f"{e['loss']:.3f}" for e in evals) + f" (steps {', '.join(str(e['step']) for e in evals)})")
    print(f"fine-tuning: {args.fine_tune_steps} steps of 32 on the first {args.train_rows} SST-2 rows, "
          f"seeds {args.seeds}; SST-2 dev accuracy and loss\n")
    print(reporting.format_table(rows))
    print("\nat each model's best learning rate:")
    print(reporting.format_table(best))
    print(f"\ntook {time.perf_counter() - started:.0f} s")


def finished(run_dir: str) -> dict | None:
    """The results of a fine-tuning run that already finished in `run_dir`, if there is one."""
    path = os.path.join(run_dir, "eval_results.json")
    if not os.path.isfile(os.path.join(run_dir, "final", "model.safetensors")) or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return {"eval": json.load(f)}


def summarize(runs: list[dict], name: str, lr: float) -> dict:
    mine = [r for r in runs if r["model"] == name and r["learning_rate"] == lr]
    return {"model": name, "learning rate": lr,
            "accuracy (mean)": round(statistics.mean(r["accuracy"] for r in mine), 2),
            "per seed": " ".join(f"{r['accuracy']:.2f}" for r in mine),
            "dev loss (mean)": round(statistics.mean(r["dev_loss"] for r in mine), 4)}


def pretrained_evals(run_dir: str) -> list[dict]:
    newest = sorted(name for name in os.listdir(run_dir) if name.startswith("step-"))[-1]
    with open(os.path.join(run_dir, newest, "train_state.json"), encoding="utf-8") as f:
        return json.load(f)["evals"]


if __name__ == "__main__":
    main()
