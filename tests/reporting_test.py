"""reporting.paired_interval: the paired-seed confidence interval the pretraining study reports."""
import math

from absl.testing import absltest, parameterized

from t5_training import reporting


class PairedIntervalTest(parameterized.TestCase):

    def test_three_pairs_by_hand(self):
        # Differences 2, 3, 2: mean 7/3, sd sqrt(1/3), t(0.975, 2 df) = 4.302653, so the half
        # width is 4.302653 * sqrt(1/3) / sqrt(3) = 4.302653 / 3.
        result = reporting.paired_interval([3.0, 5.0, 4.0], [1.0, 2.0, 2.0])
        self.assertAlmostEqual(result["mean"], 7 / 3)
        self.assertAlmostEqual(result["low"], 7 / 3 - 4.302653 / 3, places=5)
        self.assertAlmostEqual(result["high"], 7 / 3 + 4.302653 / 3, places=5)
        self.assertEqual((result["pairs"], result["wins"]), (3, 3))

    def test_the_shared_seed_effect_cancels(self):
        # Seeds differ by 10 points, pretraining adds exactly 1 in each: an interval of zero width.
        result = reporting.paired_interval([11.0, 21.0, 31.0], [10.0, 20.0, 30.0])
        self.assertAlmostEqual(result["low"], 1.0)
        self.assertAlmostEqual(result["high"], 1.0)

    def test_a_loss_counts_against(self):
        result = reporting.paired_interval([1.0, 0.0, 2.0, 1.0, 0.5], [0.0, 1.0, 1.0, 1.5, 0.0])
        self.assertEqual(result["wins"], 3)
        self.assertLess(result["low"], 0.0)
        self.assertGreater(result["high"], 0.0)

    def test_one_pair_has_no_interval(self):
        result = reporting.paired_interval([2.0], [1.0])
        self.assertEqual(result["mean"], 1.0)
        self.assertTrue(math.isnan(result["low"]) and math.isnan(result["high"]))

    @parameterized.parameters(([1.0, 2.0], [1.0]), ([], []))
    def test_unpaired_values_are_refused(self, treated, control):
        with self.assertRaisesRegex(ValueError, "paired"):
            reporting.paired_interval(treated, control)


if __name__ == "__main__":
    absltest.main()
