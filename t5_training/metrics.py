"""Evaluation metrics for GLUE-style and seq2seq tasks, defined as T5 defines them.

The definitions follow Google's T5 reference (`t5/evaluation/metrics.py`,
`t5/data/postprocessors.py` and the `stsb` preprocessor) so that scores are
comparable with published T5 numbers. Every score is on T5's 0-100 scale. They
are computed locally with scikit-learn, scipy, sacrebleu and rouge_score, because
`evaluate.load` needs network access that training machines may not have.

All metric functions take `(predictions, references)` (lists or numpy arrays of
equal, non-zero length; empty or mismatched input raises `ValueError`).
Classification predictions are class ids from :func:`label_to_id`, where `-1`
marks an output that matched no label word and is always counted wrong.
"""

import warnings
from typing import Callable, Mapping, Sequence

import numpy as np

# scikit-learn, scipy, sacrebleu and rouge_score are imported inside the metrics that use them:
# together they add about 2 s to the start of every run (and every refused command line), and a
# run needs one or two of them.


def label_to_id(text: str, label_words: Sequence[str]) -> int:
    """Index of `text` in `label_words`, or -1 when it matches none: the exact string, spaces and case
    included, as T5's string_label_to_class_id (" acceptable" is no label there, so none here)."""
    words = list(label_words)
    return words.index(text) if text in words else -1


def string_to_float(text: str, default: float = -1.0) -> float:
    """`float(text)`, or `default` when the model emitted something unparsable."""
    try:
        return float(text)
    except ValueError:
        return default


def stsb_target(score: float) -> str:
    """STS-B target string: the score rounded to the nearest 0.2, one decimal."""
    # T5 computes tf.as_string(tf.round(label * 5) / 5, precision=1) on the
    # dataset's float32 label; tf.round rounds half to even (12.5 -> 12, so
    # 2.5 -> "2.4"). The arithmetic must stay in float32: float32(0.1) widened to
    # float64 and times 5 is 0.50000001 -> rounds up to "0.2", whereas T5's
    # float32 product is exactly 0.5 -> "0.0". Same for 0.7, 1.7, 1.9, 2.3, ...
    five = np.float32(5)
    rounded = np.round(np.float32(score) * five) / five
    return "%.1f" % float(rounded)


def _check(predictions, references) -> None:
    if len(predictions) != len(references):
        raise ValueError(
            f"got {len(predictions)} predictions but {len(references)} references")
    if len(predictions) == 0:
        raise ValueError("cannot compute a metric on empty predictions/references")


def accuracy(predictions, references) -> float:
    _check(predictions, references)
    return 100.0 * float(np.mean([p == r for p, r in zip(predictions, references)]))


def matthews_corrcoef(predictions, references) -> float:
    # As in T5, an invalid -1 stays a class of its own (sklearn's multiclass MCC)
    # rather than being remapped to the wrong binary label.
    _check(predictions, references)
    with warnings.catch_warnings():
        # A single class (e.g. a collapsed model) gives MCC 0.0 plus a
        # confusion-matrix-shape warning that is noise in an eval log.
        warnings.simplefilter("ignore", UserWarning)
        import sklearn.metrics

        value = sklearn.metrics.matthews_corrcoef(list(references), list(predictions))
    return 100.0 * float(value)


def f1_with_invalid(predictions, references) -> float:
    """Binary F1 of class 1, where any prediction other than 0/1 counts as wrong."""
    _check(predictions, references)
    refs = np.asarray(references)
    preds = np.array(predictions)  # a copy: T5 edits its array in place
    invalid = (preds != 0) & (preds != 1)
    preds = np.where(invalid, 1 - refs, preds)
    import sklearn.metrics

    # zero_division=0.0 is sklearn's default value, minus its warning.
    return 100.0 * float(sklearn.metrics.f1_score(refs, preds, zero_division=0.0))


def _correlation(name: str, predictions, references) -> float:
    _check(predictions, references)
    x = np.asarray(predictions, dtype=np.float64)
    y = np.asarray(references, dtype=np.float64)
    # A constant side (or a single example) has no defined correlation: scipy
    # returns nan with a ConstantInputWarning and T5 would report nan. We report
    # 0.0 so a collapsed model scores "no correlation" and checkpoint selection
    # by max() keeps working.
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    import scipy.stats

    return 100.0 * float(getattr(scipy.stats, name)(x, y)[0])


def pearson_corrcoef(predictions, references) -> float:
    return _correlation("pearsonr", predictions, references)


def spearman_corrcoef(predictions, references) -> float:
    return _correlation("spearmanr", predictions, references)


def bleu(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU with T5's sacrebleu settings, one reference per example."""
    _check(predictions, references)
    import sacrebleu

    # "exp" smoothing (mteval's) gives a zero-match n-gram order a small
    # non-zero precision, so BLEU is 0 only when not even a unigram matches.
    result = sacrebleu.corpus_bleu(
        [str(p) for p in predictions], [[str(r) for r in references]],
        smooth_method="exp", smooth_value=0.0, force=False, lowercase=False,
        tokenize="intl", use_effective_order=False)
    return float(result.score)


ROUGE_KEYS = ("rouge1", "rouge2", "rougeLsum")


def rouge(predictions: Sequence[str], references: Sequence[str], use_stemmer: bool = False) -> dict[str, float]:
    """ROUGE as T5 reports it (t5/evaluation/metrics.py): rouge1, rouge2 and rougeLsum, 0-100.

    Unstemmed unless asked; " . " ends a sentence for rougeLsum (its LCS is taken per sentence);
    each key is the mid F-measure of rouge_score's BootstrapAggregator: the median over 1,000
    resamples of the mean over examples.
    """
    _check(predictions, references)
    from rouge_score import rouge_scorer, scoring

    scorer = rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=use_stemmer)
    aggregator = scoring.BootstrapAggregator()
    for prediction, reference in zip(predictions, references):
        aggregator.add_scores(scorer.score(target=_sentences(str(reference)), prediction=_sentences(str(prediction))))
    # The bootstrap draws from numpy's global generator: a fixed seed makes the score a function
    # of the predictions alone (T5's is not), and the caller's generator is left as it was.
    state = np.random.get_state()
    np.random.seed(0)
    try:
        result = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    return {key: 100.0 * float(result[key].mid.fmeasure) for key in ROUGE_KEYS}


def _sentences(text: str) -> str:
    # T5's _prepare_summary: a newline after each " . " so that rougeLsum sees the sentences.
    return text.replace(" . ", " .\n")


METRICS: Mapping[str, Callable] = {
    "accuracy": accuracy,
    "matthews_corrcoef": matthews_corrcoef,
    "f1": f1_with_invalid,
    "pearson_corrcoef": pearson_corrcoef,
    "spearman_corrcoef": spearman_corrcoef,
    "bleu": bleu,
    "rouge": rouge,
}
# A metric that reports several values: the keys it reports (every other metric reports its name).
METRIC_KEYS: Mapping[str, tuple[str, ...]] = {"rouge": ROUGE_KEYS}


def metric_keys(name: str) -> tuple[str, ...]:
    """The result keys metric `name` reports."""
    return METRIC_KEYS.get(name, (name,))


def compute_metrics(names: Sequence[str], predictions, references, *,
                    rouge_use_stemmer: bool = False) -> dict[str, float]:
    """`{key: score}` for each metric name's keys (`metric_keys`), as plain Python floats."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(METRICS)}")
    results = {}
    for name in names:
        if name == "rouge":
            results.update(rouge(predictions, references, use_stemmer=rouge_use_stemmer))
        else:
            results[name] = float(METRICS[name](predictions, references))
    return results
