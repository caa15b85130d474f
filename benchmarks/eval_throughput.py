"""Evaluation throughput on the SST-2 dev set: this project's evaluator against Seq2SeqTrainer.predict.

    # fine-tunes a t5-small-shaped model for 60 steps, then evaluates 872 dev rows per side (~6 min, 2 idle CPU cores):
    python benchmarks/eval_throughput.py
    python benchmarks/eval_throughput.py --threads 1    # the same on a machine other jobs keep busy
    python benchmarks/eval_throughput.py --quick        # tiny model, 64 dev rows: checks that it runs, not its speed
    # evaluate a checkpoint you already have (a folder with the model and its tokenizer):
    python benchmarks/eval_throughput.py --model_name_or_path runs/sst2/final

Three sides evaluate the same fine-tuned checkpoint on the same dev rows:

  ours score                  t5_training.evaluation with --eval_decoding score: one decoder pass over the label
                              candidates, which gives greedy decoding's exact predictions
  ours generate               the same evaluator with --eval_decoding generate (greedy generate())
  hf predict_with_generate    Seq2SeqTrainer.predict with predict_with_generate=True, greedy (num_beams 1),
                              DataCollatorForSeq2Seq, as run_summarization.py sets it up

Without a --model_name_or_path, the checkpoint comes from fine_tune_t5.py itself: a model built from
--model_config (random init, fixed seed) on a tokenizer trained on SST-2, fine-tuned for
--fine_tune_steps, so that its predictions are mostly label words.

Same on every side: the weights, the tokenizer, the token ids of every dev row (formatted and
tokenized by t5_training.data.tokenize_split from the registry entry), the eval batch size, fp32,
one process, and the number of new tokens greedy decoding may produce: the longest dev label with
its EOS (HF's generation_max_length counts the decoder start token too, so it is that plus one).
Both sides also compute the teacher-forced dev loss, as both do by default. Our evaluator orders
the rows longest first (its design); HF keeps the file order (its default).

Timing: wall time of `evaluate(model)` (ours: the evaluator as fine_tune_t5.py builds it, with the
model and loaders already prepared; it includes scoring and writing predictions_validation.tsv)
and of `trainer.predict(dev)` (HF; turning its token ids into text and scoring them come after).
Each side runs in a fresh Python process, in alternating order over --repeats; the table reports
the median and the best run (other load on the machine only ever slows a run down), each side's
accuracy, and how many rows it predicts differently from HF. Prints a table and writes --output (JSON).
"""
from __future__ import annotations

import argparse
import csv
import os
import time

import _harness as harness  # first: it puts the repository root on the path

