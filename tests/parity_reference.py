"""Google's T5 on the inputs tests/parity_test.py sends: run by the reference Python, never by the project's.

    $T5_TRAINING_REFERENCE_PYTHON tests/parity_reference.py < request.json > answer.json

It imports only Google's code (t5 0.9.4, seqio 0.0.20, TensorFlow) and the standard library: what it
answers is what T5 computes, so the project's code must not leak in here. Each section of the request
is answered under the same key; parity_test.py says what each one holds and compares.
"""
import base64
import functools
import json
import logging
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seqio  # noqa: E402
import tensorflow.compat.v2 as tf  # noqa: E402
from t5.data import glue_utils, postprocessors, preprocessors  # noqa: E402
from t5.evaluation import eval_utils, metrics  # noqa: E402

# TFDS's GLUE class names, which T5's glue preprocessor and postprocessor read from the builder.
LABEL_NAMES = {
    "cola": ["unacceptable", "acceptable"], "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"], "qqp": ["not_duplicate", "duplicate"],
    "mnli": ["entailment", "neutral", "contradiction"], "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"], "wnli": ["not_entailment", "entailment"],
}
# T5's tag of each metric a GLUE task reports (eval_utils.METRIC_NAMES), by the task's name here.
GLUE_TAGS = {"cola": "glue_cola_v002", "sst2": "glue_sst2_v002", "mrpc": "glue_mrpc_v002", "stsb": "glue_stsb_v002",
             "qqp": "glue_qqp_v002", "mnli/validation_matched": "glue_mnli_matched_v002",
             "mnli/validation_mismatched": "glue_mnli_mismatched_v002", "qnli": "glue_qnli_v002",
             "rte": "glue_rte_v002", "wnli": "glue_wnli_v002"}
SEEDS = tf.constant([[7, 11], [13, 17]], tf.int32)


@functools.lru_cache(maxsize=None)
def _mask_counts(density):
    """lengths, mean -> (noise tokens, noise spans) of T5's mask at each length, in one graph.

    The density stays a Python float, as T5's callers pass it (its mask tests `density == 0.0`).
    """
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.float32)])
    def graph(lengths, mean):
        def counts(length):
            mask = preprocessors.random_spans_noise_mask(length, density, SEEDS, mean)
            starts = tf.logical_and(mask, tf.logical_not(tf.pad(mask[:-1], [[1, 0]])))
            return tf.stack([tf.reduce_sum(tf.cast(mask, tf.int32)), tf.reduce_sum(tf.cast(starts, tf.int32))])

        return tf.map_fn(counts, lengths, fn_output_signature=tf.TensorSpec([2], tf.int32))

    return graph


def span_masks(request):
    """{"d m": [[noise tokens, noise spans] or None where T5's mask fails, one per length]}."""
    answer = {}
    for density, mean in request["settings"]:
        # T5's segmentation fails where there are more noise spans than non-noise tokens, and one
        # failure would end the whole graph: lengths near that edge (by a rough count, with a
        # margin) run one at a time.
        risky = [n for n in request["lengths"]
                 if max(round(n * density / mean), 1) >= n - round(n * density) - 1]
        safe = [n for n in request["lengths"] if n not in set(risky)]
        found = dict(zip(safe, _mask_counts(density)(tf.constant(safe, tf.int32), mean).numpy().tolist()))
        for n in risky:
            try:
                found[n] = _mask_counts(density)(tf.constant([n], tf.int32), mean).numpy().tolist()[0]
            except tf.errors.InvalidArgumentError:
                found[n] = None
        answer[f"{density} {mean}"] = [found[n] for n in request["lengths"]]
    return answer


def helper(request):
    """{"d m": [[raw tokens, targets] per inputs length]}: T5's random_spans_helper."""
    return {f"{d} {m}": [list(preprocessors.random_spans_helper(n, d, m, 1, 1)) for n in request["inputs_lengths"]]
            for d, m in request["settings"]}


class _Vocabulary:
    """What T5's sentinel functions read of a vocabulary: its size (sentinels count down from the top)."""

    def __init__(self, size):
        self.vocab_size = size


def corruption(request):
    """[[inputs, targets] per row]: T5's span corruption of the row's tokens under the row's mask."""
    vocabulary, answer = _Vocabulary(request["vocab_size"]), []
    for row in request["rows"]:
        tokens, mask = tf.constant(row["tokens"], tf.int32), tf.constant(np.asarray(row["mask"], bool))
        inputs = preprocessors.noise_span_to_unique_sentinel(tokens, mask, vocabulary, None)
        targets = preprocessors.nonnoise_span_to_unique_sentinel(tokens, mask, vocabulary, None)
        answer.append([inputs.numpy().tolist(), targets.numpy().tolist()])
    return answer


