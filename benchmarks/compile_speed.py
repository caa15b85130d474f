"""--torch_compile against eager: the steady-state step time of both training scripts, side by side.

    python benchmarks/compile_speed.py --threads 1     # t5-tiny, both scripts, 2 x 3 runs each: ~15 min on 2 cores
    python benchmarks/compile_speed.py --quick          # a few steps: checks that it runs, not its speed

Each side is one run of pre_train_t5.py or fine_tune_t5.py in a fresh Python process (compiled
graphs live in the process), eager and compiled in alternating order over --repeats:

  pretraining eager / compiled     span corruption, --max_seq_length 128, batch 8 (one batch shape:
                                   a static graph, runtime.build_accelerator)
  fine-tuning eager                SST-2 with --group_by_length, batch 32
  fine-tuning compiled, widths     --torch_compile as on a GPU: batches padded to a few widths
                                   (batching.compiled_widths), a static graph for each
  fine-tuning compiled, symbolic   --torch_compile as on a CPU: each batch its longest row's width,
                                   one graph for symbolic lengths (dynamic=True)

(On either device the fine-tuning side that --torch_compile does not pick there is forced by
patching batching's device test, so that both are measured side by side.)

Every side starts from the same saved weights (seed --seed), the tokenizer trained on SST-2 and,
for pretraining, SST-2's training sentences as the corpus. Each optimizer step is timed in the
child (the loop's `train_step`, the GPU synchronized after it), with the graphs torch.compile
made during it; the steady state is the median time of the steps after the first --warmup that
compiled nothing, and compile time is the time of the steps that compiled, less that median
each. Prints a table and writes --output (JSON).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from unittest import mock

# _harness first: importing it puts the repository root on the path for the project's modules.
from _harness import (REPO, SST2_DIR, THREADS_HELP, add_device_argument, child_main, load_average, measured_side,
                      median_of, prepare_tokenizer_and_model, record_steps, run_sides, set_environment, use_device)

SIDES = ("pretraining eager", "pretraining compiled", "fine-tuning eager", "fine-tuning compiled, widths",
         "fine-tuning compiled, symbolic")
# Compiled over eager, steady state: the goal for a CPU is at least eager's throughput.
PAIRS = {"pretraining": ("pretraining compiled", "pretraining eager"),
         "fine-tuning, widths": ("fine-tuning compiled, widths", "fine-tuning eager"),
         "fine-tuning, symbolic": ("fine-tuning compiled, symbolic", "fine-tuning eager")}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a few steps, one run a side: checks that it runs")
    parser.add_argument("--model_config", default=os.path.join(REPO, "configs", "t5-tiny.json"))
    parser.add_argument("--vocab_size", type=int, default=None,
                        help="SentencePiece vocabulary trained on SST-2 (default 8000; quick: 1000)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps a run (default 60; quick: 8)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="first steps left out of the steady state (default 5; quick: 1)")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each side (default 3; quick: 1)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--backend", default="inductor", help="--torch_compile_backend of the compiled sides")
    parser.add_argument("--mode", default="default", help="--torch_compile_mode of the compiled sides")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help=THREADS_HELP)
    add_device_argument(parser)
    parser.add_argument("--work_dir", default=None, help="default: runs/compile_speed[_quick]")
    parser.add_argument("--output", default=None, help="results JSON (default: WORK_DIR/results.json)")
    args = parser.parse_args(argv)
    defaults = {"vocab_size": 1000 if args.quick else 8000, "steps": 8 if args.quick else 60,
                "warmup": 1 if args.quick else 5, "repeats": 1 if args.quick else 3,
                "work_dir": os.path.join(REPO, "runs", "compile_speed" + ("_quick" if args.quick else ""))}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.warmup >= args.steps:
        parser.error("--warmup must be below --steps: the steady state is the steps after it")
    args.output = args.output or os.path.join(args.work_dir, "results.json")
    return args


# --- one side, in its own process ----------------------------------------------------------------

def script_argv(job: dict) -> list[str]:
    """The side's command line for pre_train_t5.py or fine_tune_t5.py."""
    common = ["--model_name_or_path", job["model"], "--tokenizer_name", job["tokenizer"],
              "--output_dir", job["run_dir"], "--overwrite_output_dir", "--max_steps", str(job["steps"]),
              "--logging_steps", str(job["steps"]), "--seed", str(job["seed"]), "--dropout_rate", "0"]
    if "compiled" in job["side"]:
        common += ["--torch_compile", "--torch_compile_backend", job["backend"], "--torch_compile_mode", job["mode"]]
    if job["side"].startswith("pretraining"):
        return common + ["--train_file", job["corpus"], "--max_seq_length", "128", "--per_device_train_batch_size",
                         "8", "--max_eval_samples", "8"]
    return common + ["--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", SST2_DIR,
                     "--max_source_length", "128", "--max_target_length", "8", "--per_device_train_batch_size", "32",
                     "--group_by_length", "--max_eval_samples", "8", "--per_device_eval_batch_size", "8",
                     "--learning_rate", "1e-3"]


