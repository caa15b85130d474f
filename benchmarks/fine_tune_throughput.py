"""Fine-tuning throughput on SST-2: this project's loop against HF's Seq2SeqTrainer, side by side.

    python benchmarks/fine_tune_throughput.py --threads 1   # the headline pair, t5-small, 3 x 2 runs of 200 steps, ~25 min
    python benchmarks/fine_tune_throughput.py --threads 1 --sides all --repeats 1 --untimed_steps 20  # all 7
    python benchmarks/fine_tune_throughput.py --quick      # tiny model, 4 steps: checks that it runs, not its speed

Seven sides train the same model for the same number of optimizer steps:

  ours group_by_length   fine_tune_t5.main(...) with --group_by_length (dynamic padding, similar lengths batched)
  ours                   fine_tune_t5.main(...) without it (dynamic padding, plain shuffle)
  hf group_by_length     HF at its best: Seq2SeqTrainer + DataCollatorForSeq2Seq with its own length-grouped
                         sampler (transformers 5: train_sampling_strategy="group_by_length") and fused AdamW
  hf dynamic padding     Seq2SeqTrainer + DataCollatorForSeq2Seq, as run_summarization.py sets them up
  hf pad to max length   Seq2SeqTrainer + default_data_collator over rows padded to the max lengths
                         (run_glue.py's default pad_to_max_length=True, max_seq_length=128)
  ours compiled          ours group_by_length with --torch_compile (--compile_backend)
  hf compiled            hf group_by_length with torch_compile=True (the same backend)

The compiled sides spend their first steps compiling: time them with --untimed_steps, which
leaves that many first steps of every side out of its span and its tokens (then ours is timed by
wrapping the loop's train_step, from the end of the last untimed step, as HF's timer is).

The headline is the first pair, each at its best. By default the run is exactly one epoch over
the first steps x batch SST-2 rows, so every side trains on the same rows and the same
non-padding tokens: over a slice of a larger epoch the samplers would draw different rows
(HF's puts its longest batch first), and the faster side could simply be the one that drew
shorter sentences. 200 steps of 32 are 6,400 rows, where both length-grouped samplers sort
windows of 50 batches, as they do on all of SST-2 (HF's window is min(rows / (4 x batch), 50)
batches, so on fewer rows it would pad more than ours for that reason alone).

What is the same on every side: the initial weights (built once from --model_config with a fixed
seed and saved, then loaded by every side with from_pretrained), the tokenizer, the token ids of
every row (formatted and tokenized by t5_training.data.tokenize_split from the registry entry, so
"sst2 sentence: <text>" -> "negative"/"positive" + EOS), the max lengths (--max_source_length,
--max_target_length), the batch size, the steps, AdamW (torch's fused kernel on both sides: HF's
default adamw_torch_fused, and ours) at a constant learning rate without warmup or weight decay,
gradient clipping at 1.0, fp32, one process, no evaluation or saving during the timed part. HF
keeps its own defaults otherwise (dataloader, logging, loss averaging).

Timing, the same span on both sides: wall time from fetching the first batch to the end of the
last optimizer step. Ours is train_results.json's train_runtime (time inside optimizer steps,
batch fetching included); HF's is measured by a TrainerCallback from on_epoch_begin (just before
the dataloader iterator is created) to the last on_step_end. Samples/s = steps x batch / time;
tokens/s counts input plus target tokens that are not padding (HF's by counting each batch its
collator builds). Each side runs in a fresh Python process, in alternating order over
--repeats; the table reports the median and the best run (other load on the machine only ever
slows a run down), with the load average around each run in the JSON. Prints a table and
writes --output (JSON).
"""
from __future__ import annotations

import argparse
import os
import time

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import (REPO, SST2_DIR, THREADS_HELP, add_device_argument, best_of, child_main, load_average,
                      measured_side, median_of, prepare_tokenizer_and_model, record_steps, run_sides, set_environment,
                      use_device)
from _hf_fine_tune import run_hf

SIDES = ("ours group_by_length", "hf group_by_length", "ours", "hf dynamic padding", "hf pad to max length",
         "ours compiled", "hf compiled")
