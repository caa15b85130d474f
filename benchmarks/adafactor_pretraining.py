"""T5's Adafactor against HF's external-lr variant (and AdamWScale) in the same short pretraining run.

    python benchmarks/adafactor_pretraining.py                 # 600 steps each, ~15 min on 2 CPU cores
    python benchmarks/adafactor_pretraining.py --steps 2000 --optims adafactor adafactor_hf

Each optimizer pretrains configs/t5-tiny.json with span corruption on WikiText-2 (the tokenizer
of benchmarks/pretraining_transfer.py, 8,000 pieces), from the same initial weights (seed), on
the same batches (32 x 128 input tokens), at the same learning rate 1e-2. The schedule is T5's
inverse square root with warmup equal to the run (so the rate stays at 1e-2, as in T5's first
10,000 steps); AdamWScale gets its own recipe from pretraining_transfer.py as a reference
(cosine from 1e-2, 5% warmup). Prints the held-out span-corruption loss at every quarter of the
run and writes results.json. Finished runs are read back, not repeated.
"""
from __future__ import annotations

import argparse
import os
import time

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import TINY_CONFIG as TINY, WIKITEXT  # noqa: E402

import pre_train_t5  # noqa: E402  (the repository root must be on the path first)
from t5_training import reporting, run_dir  # noqa: E402
from t5_training.tools.tokenizer import train_tokenizer  # noqa: E402


def schedule(optim: str, steps: int) -> list[str]:
    if optim == "adamw_scale":
        return ["--lr_scheduler_type", "cosine", "--warmup_steps", str(max(1, steps // 20))]
    return ["--lr_scheduler_type", "inverse_sqrt", "--warmup_steps", str(steps)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", default="runs/adafactor_pretraining")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--optims", nargs="+", default=["adafactor", "adafactor_hf", "adamw_scale"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    tokenizer = os.path.join(args.output_dir, "tokenizer")
    if not os.path.isfile(os.path.join(tokenizer, "tokenizer.json")):
        lines = [line for path in WIKITEXT for line in open(path, encoding="utf-8") if line.strip()]
        train_tokenizer(lines, tokenizer, vocab_size=8000)
    rows = []
    for optim in args.optims:
        out = os.path.join(args.output_dir, optim)
        pre_train_t5.main([
            "--config_name", TINY, "--tokenizer_name", tokenizer, "--train_file", *WIKITEXT, "--output_dir", out,
            "--resume_from_checkpoint", "auto", "--max_seq_length", "128", "--per_device_train_batch_size", "32",
            "--max_steps", str(args.steps), "--optim", optim, "--learning_rate", "1e-2", *schedule(optim, args.steps),
            "--eval_steps", str(max(1, args.steps // 4)), "--save_steps", str(args.steps), "--logging_steps", "100",
            "--max_eval_samples", "128", "--seed", str(args.seed),
        ])
        evals = run_dir.read_state(out, args.steps)["evals"]
        rows.append({"optim": optim, "held-out loss by quarter": " -> ".join(f"{e['loss']:.3f}" for e in evals),
                     "final loss": round(evals[-1]["loss"], 4), "span accuracy": round(evals[-1]["accuracy"], 2)})
    reporting.write_json(os.path.join(args.output_dir, "results.json"), {"steps": args.steps, "rows": rows})
    print(f"\n{args.steps} steps of 32 x 128 tokens on WikiText-2, lr 1e-2, seed {args.seed}\n")
    print(reporting.format_table(rows))
    print(f"\ntook {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