def run_side(job: dict) -> dict:
    from t5_training import batching

    recorded, patches = record_steps(), []
    if job["side"].endswith("widths"):
        # The GPU's choice, wherever this runs: batching then pads as on a GPU (widths, to 8).
        patches.append(mock.patch.object(batching, "runs_on_cuda", return_value=True))
    elif job["side"].endswith("symbolic"):
        patches.append(mock.patch.object(batching, "compiled_widths", return_value=None))
    for patch in patches:
        patch.start()
    if job["side"].startswith("pretraining"):
        import pre_train_t5 as script
    else:
        import fine_tune_t5 as script
    script.main(script_argv(job))
    steps = [(step["end"] - step["start"], step["graphs"]) for step in recorded]
    steady = [seconds for number, (seconds, graphs) in enumerate(steps) if number >= job["warmup"] and not graphs]
    if not steady:
        raise SystemExit(f"{job['side']}: every step after the first {job['warmup']} compiled; run more --steps")
    median = statistics.median(steady)
    return {"step_seconds": [round(s, 5) for s, _ in steps], "graphs_per_step": [g for _, g in steps],
            "graphs": sum(g for _, g in steps), "steady_steps": len(steady), "steady_ms": round(1000 * median, 3),
            "compile_seconds": round(sum(s - median for s, g in steps if g), 2)}


def write_corpus(work_dir: str) -> str:
    """SST-2's training sentences, one a line: the pretraining sides' corpus."""
    import csv

    path = os.path.join(work_dir, "corpus.txt")
    with open(os.path.join(SST2_DIR, "train.tsv"), encoding="utf-8") as f, \
            open(path, "w", encoding="utf-8") as out:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(rows)
        out.writelines(row[0] + "\n" for row in rows)
    return path


# --- the comparison ----------------------------------------------------------------------------

def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        child_main(args.child, measured_side(run_side))
        return {}
    started = time.perf_counter()
    set_environment(args.threads)
    use_device(args.device)
    os.makedirs(args.work_dir, exist_ok=True)
    load_before = load_average()
    tokenizer_dir, model_dir = prepare_tokenizer_and_model(args.work_dir, args.model_config, args.vocab_size,
                                                           args.seed)
    base = {"model": model_dir, "tokenizer": tokenizer_dir, "corpus": write_corpus(args.work_dir),
            "steps": args.steps, "warmup": args.warmup, "seed": args.seed, "backend": args.backend,
            "mode": args.mode, "device": args.device}
    sides = tuple(side for side in SIDES if side in args.sides)
    runs = run_sides(__file__, sides, args.repeats, base, args.work_dir, keep_run_dirs=False,
                     side_job=lambda side: {})

    from t5_training import reporting

    table = [{"side": side, "steady ms/step (median)": median_of(runs, side, "steady_ms"),
              "per run": " ".join(f"{r['steady_ms']:.1f}" for r in runs if r["side"] == side),
              "graphs": median_of(runs, side, "graphs"),
              "compile s": median_of(runs, side, "compile_seconds")} for side in sides]
    speedups = {name: round(median_of(runs, eager, "steady_ms") / median_of(runs, compiled, "steady_ms"), 3)
                for name, (compiled, eager) in PAIRS.items() if compiled in sides and eager in sides}
    results = {"settings": {k: v for k, v in vars(args).items() if k != "child"},
               "load_average": {"before": load_before, "after": load_average()}, "runs": runs, "table": table,
               "compiled_over_eager": speedups, "seconds": round(time.perf_counter() - started, 1)}
    reporting.write_json(args.output, results)
    print(f"\n{os.path.basename(args.model_config)}, {args.steps} steps a run (steady state: after {args.warmup}, "
          f"steps that compiled nothing), {runs[0]['threads']} torch thread(s), {args.device}, "
          f"{args.backend}/{args.mode}, median of {args.repeats} run(s) per side\n")
    print(reporting.format_table(table))
    for name, ratio in speedups.items():
        print(f"{name}: compiled runs at {ratio:.2f}x eager's steady-state speed")
    print(f"\nwrote {args.output} ({results['seconds']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