UNCOMPILED = SIDES[:5]
# ours (group_by_length) over each side; the first is the headline: HF's best configuration.
GOALS = {"hf group_by_length": 1.0, "hf compiled": 1.0, "hf dynamic padding": 1.5, "hf pad to max length": 2.0}
# On a GPU, where users train: 1.5x HF's best, uncompiled and compiled (docs/performance.md).
CUDA_GOALS = {**GOALS, "hf group_by_length": 1.5, "hf compiled": 1.5}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, a few steps and rows: checks that the benchmark runs (~1 min)")
    parser.add_argument("--model_config", default=None, help="default: configs/t5-small.json (quick: t5-tiny.json)")
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="SentencePiece vocabulary trained on SST-2 (default 8000; quick: 1000)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per side (default 200; quick: 4)")
    parser.add_argument("--batch_size", type=int, default=None, help="per-device train batch (default 32; quick: 8)")
    parser.add_argument("--train_rows", type=int, default=None,
                        help="first N SST-2 training rows; 0: all 67,349 (default: steps x batch, one epoch, "
                             "so every side trains on the same rows)")
    parser.add_argument("--max_source_length", type=int, default=128)
    parser.add_argument("--max_target_length", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--repeats", type=int, default=None, help="runs of each side (default 3; quick: 1)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sides", nargs="+", choices=SIDES + ("all",), default=None,
                        help="which sides to run, or all (default: the headline pair, ours and HF's best; quick: the "
                             "five uncompiled ones)")
    parser.add_argument("--untimed_steps", type=int, default=0,
                        help="first optimizer steps of every side left out of its time (where the compiled sides "
                             "compile); default 0: the whole run is timed")
    parser.add_argument("--compile_backend", default="inductor",
                        help="torch.compile backend of the compiled sides (ours: --torch_compile_backend, HF: "
                             "torch_compile_backend)")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    add_device_argument(parser)
    parser.add_argument("--bf16", action="store_true",
                        help="bf16 autocast on both sides (ours: --mixed_precision bf16, HF: bf16=True); "
                             "default fp32")
    parser.add_argument("--work_dir", default=None, help="default: runs/fine_tune_throughput[_quick]")
    parser.add_argument("--output", default=None, help="results JSON (default: WORK_DIR/results.json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a job file: run one side and exit
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {"model_config": os.path.join(REPO, "configs", "t5-tiny.json" if quick else "t5-small.json"),
                "vocab_size": 1000 if quick else 8000, "steps": 4 if quick else 200, "batch_size": 8 if quick else 32,
                "repeats": 1 if quick else 3, "threads": 1 if quick else 0,
                "work_dir": os.path.join(REPO, "runs", "fine_tune_throughput" + ("_quick" if quick else ""))}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.output = args.output or os.path.join(args.work_dir, "results.json")
    if args.sides is None:
        args.sides = list(UNCOMPILED if quick else SIDES[:2])
    if "all" in args.sides:
        args.sides = list(SIDES)
    if args.untimed_steps >= args.steps:
        parser.error("--untimed_steps must be below --steps: the timed span is the steps after them")
    if args.train_rows is None:
        args.train_rows = args.steps * args.batch_size
    if args.train_rows and args.train_rows < args.steps * args.batch_size:
        # Otherwise an epoch would end inside the timed part, with a short batch on some sides.
        parser.error(f"--train_rows must be 0 or at least --steps x --batch_size ({args.steps * args.batch_size})")
    return args


# --- one side, in its own process ----------------------------------------------------------------

def run_ours(job: dict) -> dict:
    import fine_tune_t5

    recorded = record_steps() if job["untimed_steps"] else None

    results = fine_tune_t5.main([
        "--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", SST2_DIR,
        "--model_name_or_path", job["model"], "--tokenizer_name", job["tokenizer"],
        "--output_dir", job["run_dir"], "--overwrite_output_dir",
        "--max_source_length", str(job["max_source_length"]), "--max_target_length", str(job["max_target_length"]),
        "--per_device_train_batch_size", str(job["batch_size"]), "--max_steps", str(job["steps"]),
        "--max_train_samples", str(job["train_rows"]),
        # The loop always evaluates and saves once at the end, outside the timed span: keep it small.
        "--max_eval_samples", "8", "--per_device_eval_batch_size", "8",
        "--learning_rate", str(job["learning_rate"]), "--lr_scheduler_type", "constant", "--warmup_steps", "0",
        "--weight_decay", "0", "--max_grad_norm", "1.0", "--mixed_precision", "bf16" if job["bf16"] else "no",
        "--logging_steps", str(job["steps"]), "--save_total_limit", "1", "--seed", str(job["seed"]),
        *(["--group_by_length"] if job["group_by_length"] else []),
        *(["--torch_compile", "--torch_compile_backend", job["compile_backend"]] if job["compiled"] else []),
    ])["train"]
    if not job["untimed_steps"]:
        return {"seconds": results["train_runtime"], "steps": results["train_steps"],
                "tokens": results["train_tokens"], "samples_per_second": results["train_samples_per_second"],
                "tokens_per_second": results["train_tokens_per_second"], "train_loss": results["train_loss"]}
    # From the end of the last untimed step to the end of the last, as HF's timer spans it.
    untimed = job["untimed_steps"]
    seconds, timed = recorded[-1]["end"] - recorded[untimed - 1]["end"], len(recorded) - untimed
    tokens = sum(int(b["attention_mask"].sum() + (b["labels"] != -100).sum())
                 for step in recorded[untimed:] for b in step["window"])
    return {"seconds": round(seconds, 3), "steps": timed, "tokens": tokens,
            "samples_per_second": round(timed * job["batch_size"] / seconds, 3),
            "tokens_per_second": round(tokens / seconds, 3), "train_loss": results["train_loss"]}


# --- the comparison ----------------------------------------------------------------------------

def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        child_main(args.child, measured_side(lambda job: (run_hf if job["side"].startswith("hf") else run_ours)(job)))
        return {}
    started = time.perf_counter()
    set_environment(args.threads)
    use_device(args.device)
    os.makedirs(args.work_dir, exist_ok=True)
    load_before = load_average()
    print(f"preparing the tokenizer and the initial weights in {args.work_dir}", flush=True)
    tokenizer_dir, model_dir = prepare_tokenizer_and_model(args.work_dir, args.model_config, args.vocab_size,
                                                           args.seed)
    base = {"model": model_dir, "tokenizer": tokenizer_dir, "steps": args.steps, "batch_size": args.batch_size,
            "train_rows": args.train_rows, "max_source_length": args.max_source_length,
            "max_target_length": args.max_target_length, "learning_rate": args.learning_rate, "seed": args.seed,
            "device": args.device, "bf16": args.bf16, "untimed_steps": args.untimed_steps,
            "compile_backend": args.compile_backend}
    # Checkpoints and exports of a t5-small run take about a GB; only the numbers matter here.
    sides = tuple(side for side in SIDES if side in args.sides)
    runs = run_sides(__file__, sides, args.repeats, base, args.work_dir, keep_run_dirs=False,
                     side_job=lambda side: {"group_by_length": side in ("ours group_by_length", "ours compiled"),
                                            "hf_group_by_length": side in ("hf group_by_length", "hf compiled"),
                                            "pad_to_max_length": side == "hf pad to max length",
                                            "compiled": side.endswith("compiled")})

    table = [{"side": side,
              "samples/s": median_of(runs, side, "samples_per_second"),
              "tokens/s": median_of(runs, side, "tokens_per_second"),
              "seconds": median_of(runs, side, "seconds"),
              "best samples/s": best_of(runs, side, "samples_per_second"),
              "samples/s per run": " ".join(f"{r['samples_per_second']:.2f}" for r in runs if r["side"] == side)}
             for side in sides]
    pairs = [(a, b) for a, b in [("ours group_by_length", "hf group_by_length"), ("ours compiled", "hf compiled"),
                                 ("ours group_by_length", "hf compiled"),
                                 ("ours group_by_length", "hf dynamic padding"),
                                 ("ours group_by_length", "hf pad to max length"), ("ours", "hf dynamic padding")]
             if a in sides and b in sides]
    ratios = {f"{a} / {b}": round(median_of(runs, a, "samples_per_second") / median_of(runs, b, "samples_per_second"),
                                  3) for a, b in pairs}
    ratios_best = {f"{a} / {b}": round(best_of(runs, a, "samples_per_second") / best_of(runs, b, "samples_per_second"),
                                       3) for a, b in pairs}
    # The samplers pick different rows, and HF's length-grouped sampler puts its longest batch
    # first, so over a short run samples/s favours whichever side drew shorter rows: non-padding
    # tokens per second is the fairer figure between the two length-grouped sides.
    token_ratios = {f"{a} / {b}": round(median_of(runs, a, "tokens_per_second")
                                        / median_of(runs, b, "tokens_per_second"), 3) for a, b in pairs}
    goals = {f"ours group_by_length / {side} >= {goal}": ratios[f"ours group_by_length / {side}"] >= goal
             for side, goal in (CUDA_GOALS if args.device == "cuda" else GOALS).items()
             if f"ours group_by_length / {side}" in ratios}
    results = {
        "settings": {**{k: v for k, v in vars(args).items() if k != "child"}, "sst2_dir": SST2_DIR,
                     "optimizer": "AdamW, constant lr, no warmup, weight decay 0, clip 1.0, "
                                  + ("bf16 autocast" if args.bf16 else "fp32"),
                     "timing": "wall time from fetching the first batch to the end of the last optimizer step; "
                               "ours: train_results.json train_runtime, hf: TrainerCallback on_epoch_begin -> "
                               "last on_step_end",
                     "tokens": "non-padding input + target tokens"},
        "load_average": {"before": load_before, "after": load_average()},
        "runs": runs, "table": table, "ratios": ratios, "ratios_best": ratios_best, "token_ratios": token_ratios,
        "goals": goals,
        "seconds": round(time.perf_counter() - started, 1),
    }
    from t5_training import reporting

    reporting.write_json(args.output, results)

    print(f"\n{os.path.basename(args.model_config)}, {args.steps} steps of {args.batch_size}, SST-2 "
          f"({args.train_rows or 'all'} training rows), max lengths {args.max_source_length}/{args.max_target_length}, "
          f"{runs[0]['threads']} torch thread(s), {args.device}, {'bf16' if args.bf16 else 'fp32'}, "
          f"median of {args.repeats} run(s) per side; load average {load_before} -> "
          f"{results['load_average']['after']}\n")
    print(reporting.format_table(table))
    print()
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x samples/s (best runs: {ratios_best[name]:.2f}x), "
              f"{token_ratios[name]:.2f}x tokens/s")
    for name, met in goals.items():
        print(f"goal {name}: {'met' if met else 'NOT met'}")
    print(f"\nwrote {args.output} ({results['seconds']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
