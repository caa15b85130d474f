"""Tests for t5_training.metrics against values worked out by hand."""

import math
from unittest import mock
import warnings

import numpy as np
from absl.testing import absltest
from absl.testing import parameterized
from rouge_score import rouge_scorer, scoring

from t5_training import metrics


class LabelParsingTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("exact", "entailment", 0),
        ("second_word", "not_entailment", 1),
        # As T5's string_label_to_class_id: the exact string, spaces and all.
        ("surrounding_whitespace", "  not_entailment\n", -1),
        ("leading_space", " entailment", -1),
        ("trailing_space", "entailment ", -1),
        ("case_sensitive", "Entailment", -1),
        ("unknown_word", "maybe", -1),
        ("empty", "", -1),
        ("prefix_only", "not", -1),
    )
    def test_label_to_id(self, text, expected):
        self.assertEqual(metrics.label_to_id(text, ("entailment", "not_entailment")),
                         expected)

    def test_a_repeated_label_word_is_the_first_class(self):
        # As T5's list.index: a word listed twice names its first class, never the later one.
        self.assertEqual(metrics.label_to_id("yes", ("yes", "no", "yes")), 0)

    @parameterized.named_parameters(
        ("plain", "3.8", -1.0, 3.8),
        ("integer", "5", -1.0, 5.0),
        ("whitespace", " 2.4 ", -1.0, 2.4),
        ("garbage", "similar-ish", -1.0, -1.0),
        ("empty", "", -1.0, -1.0),
        ("two_numbers", "3.8 4.0", -1.0, -1.0),
        ("custom_default", "n/a", 0.0, 0.0),
    )
    def test_string_to_float(self, text, default, expected):
        self.assertEqual(metrics.string_to_float(text, default=default), expected)

    @parameterized.named_parameters(
        ("zero", 0.0, "0.0"),
        ("int_zero", 0, "0.0"),
        ("five", 5.0, "5.0"),
        ("on_grid", 3.8, "3.8"),
        ("docstring_example", 1.8, "1.8"),
        # 2.5 * 5 = 12.5 -> half to even -> 12 -> 12 / 5 = 2.4.
        ("half_to_even_down", 2.5, "2.4"),
        # 4.75 * 5 = 23.75 -> 24 -> 4.8.
        ("not_a_tie", 4.75, "4.8"),
        # 1.1 * 5 = 5.5 -> half to even -> 6 -> 1.2.
        ("half_to_even_up", 1.1, "1.2"),
        # 3.3 * 5 = 16.5 -> 16 -> 3.2.
        ("half_to_even_down_2", 3.3, "3.2"),
        # 2.1 * 5 = 10.5 -> 10 -> 2.0.
        ("half_to_even_down_3", 2.1, "2.0"),
        # 3.667 * 5 = 18.335 -> 18 -> 3.6.
        ("thirds", 3.667, "3.6"),
        # float32(0.1) * 5 is exactly 0.5 in float32 -> 0; widening to float64
        # first would give 0.50000001 -> 1 -> "0.2".
        ("float32_label_0_1", np.float32(0.1), "0.0"),
        # float32: 1.7 * 5 = 8.5 -> 8 -> 1.6 (float64 of float32(1.7) -> 9 -> 1.8).
        ("float32_label_1_7", np.float32(1.7), "1.6"),
        # float32: 1.9 * 5 = 9.5 -> 10 -> 2.0 (float64 route -> 9 -> 1.8).
        ("float32_label_1_9", np.float32(1.9), "2.0"),
        ("python_float_0_1", 0.1, "0.0"),
        # A missing score stays visible, written as printf's %f writes it (not %F's "NAN").
        ("nan", math.nan, "nan"),
    )
    def test_stsb_target(self, score, expected):
        self.assertEqual(metrics.stsb_target(score), expected)


