"""Small, real building blocks shared by tests: a tokenizer trained on SST-2 and a tiny T5.

The tokenizer is trained once per test process (about two seconds) into a temporary folder;
the data stays in ../shared/data and is read in place.
"""
from __future__ import annotations

import csv
import functools
import os
import tempfile
from unittest import mock

import datasets
from absl.testing import parameterized

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ../shared/data beside the checkout; SHARED_DATA points elsewhere when the layout differs.
SHARED_DATA = os.environ.get("SHARED_DATA") or os.path.normpath(os.path.join(REPO, "..", "shared", "data"))
SST2_DIR = os.path.join(SHARED_DATA, "SST-2")
TINY_CONFIG = os.path.join(REPO, "configs", "t5-tiny.json")


def sst2_sentences(limit: int = 20000) -> list[str]:
    with open(os.path.join(SST2_DIR, "train.tsv"), encoding="utf-8") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(rows)
        return [row[0] for _, row in zip(range(limit), rows)]


@functools.lru_cache(maxsize=None)
def sst2_tokenizer_dir(vocab_size: int = 1000) -> str:
    """A T5 SentencePiece tokenizer trained on SST-2 sentences plus the label words."""
    from t5_training.tools.tokenizer import train_tokenizer

    path = tempfile.mkdtemp(prefix="sst2-tokenizer-")
    train_tokenizer(sst2_sentences() + ["sst2 sentence: negative positive"] * 50, path, vocab_size=vocab_size)
    return path


def fine_tune_args(output_dir: str, *extra: str) -> list[str]:
    """Flags for a small, fast SST-2 run of fine_tune_t5.py on the tiny model."""
    return [
        "--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", SST2_DIR,
        "--config_name", TINY_CONFIG, "--tokenizer_name", sst2_tokenizer_dir(),
        "--output_dir", output_dir, "--max_source_length", "64", "--max_target_length", "8",
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "32",
        "--max_train_samples", "100", "--max_eval_samples", "32", "--logging_steps", "1",
        "--learning_rate", "1e-3", "--seed", "7", *extra,
    ]


def snapshot(root: str) -> dict:
    """Every folder and every file (with its bytes) under `root`: proof that a refused run changed nothing."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            found[os.path.relpath(os.path.join(folder, d), root) + "/"] = None
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


class TempDirTestCase(parameterized.TestCase):
    """A fresh temp dir per test (`self.dir`), with datasets' cache inside it so loads leave nothing behind."""

    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory()  # create_tempdir needs absl flags, which pytest does not parse
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        patcher = mock.patch.object(datasets.config, "HF_DATASETS_CACHE", os.path.join(self.dir, "hf_cache"))
        patcher.start()
        self.addCleanup(patcher.stop)


def tensorboard_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a run logged with --report_to tensorboard: {key: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for root, _, names in os.walk(run_dir):
        for name in names:
            if name.startswith("events.out.tfevents"):
                accumulator = EventAccumulator(os.path.join(root, name))
                accumulator.Reload()
                for key in accumulator.Tags()["scalars"]:
                    scalars.setdefault(key, []).extend((e.step, e.value) for e in accumulator.Scalars(key))
    return {key: sorted(values) for key, values in scalars.items()}


def tiny_t5_config(**overrides):
    """A T5Config small enough to count its tensors by hand (memory and activation tests)."""
    import transformers

    values = dict(vocab_size=32, d_model=8, d_ff=16, d_kv=4, num_heads=2, num_layers=1, num_decoder_layers=1,
                  relative_attention_num_buckets=4, dropout_rate=0.1, feed_forward_proj="relu",
                  tie_word_embeddings=True)
    return transformers.T5Config(**{**values, **overrides})


def nan_on_steps(steps: set, accumulation: int = 1):
    """A forward_loss_sum that returns NaN on the micro-batches of the given (1-based) optimizer steps."""
    from unittest import mock

    from t5_training import losses

    real = losses.forward_loss_sum
    calls = []

    def patched(model, batch):
        calls.append(None)
        loss = real(model, batch)
        step = (len(calls) - 1) // accumulation + 1
        return loss * float("nan") if step in steps else loss

    return mock.patch.object(losses, "forward_loss_sum", patched)