REPO = harness.REPO
SST2_DIR = harness.SST2_DIR
SIDES = ("ours score", "ours generate", "hf predict_with_generate")
BASELINE = "hf predict_with_generate"
GOAL = 3.0  # ours score over HF, in examples per second


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny model, a few fine-tuning steps, 64 dev rows: checks that the benchmark runs")
    parser.add_argument("--model_name_or_path", default=None,
                        help="a fine-tuned checkpoint with its tokenizer; default: fine-tune one here first")
    parser.add_argument("--model_config", default=None, help="default: configs/t5-small.json (quick: t5-tiny.json)")
    parser.add_argument("--vocab_size", type=int, default=None, help="default 8000 (quick: 1000)")
    parser.add_argument("--fine_tune_steps", type=int, default=None, help="default 60 (quick: 10)")
    parser.add_argument("--fine_tune_learning_rate", type=float, default=5e-4)
    parser.add_argument("--eval_rows", type=int, default=None, help="first N dev rows; 0: all 872 (quick: 64)")
    parser.add_argument("--batch_size", type=int, default=None, help="eval batch, both sides (default 32; quick: 16)")
    parser.add_argument("--max_source_length", type=int, default=128)
    parser.add_argument("--max_target_length", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=None, help="runs of each side (default 2; quick: 1)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--threads", type=int, default=None, help=harness.THREADS_HELP)
    harness.add_device_argument(parser)
    parser.add_argument("--work_dir", default=None, help="default: runs/eval_throughput[_quick]")
    parser.add_argument("--output", default=None, help="results JSON (default: WORK_DIR/results.json)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a job file: run one side and exit
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = {"model_config": os.path.join(REPO, "configs", "t5-tiny.json" if quick else "t5-small.json"),
                "vocab_size": 1000 if quick else 8000, "fine_tune_steps": 10 if quick else 60,
                "eval_rows": 64 if quick else 0, "batch_size": 16 if quick else 32, "repeats": 1 if quick else 2,
                "threads": 1 if quick else 0,
                "work_dir": os.path.join(REPO, "runs", "eval_throughput" + ("_quick" if quick else ""))}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.output = args.output or os.path.join(args.work_dir, "results.json")
    return args


def fine_tune(args, tokenizer_dir: str, model_dir: str) -> str:
    """Fine-tunes the initial model with fine_tune_t5.py; returns the exported final checkpoint."""
    import fine_tune_t5

    out = os.path.join(args.work_dir, "fine_tuned")
    fine_tune_t5.main([
        "--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", SST2_DIR,
        "--model_name_or_path", model_dir, "--tokenizer_name", tokenizer_dir, "--output_dir", out,
        "--overwrite_output_dir", "--max_source_length", str(args.max_source_length),
        "--max_target_length", str(args.max_target_length),
        "--per_device_train_batch_size", "16" if args.quick else "32",
        "--max_train_samples", "0", "--max_eval_samples", "64", "--max_steps", str(args.fine_tune_steps),
        "--learning_rate", str(args.fine_tune_learning_rate), "--lr_scheduler_type", "constant",
        "--group_by_length", "--logging_steps", "25", "--save_total_limit", "1", "--seed", str(args.seed),
    ])
    return os.path.join(out, "final")


# --- one side, in its own process ----------------------------------------------------------------

def run_ours(job: dict) -> dict:
    import fine_tune_t5
    from t5_training import data, evaluation, runtime
    from t5_training.config import parse_config
    from t5_training.modeling import load_tokenizer_and_model
    from t5_training.tasks import get_entry

    # The evaluator exactly as fine_tune_t5.main builds it, minus the training.
    config = parse_config(fine_tune_t5.FineTuneConfig, [
        "--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", SST2_DIR,
        "--model_name_or_path", job["model"], "--output_dir", job["run_dir"],
        "--max_source_length", str(job["max_source_length"]), "--max_target_length", str(job["max_target_length"]),
        "--max_train_samples", "1", "--max_eval_samples", str(job["eval_rows"]),
        "--per_device_eval_batch_size", str(job["batch_size"]), "--eval_decoding", job["decoding"],
        "--mixed_precision", "no", "--seed", str(job["seed"]),
    ])
    entry = get_entry(config.benchmark, config.dataset_name)
    accelerator = runtime.build_accelerator(config)
    decoding = evaluation.resolve_decoding(config.eval_decoding, entry, accelerator)
    tokenizer, model = load_tokenizer_and_model(config)
    task = data.build_task_data(entry, config, tokenizer, accelerator.print)
    _, eval_loaders = data.build_loaders(task, config, tokenizer, model.config.decoder_start_token_id)
    model, *loaders = accelerator.prepare(model, *eval_loaders.values())
    os.makedirs(config.output_dir, exist_ok=True)
    evaluate = evaluation.make_generation_evaluator(accelerator, entry, task, dict(zip(eval_loaders, loaders)),
                                                    tokenizer, config.output_dir, decoding, config.max_target_length)
    model.eval()
    started = time.perf_counter()
    metrics = evaluate(model)
    seconds = time.perf_counter() - started
    with open(os.path.join(config.output_dir, "predictions_validation.tsv"), encoding="utf-8", newline="") as f:
        predictions = [row["prediction"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL)]
    return {"seconds": seconds, "rows": len(predictions), "accuracy": metrics["accuracy"], "loss": metrics["loss"],
            "predictions": predictions, "max_new_tokens": task.max_target_tokens}


def run_hf(job: dict) -> dict:
    import numpy as np
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer, \
        Seq2SeqTrainingArguments

    from t5_training.tasks import get_entry, make_scorer

    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    model = AutoModelForSeq2SeqLM.from_pretrained(job["model"])
    dev = harness.tokenized_rows(job, tokenizer, "validation", job["eval_rows"])
    longest_label = max(len(ids) for ids in dev["labels"])  # label tokens with EOS
    args = Seq2SeqTrainingArguments(
        output_dir=job["run_dir"], per_device_eval_batch_size=job["batch_size"], predict_with_generate=True,
        # max_length counts the decoder start token: this allows exactly `longest_label` new tokens.
        generation_max_length=longest_label + 1, generation_num_beams=1,
        report_to="none", use_cpu=job["device"] == "cpu", dataloader_num_workers=0, seed=job["seed"],
    )
    collate = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=None)
    trainer = Seq2SeqTrainer(model=model, args=args, data_collator=collate, processing_class=tokenizer)
    started = time.perf_counter()
    output = trainer.predict(dev)
    seconds = time.perf_counter() - started
    ids = np.where(output.predictions != -100, output.predictions, tokenizer.pad_token_id)
    predictions = [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
    accuracy = make_scorer(get_entry("glue", "sst2"))(predictions, dev["target"])["accuracy"]
    return {"seconds": seconds, "rows": len(predictions), "accuracy": accuracy, "loss": output.metrics["test_loss"],
            "predictions": predictions, "max_new_tokens": longest_label,
            "trainer_reported_samples_per_second": output.metrics["test_samples_per_second"]}


def measure(job: dict) -> dict:
    result = run_hf(job) if job["side"] == BASELINE else run_ours(job)
    return {**result, "examples_per_second": round(result["rows"] / result["seconds"], 2),
            "seconds": round(result["seconds"], 3)}


# --- the comparison ----------------------------------------------------------------------------

def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        harness.child_main(args.child, harness.measured_side(measure))
        return {}
    started = time.perf_counter()
    harness.set_environment(args.threads)
    harness.use_device(args.device)
    os.makedirs(args.work_dir, exist_ok=True)
    load_before = harness.load_average()
    model = args.model_name_or_path
    if model is None:
        print(f"preparing the tokenizer and the initial weights in {args.work_dir}", flush=True)
        tokenizer_dir, model_dir = harness.prepare_tokenizer_and_model(args.work_dir, args.model_config,
                                                                      args.vocab_size, args.seed)
        print(f"fine-tuning for {args.fine_tune_steps} steps", flush=True)
        model = fine_tune(args, tokenizer_dir, model_dir)
    base = {"model": os.path.abspath(model), "eval_rows": args.eval_rows, "batch_size": args.batch_size,
            "max_source_length": args.max_source_length, "max_target_length": args.max_target_length,
            "seed": args.seed, "device": args.device}
    runs = harness.run_sides(__file__, SIDES, args.repeats, base, args.work_dir,
                            side_job=lambda side: {"decoding": side.split()[-1]})

    # Per-row predictions from each side's first run; they do not change between runs.
    first = {side: next(r for r in runs if r["side"] == side) for side in SIDES}
    reference = first[BASELINE]["predictions"]
    table = []
    for side in SIDES:
        rate = harness.median_of(runs, side, "examples_per_second")
        differ = sum(a != b for a, b in zip(first[side]["predictions"], reference))
        table.append({"side": side, "examples/s": rate, "seconds": harness.median_of(runs, side, "seconds"),
                      "x hf": round(rate / harness.median_of(runs, BASELINE, "examples_per_second"), 2),
                      "best examples/s": harness.best_of(runs, side, "examples_per_second"),
                      "best x hf": round(harness.best_of(runs, side, "examples_per_second")
                                         / harness.best_of(runs, BASELINE, "examples_per_second"), 2),
                      "accuracy": first[side]["accuracy"], "rows differing from hf": differ,
                      "examples/s per run": " ".join(f"{r['examples_per_second']:.1f}" for r in runs
                                                     if r["side"] == side)})
    ratios = {f"{row['side']} / {BASELINE}": row["x hf"] for row in table if row["side"] != BASELINE}
    identical = {side: first[side]["predictions"] == reference for side in SIDES if side != BASELINE}
    label_words = {"negative", "positive"}
    results = {
        "settings": {**{k: v for k, v in vars(args).items() if k != "child"}, "model": base["model"],
                     "sst2_dir": SST2_DIR, "max_new_tokens": first[BASELINE]["max_new_tokens"],
                     "timing": "ours: wall time of evaluate(model) (scoring and predictions TSV included); "
                               "hf: wall time of trainer.predict(dev)"},
        "load_average": {"before": load_before, "after": harness.load_average()},
        "runs": [{k: v for k, v in r.items() if k != "predictions"} for r in runs],
        "table": table, "ratios": ratios,
        "accuracy": {side: first[side]["accuracy"] for side in SIDES},
        "predictions_identical": identical,
        "predictions_valid_labels": {side: sum(p in label_words for p in first[side]["predictions"])
                                     for side in SIDES},
        "goals": {f"ours score / {BASELINE} >= {GOAL}": ratios[f"ours score / {BASELINE}"] >= GOAL},
        "seconds": round(time.perf_counter() - started, 1),
    }
    from t5_training import reporting

    reporting.write_json(args.output, results)

    rows = first[BASELINE]["rows"]
    print(f"\n{model}: SST-2 dev, {rows} rows, eval batch {args.batch_size}, max lengths "
          f"{args.max_source_length}/{args.max_target_length}, up to {results['settings']['max_new_tokens']} new "
          f"tokens, {runs[0]['threads']} torch thread(s), median of {args.repeats} run(s) per side; "
          f"load average {load_before} -> {results['load_average']['after']}\n")
    print(reporting.format_table(table))
    print()
    for side, same in identical.items():
        print(f"{side}: predictions {'identical to' if same else 'DIFFER from'} {BASELINE}'s")
    print(f"valid label words predicted: {results['predictions_valid_labels']} of {rows}")
    for name, met in results["goals"].items():
        print(f"goal {name}: {'met' if met else 'NOT met'}")
    print(f"\nwrote {args.output} ({results['seconds']:.0f} s)")
    return results


if __name__ == "__main__":
    main()
