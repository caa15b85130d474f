"""The project beside Google's T5 (t5 0.9.4, seqio 0.0.20), on the same inputs.

Google's code needs TensorFlow, so it runs in a Python of its own, named by T5_TRAINING_REFERENCE_PYTHON
(docs/development.md, "Google's reference", builds it). tests/parity_reference.py runs there once per
suite run: it gets every case below in one request and answers with what T5 computes. Compared:
T5's noise-mask counts over a sweep of lengths, densities and mean span lengths, and its
random_spans_helper; inputs and targets that T5 builds from the project's own masks; prefix LM's
split range, inputs and targets; GLUE text of every GLUE task (the real rows where
T5_TRAINING_DATA has them); GLUE metrics through T5's postprocessors, and the GLUE average; ROUGE;
mixing rates; generated ids decoded to text, as seqio's SentencePiece vocabulary decodes them. A
difference fails its test unless DELIBERATE below names it, with the reason.

Without the variable every test here skips; with T5_TRAINING_REQUIRE_REFERENCE=1 (as CI sets) a
missing or broken reference fails instead.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch
from absl.testing import absltest, parameterized

from t5_training import collators as dc
from t5_training.registry import GLUE
from t5_training import evaluation, metrics, mixture, multitask, tasks
from tests import fixtures
from tests.parity_cases import (EOS, HELPER_LENGTHS, MIXING_SETTINGS, PAD, PREFIX_DENSITIES, PREFIX_LENGTHS,
                                SPAN_LENGTHS, SPAN_SETTINGS, VOCAB_SIZE, corruption_rows, glue_rows, glue_scores,
                                decode_rows, metric_cases, mixing_sizes, request, rouge_case)

REFERENCE_ENV = "T5_TRAINING_REFERENCE_PYTHON"
REQUIRE_ENV = "T5_TRAINING_REQUIRE_REFERENCE"
SCRIPT = os.path.join(fixtures.REPO, "tests", "parity_reference.py")

# The only differences from T5 that these tests accept, and why each is deliberate.
DELIBERATE = {
    "spans_capped": "where round(noise / mean) noise spans outnumber the non-noise tokens, T5's segmentation "
                    "fails (an InvalidArgumentError in its graph); the project caps the spans at the non-noise "
                    "tokens, one kept token between noise spans, so densities above mean / (mean + 1) work",
    "batch_widens": "at a few inputs lengths T5's random_spans_helper (Python floats) gives a chunk that its "
                    "float32 mask corrupts into more tokens than the helper counted (172 at 0.15 and 3: 40 "
                    "targets, not 38); T5 trims them, EOS included, and the project's batch widens instead",
    "glue_average_wnli": "T5's average (eval_utils.compute_avg_glue) leaves WNLI out; the project's GLUE score "
                         "is the leaderboard's, the mean over all nine tasks",
}


def reference_missing() -> str | None:
    """Why the reference cannot run here, or None."""
    python = os.environ.get(REFERENCE_ENV)
    if not python:
        return (f"{REFERENCE_ENV} is not set: name a Python that has Google's t5 0.9.4 and seqio 0.0.20 "
                "(docs/development.md, \"Google's reference\", builds one)")
    if not os.access(python, os.X_OK):
        return f"{REFERENCE_ENV}={python} is not an executable Python"
    return None


def setUpModule():
    reason = reference_missing()
    if reason and os.environ.get(REQUIRE_ENV) == "1":
        raise AssertionError(f"{REQUIRE_ENV}=1, but {reason}")
    if reason:
        raise unittest.SkipTest(reason)


def reference() -> dict:
    """T5's answers to `request()`, or an AssertionError saying why the reference failed."""
    answer, failure = _ask_reference()
    if failure:
        raise AssertionError(failure)
    return answer


