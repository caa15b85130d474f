"""Tests of t5_training.tools.length_stats: the suggestion rule, percentiles, truncation and histograms."""
import numpy as np
from absl.testing import absltest, parameterized

from t5_training.tools import length_stats


class RulesTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("all_short_labels", [2] * 10, 8),
        ("longest_short_rounds_up", list(range(3, 61)), 64),
        ("longest_exactly_the_bound", [10] * 99 + [128], 128),
        ("long_tail_takes_p99", [100] * 99 + [129], 104),
        ("p99_already_a_multiple", [200] * 99 + [1000], 200),
    )
    def test_suggested_length(self, lengths, expected):
        self.assertEqual(length_stats.suggest_length(np.array(lengths)), expected)

    def test_p99_suggestion_cuts_at_most_one_percent(self):
        lengths = np.random.default_rng(0).lognormal(5, 1, size=5000).astype(np.int64) + 1
        stats = length_stats.length_stats(lengths, 512, "--max_source_length")
        self.assertGreater(stats["max"], length_stats.KEEP_ALL_UP_TO)
        self.assertLessEqual(stats["suggested_truncated_percent"], 1.0)
        self.assertEqual(stats["suggested_length"] % 8, 0)
        self.assertEqual(stats["truncated_rows"], int(np.sum(lengths > 512)))

    def test_percentiles_are_lengths_that_rows_fit_in(self):
        stats = length_stats.length_stats(np.arange(1, 101), 50, "--max_source_length")
        self.assertEqual([stats[f"p{q}"] for q in (50, 90, 95, 99)], [50, 90, 95, 99])
        self.assertEqual((stats["truncated_rows"], stats["truncated_percent"]), (50, 50.0))

    @parameterized.named_parameters(
        ("one_value", [2] * 7),
        ("two_values", [2, 3, 3]),
        ("eleven_values", list(range(5, 16))),
        ("long_tail", list(np.random.default_rng(1).lognormal(4, 1, size=999).astype(int) + 1)),
    )
    def test_histogram_counts_every_row_once(self, lengths):
        lengths = np.array(lengths)
        edges, counts = length_stats.histogram(lengths)
        self.assertEqual(counts.sum(), len(lengths))
        self.assertLessEqual(len(counts), length_stats.HISTOGRAM_BINS)
        self.assertLen(set(np.diff(edges)), 1)  # equal widths
        self.assertEqual((edges[0], counts[-1] > 0), (lengths.min(), True))
        self.assertTrue(np.all(lengths < edges[-1]))
        self.assertEqual(counts.tolist(), np.histogram(lengths, bins=edges)[0].tolist())


if __name__ == "__main__":
    absltest.main()