class ClassificationTest(parameterized.TestCase):

    def test_accuracy_counts_invalid_as_wrong(self):
        # Matches at positions 0, 1, 3; the -1 at position 2 is wrong: 3/4.
        self.assertEqual(metrics.accuracy([0, 1, -1, 2], [0, 1, 1, 2]), 75.0)

    def test_accuracy_numpy_and_strings(self):
        self.assertAlmostEqual(metrics.accuracy(np.array([1, 0, 0]), np.array([1, 1, 0])),
                               100.0 * 2 / 3)
        self.assertEqual(metrics.accuracy(["3.8", "2.0"], ["3.8", "2.2"]), 50.0)

    def test_mcc_confusion_matrix(self):
        # TP=3, FN=2, TN=4, FP=1:
        # (3*4 - 1*2) / sqrt((3+1)(3+2)(4+1)(4+2)) = 10 / sqrt(600) = 0.408248...
        refs = [1, 1, 1, 1, 1, 0, 0, 0, 0, 0]
        preds = [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]
        expected = 100 * 10 / math.sqrt(600)
        self.assertAlmostEqual(metrics.matthews_corrcoef(preds, refs), expected)
        self.assertAlmostEqual(expected, 40.824829, places=5)
        self.assertNotEqual(metrics.matthews_corrcoef(preds, refs), 0.0)

    def test_mcc_invalid_prediction_is_its_own_class(self):
        # sklearn's multiclass MCC: c=3 correct of s=4; true counts t={1:2, 0:2},
        # predicted counts p={1:1, -1:1, 0:2}.
        # (c*s - sum p_k t_k) / sqrt((s^2 - sum p^2)(s^2 - sum t^2))
        #   = (12 - (1*2 + 2*2)) / sqrt((16 - 6)(16 - 8)) = 6 / sqrt(80) = 0.670820
        mcc = metrics.matthews_corrcoef([1, -1, 0, 0], [1, 1, 0, 0])
        self.assertAlmostEqual(mcc, 100 * 6 / math.sqrt(80))

    def test_mcc_extremes(self):
        self.assertAlmostEqual(metrics.matthews_corrcoef([1, 0, 1, 0], [1, 0, 1, 0]),
                               100.0)
        self.assertAlmostEqual(metrics.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]),
                               -100.0)

    def test_mcc_single_class_is_zero_without_warning(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(metrics.matthews_corrcoef([1, 1, 1], [1, 1, 1]), 0.0)
        self.assertEmpty(caught)

    def test_mcc_silences_only_the_single_class_warning(self):
        # Any other warning sklearn gives (a numerical one, say) must still reach the log.
        def warning_mcc(*args):
            warnings.warn("overflow in a sum", RuntimeWarning)
            return 0.5

        with mock.patch("sklearn.metrics.matthews_corrcoef", warning_mcc):
            with self.assertWarnsRegex(RuntimeWarning, "overflow in a sum"):
                self.assertEqual(metrics.matthews_corrcoef([1, 0], [1, 0]), 50.0)

    def test_f1_with_no_positive_anywhere_is_zero_without_warning(self):
        # Precision and recall are 0/0: sklearn's default value (0.0), minus its warning.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(metrics.f1_with_invalid([0, 0, 0], [0, 0, 0]), 0.0)
        self.assertEmpty(caught)

    def test_f1_with_invalid(self):
        refs = [1, 1, 1, 0, 0]
        preds = [1, -1, 0, -1, 0]
        # The -1 on a positive reference becomes 0 (a false negative), the -1 on a
        # negative reference becomes 1 (a false positive): TP=1, FP=1, FN=2.
        # P = 1/2, R = 1/3, F1 = 2PR / (P + R) = (1/3) / (5/6) = 2/5.
        self.assertAlmostEqual(metrics.f1_with_invalid(preds, refs), 40.0)

    def test_f1_does_not_mutate_inputs(self):
        preds_list = [1, -1, 0, -1, 0]
        preds_array = np.array(preds_list)
        metrics.f1_with_invalid(preds_list, [1, 1, 1, 0, 0])
        metrics.f1_with_invalid(preds_array, np.array([1, 1, 1, 0, 0]))
        self.assertEqual(preds_list, [1, -1, 0, -1, 0])
        np.testing.assert_array_equal(preds_array, [1, -1, 0, -1, 0])

    def test_f1_valid_predictions(self):
        # TP=2, FP=1, FN=1: P = R = 2/3, F1 = 2/3.
        self.assertAlmostEqual(metrics.f1_with_invalid([1, 1, 1, 0], [1, 1, 0, 1]),
                               100 * 2 / 3)


class CorrelationTest(parameterized.TestCase):

    def test_pearson(self):
        # x = [1,2,3], y = [1,2,4]: dx = [-1,0,1], dy = [-4/3,-1/3,5/3];
        # sum dx*dy = 3, sum dx^2 = 2, sum dy^2 = 42/9 -> r = 3 / sqrt(28/3).
        self.assertAlmostEqual(metrics.pearson_corrcoef([1, 2, 3], [1, 2, 4]),
                               100 * 3 / math.sqrt(28 / 3))

    def test_pearson_numpy_floats(self):
        # y = 2x + 1 exactly -> r = 1.
        x = np.array([0.2, 1.4, 3.8, 5.0], dtype=np.float32)
        self.assertAlmostEqual(metrics.pearson_corrcoef(x, 2 * x + 1), 100.0, places=4)

    def test_spearman_no_ties(self):
        # Ranks of y = [1,3,2,4]; d = [0,-1,1,0]; rho = 1 - 6*2 / (4*(16-1)) = 0.8.
        self.assertAlmostEqual(metrics.spearman_corrcoef([1, 2, 3, 4], [10, 30, 20, 40]),
                               80.0)

    def test_spearman_with_ties(self):
        # Ranks of y = [1,2,2,3] are [1,2.5,2.5,4]: Pearson on ranks with
        # dx = [-1.5,-.5,.5,1.5], dy = [-1.5,0,0,1.5]: 4.5 / sqrt(5 * 4.5) = sqrt(0.9).
        self.assertAlmostEqual(metrics.spearman_corrcoef([1, 2, 3, 4], [1, 2, 2, 3]),
                               100 * math.sqrt(0.9))

    @parameterized.named_parameters(
        # y = [1,2,4] rises with x but not linearly: ranks agree exactly -> rho = 1, while
        # Pearson is 3 / sqrt(28/3) = 0.98198 (test_pearson above).
        ("monotone_not_linear", [1, 2, 3], [1, 2, 4], 100.0),
        # Ranks of y = [1000,1,10,100] are [4,1,2,3]; d = [-3,1,1,1], sum d^2 = 12;
        # rho = 1 - 6*12 / (4*(16-1)) = -0.2. Pearson is dominated by the 1000: -1345.5 / sqrt(5 * 701520.75) = -0.718.
        ("one_large_reference", [1, 2, 3, 4], [1000, 1, 10, 100], -20.0),
    )
    def test_spearman_is_pearson_of_the_ranks_not_of_the_values(self, preds, refs, expected):
        # The tests above use references that are affine in their ranks, where Pearson and
        # Spearman coincide; here they differ, so Spearman must rank before correlating.
        self.assertAlmostEqual(metrics.spearman_corrcoef(preds, refs), expected)
        self.assertGreater(abs(metrics.pearson_corrcoef(preds, refs) - expected), 1.0)

    @parameterized.named_parameters(("pearson", "pearson_corrcoef"), ("spearman", "spearman_corrcoef"))
    def test_booleans_correlate_as_zeros_and_ones(self, name):
        # Read as floats: numpy cannot take the range (np.ptp) of a boolean array.
        as_numbers = metrics.METRICS[name]([1, 0, 1, 1], [1, 0, 0, 1])
        self.assertAlmostEqual(metrics.METRICS[name]([True, False, True, True], [True, False, False, True]),
                               as_numbers)
        self.assertGreater(as_numbers, 0.0)

    @parameterized.named_parameters(
        ("pearson_constant_predictions", "pearson_corrcoef", [2.0, 2.0, 2.0], [1, 2, 3]),
        ("spearman_constant_predictions", "spearman_corrcoef", [2.0, 2.0, 2.0], [1, 2, 3]),
        ("pearson_constant_references", "pearson_corrcoef", [1, 2, 3], [4.0, 4.0, 4.0]),
        ("spearman_single_example", "spearman_corrcoef", [1.0], [3.0]),
    )
    def test_degenerate_correlation_is_zero_without_warning(self, name, preds, refs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(metrics.METRICS[name](preds, refs), 0.0)
        self.assertEmpty(caught)


class Seq2SeqTest(absltest.TestCase):

    def test_bleu_identical(self):
        texts = ["the cat sat on the mat", "General Kenobi , you are a bold one ."]
        self.assertAlmostEqual(metrics.bleu(texts, texts), 100.0)

    def test_bleu_brevity_penalty(self):
        # All n-gram precisions are 1; hypothesis length 5 < reference length 6:
        # BP = exp(1 - 6/5).
        self.assertAlmostEqual(metrics.bleu(["a b c d e"], ["a b c d e f"]),
                               100 * math.exp(1 - 6 / 5))

    def test_bleu_exp_smoothing(self):
        # hyp "a b c d", ref "a b d c": 1-grams 4/4, 2-grams 1/3 (only "a b"),
        # 3-grams 0/2 and 4-grams 0/1. "exp" smoothing replaces the k-th zero
        # precision with 1 / (2^k * total): 1/(2*2) and 1/(4*1). BP = 1.
        # BLEU = (1 * 1/3 * 1/4 * 1/4) ** (1/4) = (1/48) ** 0.25.
        self.assertAlmostEqual(metrics.bleu(["a b c d"], ["a b d c"]),
                               100 * (1 / 48) ** 0.25)

    def test_bleu_is_case_sensitive(self):
        # "The" matches nothing: n-gram precisions 5/6, 4/5, 3/4, 2/3, so BLEU = (1/3) ** 0.25.
        self.assertAlmostEqual(metrics.bleu(["The cat sat on the mat"], ["the cat sat on the mat"]),
                               100 * (1 / 3) ** 0.25)

    def test_bleu_tokenizes_unicode_punctuation_as_t5(self):
        # sacrebleu's "intl" tokenizer splits the guillemets off; its default ("13a") does not.
        self.assertAlmostEqual(metrics.bleu(["«hello» to the world"], ["« hello » to the world"]), 100.0)

    def test_bleu_of_a_prediction_shorter_than_four_tokens_is_zero(self):
        # No 3- or 4-grams and no effective order (T5's corpus BLEU): an exact two-word match scores 0.
        self.assertEqual(metrics.bleu(["a b"], ["a b"]), 0.0)

    def test_bleu_warns_about_tokenized_predictions(self):
        # sacrebleu's warning that the data looks tokenized is kept (it is not forced off).
        with self.assertLogs("sacrebleu", "WARNING") as logs:
            metrics.bleu(["a b ."] * 100, ["a b ."] * 100)
        self.assertTrue(any("detokenize" in line for line in logs.output))

    def test_bleu_no_match_is_zero(self):
        self.assertEqual(metrics.bleu(["w x y z", "q r s t"], ["a b c d", "e f g h"]),
                         0.0)

    def test_rouge_one_pair_by_hand(self):
        # One example: every bootstrap resample is that example, so the mid is its score exactly.
        # Unigrams: "the" x2, cat, on, mat shared = 5 of 6 each side: F = 5/6. Bigrams: "the cat",
        # "on the", "the mat" = 3 of 5: F = 3/5. LCS "the cat on the mat" = 5 of 6: F = 5/6.
        score = metrics.rouge(["the cat sat on the mat"], ["the cat is on the mat"])
        self.assertEqual(list(score), ["rouge1", "rouge2", "rougeLsum"])
        for key, expected in zip(score, (5 / 6, 3 / 5, 5 / 6)):
            self.assertAlmostEqual(score[key], 100 * expected, places=9, msg=key)

    def test_rouge_bootstraps_from_seed_zero(self):
        # Seven examples of different rouge1: the median resampled mean depends on the draws (seed 1
        # gives 53.78 here), so every run and version of this code must draw seed 0's.
        predictions, references = ["a b c d", "a b c x", "a b x y", "a x y z", "w x y z", "a b c", "a"], ["a b c d"] * 7
        scorer, aggregator = rouge_scorer.RougeScorer(["rouge1"]), scoring.BootstrapAggregator()
        for prediction, reference in zip(predictions, references):
            aggregator.add_scores(scorer.score(reference, prediction))
        np.random.seed(0)
        expected = aggregator.aggregate()["rouge1"].mid.fmeasure
        self.assertAlmostEqual(expected, 0.536735, places=6)
        self.assertAlmostEqual(metrics.rouge(predictions, references)["rouge1"], 100 * expected, places=9)

    def test_rouge_lsum_takes_the_lcs_per_sentence(self):
        # " . " ends a sentence (T5's _prepare_summary). Each reference sentence finds itself among
        # the predicted ones, so rougeLsum is 100; over the whole text the LCS is one sentence
        # ("the dog barked"), 3 of 6 tokens: rougeL would be 50. Bigrams: 4 of 5 shared.
        score = metrics.rouge(["the cat ran . the dog barked"], ["the dog barked . the cat ran"])
        self.assertAlmostEqual(score["rougeLsum"], 100.0, places=9)
        whole = rouge_scorer.RougeScorer(["rougeL"]).score("the dog barked . the cat ran", "the cat ran . the dog barked")
        self.assertAlmostEqual(whole["rougeL"].fmeasure, 0.5, places=9)  # the case tells rougeLsum from rougeL
        self.assertAlmostEqual(score["rouge1"], 100.0, places=9)
        self.assertAlmostEqual(score["rouge2"], 80.0, places=9)

    def test_rouge_does_not_stem_unless_asked(self):
        # Only "the" matches unstemmed: 1 of 3. Porter stemming makes cats -> cat and running,
        # runs -> run, so all 3 match. Both lowercase first.
        self.assertAlmostEqual(metrics.rouge(["The cats running"], ["the cat runs"])["rouge1"], 100 / 3, places=9)
        stemmed = metrics.rouge(["The cats running"], ["the cat runs"], use_stemmer=True)
        self.assertAlmostEqual(stemmed["rouge1"], 100.0, places=9)

    def test_rouge_is_the_bootstrap_mid_and_deterministic(self):
        # Two examples scoring rouge1 1 and 0: the resampled means are k/2, so the median of 1,000
        # of them is 0.5 (it cannot be any other value with probability near 1).
        predictions, references = ["a b c", "x y z"], ["a b c", "d e f"]
        np.random.seed(123)
        before = np.random.get_state()[1].copy()
        first = metrics.rouge(predictions, references)
        self.assertTrue(np.array_equal(np.random.get_state()[1], before))  # the caller's generator untouched
        self.assertEqual(first, metrics.rouge(predictions, references))
        self.assertAlmostEqual(first["rouge1"], 50.0, places=9)


class ComputeMetricsTest(parameterized.TestCase):

    def test_metric_names(self):
        self.assertCountEqual(metrics.METRICS, [
            "accuracy", "matthews_corrcoef", "f1", "pearson_corrcoef",
            "spearman_corrcoef", "bleu", "rouge"])

    def test_compute_metrics_values_are_python_floats(self):
        # Accuracy: matches at 0, 1, 4 -> 3/5. F1 after remapping the -1 on a
        # positive reference to 0: TP=1, FN=2, FP=0 -> P=1, R=1/3, F1 = 0.5.
        results = metrics.compute_metrics(
            ["accuracy", "f1"], np.array([1, 0, -1, 0, 0]), np.array([1, 0, 1, 1, 0]))
        self.assertEqual(results, {"accuracy": 60.0, "f1": 50.0})
        for value in results.values():
            self.assertIs(type(value), float)

    def test_rouge_reports_t5s_three_keys(self):
        results = metrics.compute_metrics(["rouge", "bleu"], ["the cat runs"], ["the cat runs"])
        self.assertEqual(sorted(results), ["bleu", "rouge1", "rouge2", "rougeLsum"])
        self.assertEqual(metrics.metric_keys("rouge"), ("rouge1", "rouge2", "rougeLsum"))
        self.assertEqual(metrics.metric_keys("bleu"), ("bleu",))
        stemmed = metrics.compute_metrics(["rouge"], ["cats"], ["cat"], rouge_use_stemmer=True)
        self.assertEqual(stemmed["rouge1"], 100.0)
        self.assertEqual(metrics.compute_metrics(["rouge"], ["cats"], ["cat"])["rouge1"], 0.0)

    def test_unknown_metric_lists_known_names(self):
        with self.assertRaisesRegex(ValueError, r"squad.*accuracy.*rouge"):
            metrics.compute_metrics(["accuracy", "squad"], [1], [1])

    @parameterized.named_parameters(
        *[(name, name) for name in sorted(metrics.METRICS)])
    def test_empty_input_raises(self, name):
        with self.assertRaisesRegex(ValueError, "^cannot compute a metric on empty predictions/references$"):
            metrics.METRICS[name]([], [])

    def test_length_mismatch_raises(self):
        with self.assertRaisesRegex(ValueError, "^got 2 predictions but 3 references$"):
            metrics.accuracy([1, 0], [1, 0, 1])


if __name__ == "__main__":
    absltest.main()