@functools.lru_cache(maxsize=None)
def _ask_reference() -> tuple[dict | None, str | None]:
    """(answer, None) or (None, why): one reference process per suite run, whatever the test workers.

    The answer is kept in the temporary folder under a hash of the question, the reference's Python and
    this script; a lock makes a second worker wait for the first one's answer instead of asking again.
    """
    python, question = os.environ[REFERENCE_ENV], json.dumps(request())
    with open(SCRIPT, encoding="utf-8") as f:
        key = hashlib.sha256("\0".join((question, python, f.read())).encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"t5-training-parity-{key}.json")
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path):
            result = subprocess.run([python, SCRIPT], input=question, capture_output=True, text=True, timeout=600,
                                    env=dict(os.environ, PYTHONPATH=""))
            if result.returncode:  # kept, so that every test says it without asking again
                return None, f"the reference failed ({python} {SCRIPT}):\n{result.stderr[-3000:]}"
            with open(f"{path}.tmp", "w", encoding="utf-8") as f:
                f.write(result.stdout)
            os.replace(f"{path}.tmp", path)
    with open(path, encoding="utf-8") as f:
        return json.load(f), None


def _mask_counts(mask: np.ndarray) -> list[int]:
    starts = mask & ~np.concatenate([[False], mask[:-1]])
    return [int(mask.sum()), int(starts.sum())]


class SpanCorruptionTest(parameterized.TestCase):

    @parameterized.named_parameters(*((f"d{d}_m{m:g}".replace(".", ""), d, m) for d, m in SPAN_SETTINGS))
    def test_mask_counts_over_every_length(self, density, mean):
        # The counts of the project's own mask, drawn at every length, against T5's mask's.
        rng, differ, capped = np.random.default_rng(0), [], 0
        for length, theirs in zip(SPAN_LENGTHS, reference()["span_masks"][f"{density} {mean}"]):
            ours = _mask_counts(dc.random_spans_noise_mask(1, length, density, mean, rng)[0])
            if theirs is None:  # DELIBERATE["spans_capped"]: T5 fails; the project separates spans by one token
                self.assertEqual(ours[1], length - ours[0], f"length {length}: T5 fails, and spans are not capped")
                capped += 1
            elif ours != theirs:
                differ.append((length, ours, theirs))
        self.assertEqual(differ, [], "(length, project's [noise, spans], T5's)")
        self.assertLess(capped, len(SPAN_LENGTHS))

    @parameterized.named_parameters(*((f"d{d}_m{m:g}".replace(".", ""), d, m) for d, m in SPAN_SETTINGS))
    def test_lengths_are_t5_random_spans_helper(self, density, mean):
        ours = [list(dc.compute_input_and_target_lengths(n, density, mean)) for n in HELPER_LENGTHS]
        theirs = reference()["helper"][f"{density} {mean}"]
        self.assertEqual([(n, a, b) for n, a, b in zip(HELPER_LENGTHS, ours, theirs) if a != b], [])

    @parameterized.named_parameters(*((f"d{d}_m{m:g}".replace(".", ""), d, m) for d, m in SPAN_SETTINGS))
    def test_what_the_mask_makes_of_the_helpers_chunks(self, density, mean):
        # The project's corrupted lengths of the chunk the helper picks are those of T5's mask; where they
        # outgrow the helper's, DELIBERATE["batch_widens"].
        answer = reference()
        masks = dict(zip(SPAN_LENGTHS, answer["span_masks"][f"{density} {mean}"]))
        for n, (raw, _) in zip(HELPER_LENGTHS, answer["helper"][f"{density} {mean}"]):
            if masks.get(raw) is None:  # beyond the sweep, or where T5's mask fails
                continue
            noise, spans = masks[raw]
            theirs = (raw - noise + spans + 1, noise + spans + 1)
            self.assertEqual(dc.corrupted_lengths(raw, density, mean), theirs, n)

    def test_inputs_and_targets_from_the_same_mask(self):
        sentinels = np.arange(VOCAB_SIZE - 1, VOCAB_SIZE - 101, -1)
        rows, theirs = corruption_rows(), reference()["corruption"]
        self.assertEqual(len(rows), len(theirs))
        for (tokens, mask), (inputs, targets) in zip(rows, theirs):
            ours_in = dc.replace_runs(tokens[None], mask[None], len(tokens) + 1, PAD, sentinels, EOS)[0]
            ours_out = dc.replace_runs(tokens[None], ~mask[None], len(tokens) + 1, -100, sentinels, EOS)[0]
            # T5 appends EOS after the preprocessors (seqio's append_eos_after_trim).
            self.assertEqual(ours_in[:len(inputs) + 1].tolist(), inputs + [EOS])
            self.assertTrue(np.all(ours_in[len(inputs) + 1:] == PAD))
            self.assertEqual(ours_out[:len(targets) + 1].tolist(), targets + [EOS])