def prefix(request):
    """T5's prefix LM: the bounds of its prefix length, and inputs and targets from a given prefix."""
    draw = tf.random.stateless_uniform
    bounds = {}
    try:
        for end, name in ((lambda lo, hi: lo, "lowest"), (lambda lo, hi: hi - 1, "highest")):
            # T5's own code computes the range; the draw is made to return one end of it.
            tf.random.stateless_uniform = lambda shape, minval, maxval, **kw: end(minval, maxval)  # noqa: E731
            for density in request["densities"]:
                bounds[f"{name} {density}"] = [
                    int(tf.reduce_sum(tf.cast(preprocessors.random_prefix_noise_mask(n, density, SEEDS), tf.int32)))
                    for n in request["lengths"]]
    finally:
        tf.random.stateless_uniform = draw
    rows = []
    for row in request["rows"]:
        tokens = tf.constant(row["tokens"], tf.int32)
        mask = tf.range(len(row["tokens"])) < row["prefix"]  # random_prefix_noise_mask's, for this draw
        rows.append([preprocessors.drop_nonnoise_tokens(tokens, mask, None, None).numpy().tolist(),
                     preprocessors.drop_noise_tokens(tokens, mask, None, None).numpy().tolist()])
    return {"bounds": bounds, "rows": rows}


def glue(request):
    """{task: [[inputs, targets] per row]}: T5's GLUE text of the rows the project read."""
    answer = {}
    for task, rows in request.items():
        features = {key: tf.constant(values) for key, values in rows["columns"].items()}
        n = len(rows["labels"])
        features["idx"] = tf.range(n)
        if task == "stsb":
            features["label"] = tf.constant(rows["labels"], tf.float32)  # TFDS's dtype
            ds = preprocessors.stsb(tf.data.Dataset.from_tensor_slices(features))
        else:
            features["label"] = tf.constant(rows["labels"], tf.int64)
            ds = preprocessors.glue(tf.data.Dataset.from_tensor_slices(features), benchmark_name=task,
                                    label_names=LABEL_NAMES[task])
        out = [[], []]
        for batch in ds.batch(4096):
            out[0].extend(t.decode("utf-8") for t in batch["inputs"].numpy())
            out[1].extend(t.decode("utf-8") for t in batch["targets"].numpy())
        answer[task] = [list(pair) for pair in zip(*out)]
    return answer


def glue_metrics(request):
    """{task: {metric: value}}: T5's postprocessor on both sides, then T5's GLUE metrics."""
    answer = {}
    for task, texts in request.items():
        if task == "stsb":
            post = postprocessors.string_to_float
        else:
            def post(text, task=task):
                return postprocessors.string_label_to_class_id(text, label_classes=LABEL_NAMES[task])
        targets, predictions = [post(t) for t in texts["targets"]], [post(p) for p in texts["predictions"]]
        answer[task] = {}
        for metric in glue_utils.get_glue_metric(task):
            answer[task].update({k: float(v) for k, v in metric(targets, predictions).items()})
    return answer


def glue_average(request):
    """T5's average GLUE score (eval_utils.compute_avg_glue) of [task, metric, value] rows, and the
    [task, metric] pairs it counts (its METRIC_NAMES)."""
    row, counted = {}, []
    for task, metric, value in request:
        tag = f"{GLUE_TAGS[task]}/{metric}"
        if tag in eval_utils.METRIC_NAMES:
            row[eval_utils.METRIC_NAMES[tag].name] = value
            counted.append([task, metric])
    df = eval_utils.compute_avg_glue(pd.DataFrame([row]))
    # compute_avg_glue leaves the column out unless every metric it averages is given.
    average = df["Average GLUE Score"][0] if "Average GLUE Score" in df else None
    return {"average": None if average is None else float(average), "counted": counted}


def rouge(request):
    """T5's ROUGE; its bootstrap draws from numpy's global generator, seeded as the project seeds it."""
    np.random.seed(0)
    return {k: float(v) for k, v in metrics.rouge(request["targets"], request["predictions"]).items()}


class _Task:
    """What seqio.mixing_rate_num_examples reads of a task that is not cached: its input examples."""

    cache_dir = None

    def __init__(self, name, size):
        self.name, self.size = name, size

    def num_input_examples(self, split):
        return self.size


def mixing(request):
    """[{task: share} per setting]: seqio's rates for (maximum, temperature), as a mixture normalises them."""
    answer = []
    for maximum, temperature in request["settings"]:
        rates = {name: seqio.mixing_rate_num_examples(_Task(name, size), maximum=maximum, temperature=temperature)
                 for name, size in request["sizes"].items()}
        total = sum(rates.values())
        answer.append({name: rate / total for name, rate in rates.items()})
    return answer


def decode(request):
    """[text per row]: seqio's SentencePiece vocabulary (T5's) decoding the rows."""
    with tempfile.NamedTemporaryFile(suffix=".model") as f:
        f.write(base64.b64decode(request["model"]))
        f.flush()
        vocabulary = seqio.SentencePieceVocabulary(f.name)
        return [vocabulary.decode(row) for row in request["rows"]]


SECTIONS = {"span_masks": span_masks, "helper": helper, "corruption": corruption, "prefix": prefix, "glue": glue,
            "glue_metrics": glue_metrics, "glue_average": glue_average, "rouge": rouge, "mixing": mixing,
            "decode": decode}


def main():
    logging.disable(logging.WARNING)  # seqio warns about every uncached task
    request = json.load(sys.stdin)
    answer = {}
    for key, value in request.items():
        started = time.perf_counter()
        answer[key] = SECTIONS[key](value)
        print(f"{key}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
