"""The cases tests/parity_test.py puts to the project and to Google's T5: one request, built here.

Each function returns the inputs of one comparison; `request()` gathers them as the JSON that
tests/parity_reference.py reads. Real GLUE rows come from T5_TRAINING_DATA (tests/fixtures.py);
the tasks whose files are not there get made rows.
"""
from __future__ import annotations

import base64
import functools
import os
import unittest

import numpy as np

from t5_training import collators as dc
from t5_training.registry import GLUE
from t5_training import data, submission, tasks
from tests import fixtures

# The sweep: T5's default (0.15, 3), UL2's spans (0.15 at 3 and 8, 0.5 at 3 and 64), mean 1, and a
# density whose float32 value lies below the decimal one (0.7; 0.15's lies above).
SPAN_SETTINGS = ((0.15, 1.0), (0.15, 3.0), (0.15, 8.0), (0.5, 3.0), (0.5, 64.0), (0.7, 3.0))
SPAN_LENGTHS = tuple(range(2, 1025))
HELPER_LENGTHS = (*range(4, 257), *range(257, 1025, 7))
PREFIX_DENSITIES = (0.5, 0.25, 0.15)
PREFIX_LENGTHS = (*range(2, 66), 127, 128, 255, 256, 511, 512, 567, 568, 1023, 1024)
VOCAB_SIZE, EOS, PAD = 100, 1, 0  # the corruption cases' ids: sentinels 99, 98, ... as T5 counts them
# Made rows for the GLUE tasks whose files the shared data lacks (their text and labels are arbitrary).
MADE_ROWS = 60
# The GLUE folders T5_TRAINING_DATA holds (docs/development.md): only these are asked of it, so that
# CI's T5_TRAINING_REQUIRE_DATA fails on a missing one and never on a task the data never had.
REAL_FOLDERS = ("CoLA", "SST-2", "MRPC", "STS-B")
MIXING_SETTINGS = ((None, 1.0), (65536, 1.0), (None, 2.0), (65536, 3.0), (2 ** 19, 1.0))


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)))


@functools.lru_cache(maxsize=None)
def glue_rows() -> dict:
    """{task: (source texts, target texts, columns, labels, real)} of every GLUE task: the real files' train,
    dev and test rows where the shared data has them, made rows for the rest."""
    rows = {}
    for task, entry in GLUE.items():
        path = None
        if entry.folder in REAL_FOLDERS:
            try:
                path = fixtures.real_data(entry.folder)
            except unittest.SkipTest:  # a bare clone: made rows for these too
                pass
        if path:  # train, dev and the unlabelled test rows
            splits = data.load_splits(entry, data_dir=path)
            splits.update(submission.load_test_splits(entry, data_dir=path, log=lambda *_: None))
            columns = {c: [v for s in splits.values() for v in s[c]] for c in entry.inputs}
            labels = [v for s in splits.values() for v in s[entry.target]]
        else:
            words = fixtures.sentences(2 * MADE_ROWS)
            columns = {c: words[i::len(entry.inputs)][:MADE_ROWS] for i, c in enumerate(entry.inputs)}
            # Class ids in turn, and -1 (a test row without a label) among them.
            labels = [(i % (len(entry.label_words) + 1)) - 1 for i in range(MADE_ROWS)]
        formatted = tasks.make_formatter(entry)({**columns, entry.target: labels})
        rows[task] = (formatted["source"], formatted["target"], columns, labels, path is not None)
    return rows


def _predictions(task: str, targets: list[str]) -> list[str]:
    """Model outputs to score against `targets`: right, wrong, spaced, unparsable, empty."""
    rng, entry = _rng(task), GLUE[task]
    out = []
    for target in targets:
        draw = rng.random()
        if entry.kind == "regression":
            value = float(target) + rng.normal(0, 1)
            out.append(("x" if draw < 0.05 else f" {value:.1f}" if draw < 0.1 else f"{value:.1f}"))
        elif draw < 0.2:
            out.append(str(rng.choice(entry.label_words)))
        elif draw < 0.3:
            out.append(f" {target}" if draw < 0.25 else f"{target} ")
        else:
            out.append("maybe" if draw < 0.33 else "" if draw < 0.35 else target)
    return out