class PrefixLMTest(parameterized.TestCase):

    @parameterized.named_parameters(*((f"d{d}".replace(".", ""), d) for d in PREFIX_DENSITIES))
    def test_prefix_length_range(self, density):
        bounds = reference()["prefix"]["bounds"]
        ours = [(dc.min_prefix_length(n, density), n - 1) for n in PREFIX_LENGTHS]
        theirs = list(zip(bounds[f"lowest {density}"], bounds[f"highest {density}"]))
        self.assertEqual([(n, a, b) for n, a, b in zip(PREFIX_LENGTHS, ours, theirs) if a != b], [])

    def test_inputs_and_targets_of_a_split(self):
        cases = [(list(range(10, 10 + n)), k) for n in (2, 3, 10, 128) for k in range(1, n)]
        for (tokens, k), (inputs, targets) in zip(cases, reference()["prefix"]["rows"], strict=True):
            ours_in, attention, ours_out = dc.split_prefix(np.asarray([tokens]), np.asarray([[k]]), EOS, PAD)
            self.assertEqual(ours_in[0, :k + 1].tolist(), inputs + [EOS])
            self.assertEqual(int(attention.sum()), k + 1)
            self.assertEqual(ours_out[0, :len(targets) + 1].tolist(), targets + [EOS])


class GlueTest(parameterized.TestCase):

    @parameterized.named_parameters(*((task, task) for task in GLUE))
    def test_text(self, task):
        sources, targets, _, _, real = glue_rows()[task]
        theirs = reference()["glue"][task]
        differ = [(i, ours, t5) for i, (ours, t5) in enumerate(zip(zip(sources, targets), map(tuple, theirs)))
                  if ours != t5]
        self.assertEqual(len(theirs), len(sources))
        self.assertEqual(differ[:5], [], f"{len(differ)} of {len(sources)} {'real' if real else 'made'} rows differ")

    @parameterized.named_parameters(*((task, task) for task in GLUE))
    def test_metrics_through_t5_postprocessors(self, task):
        predictions, targets = metric_cases()[task]
        ours = tasks.make_scorer(GLUE[task])(predictions, targets)
        theirs = reference()["glue_metrics"][task]
        self.assertEqual(sorted(ours), sorted(theirs))
        for key in ours:
            self.assertAlmostEqual(ours[key], theirs[key], places=9, msg=key)

    def test_decoded_text_is_seqios(self):
        # What label matching reads: the model's ids as text, by the fixture tokenizer and by seqio's
        # SentencePiece vocabulary over the same spiece.model.
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(fixtures.tokenizer_dir())
        _, rows = decode_rows()
        width = max(map(len, rows))
        ids = torch.tensor([row + [PAD] * (width - len(row)) for row in rows])
        self.assertEqual(evaluation.decode_texts(tokenizer, ids), reference()["decode"])

    def test_average(self):
        scores, theirs = glue_scores(), reference()["glue_average"]
        counted = {task.split("/")[0] for task, _ in theirs["counted"]}
        self.assertEqual(set(GLUE) - counted, {"wnli"}, DELIBERATE["glue_average_wnli"])
        found = {task: entry for task, entry in GLUE.items() if task in counted}
        self.assertAlmostEqual(multitask.benchmark_score(found, scores), theirs["average"], places=9)


class RougeAndMixingTest(parameterized.TestCase):

    def test_rouge(self):
        ours = metrics.rouge(*rouge_case())
        theirs = reference()["rouge"]
        self.assertEqual(sorted(ours), sorted(theirs))
        for key in ours:
            self.assertAlmostEqual(ours[key], theirs[key], places=9, msg=key)

    def test_mixing_rates(self):
        sizes = mixing_sizes()
        for (cap, temperature), theirs in zip(MIXING_SETTINGS, reference()["mixing"], strict=True):
            mode = "examples_proportional" if temperature == 1.0 else "temperature"
            ours = mixture.mixing_rates(sizes, mode, cap=cap, temperature=temperature)
            for task in sizes:
                self.assertAlmostEqual(ours[task], theirs[task], places=12, msg=(cap, temperature, task))


if __name__ == "__main__":
    absltest.main()