def metric_cases() -> dict:
    """{task: (predictions, targets)}: up to 2,000 of each task's labelled rows."""
    cases = {}
    for task, (_, targets, _, labels, _) in glue_rows().items():
        targets = [t for t, label in zip(targets, labels) if label != -1][:2000]
        cases[task] = (_predictions(task, targets), targets)
    return cases


def glue_scores() -> dict:
    """Arbitrary scores keyed as a GLUE mixture's results are: <task>/<metric key>."""
    rng, scores = _rng("scores"), {}
    for task, entry in GLUE.items():
        for split in entry.eval_splits:
            for name in entry.metrics:
                scores[f"{task}/{tasks.metric_key(entry, split, name)}"] = float(rng.uniform(0, 100))
    return scores


def corruption_rows() -> list:
    """(tokens, mask) rows: the project's masks, over lengths, densities and mean spans."""
    rng, rows = _rng("corruption"), []
    for length in (10, 37, 141, 568):
        for density, mean in ((0.15, 3.0), (0.5, 3.0), (0.5, 8.0)):
            for mask in dc.random_spans_noise_mask(8, length, density, mean, rng):
                rows.append((rng.integers(3, 90, length), mask))
    return rows


def decode_rows() -> tuple[str, list[list[int]]]:
    """(the fixture tokenizer's spiece.model, base64) and generated rows: pieces, spaces at either end,
    then EOS and padding as generation leaves them."""
    with open(os.path.join(fixtures.tokenizer_dir(), "spiece.model"), "rb") as f:
        model = f.read()
    import sentencepiece

    pieces = sentencepiece.SentencePieceProcessor(model_proto=model)
    rng, rows, space = _rng("decode"), [], pieces.piece_to_id("▁")
    for i in range(300):
        row = rng.integers(3, pieces.get_piece_size(), rng.integers(1, 7)).tolist()
        row = ([space] if i % 3 == 0 else []) + row + ([space] if i % 4 == 0 else [])
        rows.append(row + [EOS] + [PAD] * (i % 3))
    return base64.b64encode(model).decode(), rows


def request() -> dict:
    rows = glue_rows()
    prefix_rows = [(list(range(10, 10 + n)), k) for n in (2, 3, 10, 128) for k in range(1, n)]
    scores = glue_scores()
    return {
        "span_masks": {"lengths": SPAN_LENGTHS, "settings": SPAN_SETTINGS},
        "helper": {"inputs_lengths": HELPER_LENGTHS, "settings": SPAN_SETTINGS},
        "corruption": {"vocab_size": VOCAB_SIZE,
                       "rows": [{"tokens": t.tolist(), "mask": m.tolist()} for t, m in corruption_rows()]},
        "prefix": {"lengths": PREFIX_LENGTHS, "densities": PREFIX_DENSITIES,
                   "rows": [{"tokens": t, "prefix": k} for t, k in prefix_rows]},
        "glue": {task: {"columns": columns, "labels": labels} for task, (_, _, columns, labels, _) in rows.items()},
        "glue_metrics": {task: {"predictions": p, "targets": t} for task, (p, t) in metric_cases().items()},
        "glue_average": [[_t5_task(key), key.rsplit("/", 1)[1], value] for key, value in scores.items()],
        "rouge": dict(zip(("predictions", "targets"), rouge_case())),
        "mixing": {"sizes": mixing_sizes(), "settings": MIXING_SETTINGS},
        "decode": dict(zip(("model", "rows"), decode_rows())),
    }


def _t5_task(key: str) -> str:
    """The reference's name of a result key's task: mnli's two dev sets are two T5 tasks."""
    parts = key.split("/")
    return "/".join(parts[:2]) if parts[0] == "mnli" else parts[0]


def rouge_case() -> tuple[list[str], list[str]]:
    rng, sentences = _rng("rouge"), fixtures.sentences(200)
    references = [" . ".join(sentences[i:i + 3]) for i in range(0, 150, 3)]
    predictions = [" ".join(w for w in r.split() if rng.random() < 0.7) for r in references]
    return predictions, references


def mixing_sizes() -> dict:
    """GLUE's training rows per task, as T5's mixtures see them."""
    return {"cola": 8551, "sst2": 67349, "mrpc": 3668, "stsb": 5749, "qqp": 363846, "mnli": 392702,
            "qnli": 104743, "rte": 2490, "wnli": 635}
