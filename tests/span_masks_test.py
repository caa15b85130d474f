"""Tests for t5_training.span_masks: T5 noise masks for rows of different lengths at once."""

from absl.testing import absltest
import numpy as np

from t5_training import collators as dc
from t5_training import row_keys, span_masks


class RaggedMasksTest(absltest.TestCase):

    def test_ragged_masks_exact_counts_per_row(self):
        # Rows of every UL2 span denoiser's 512 chunk, plus tiny and dense ones, in one call.
        shapes = [(567, 85, 28), (587, 88, 11), (765, 382, 127), (906, 453, 57), (599, 90, 1), (1004, 502, 8),
                  (2, 1, 1), (10, 8, 2), (10, 5, 5)]  # (length, noise, spans); (10, 5, 5): every gap cut
        pick = np.random.default_rng(0).integers(0, len(shapes), 3_000)
        length, noise, spans = (np.asarray(shapes)[pick, i] for i in range(3))
        flat = span_masks.random_spans_noise_masks(np.random.default_rng(1), length, noise, spans)
        self.assertEqual(flat.shape, (length.sum(),))
        inside = np.arange(1004) < length[:, None]
        mask = np.zeros(inside.shape, dtype=bool)
        mask[inside] = flat
        starts = mask & ~np.pad(mask[:, :-1], ((0, 0), (1, 0)))
        np.testing.assert_array_equal(mask.sum(1), noise)
        np.testing.assert_array_equal(starts.sum(1), spans)
        self.assertFalse(mask[:, 0].any())  # kept text first, noise last, as T5's
        self.assertTrue(mask[np.arange(len(mask)), length - 1].all())

    def test_ragged_masks_are_uniform_like_t5s(self):
        # 5 noise and 5 kept items in 3 spans each: 6 x 6 masks, each as likely, beside rows of other shapes.
        rows = 72_000
        length = np.where(np.arange(rows) % 2 == 0, 10, 300)
        noise, spans = np.where(length == 10, 5, 150), np.where(length == 10, 3, 40)
        flat = span_masks.random_spans_noise_masks(np.random.default_rng(2), length, noise, spans)
        mask = np.stack([row for row in np.split(flat, np.cumsum(length)[:-1]) if len(row) == 10])
        _, counts = np.unique(mask, axis=0, return_counts=True)
        self.assertLen(counts, 36)
        self.assertLess(np.abs(counts / len(mask) - 1 / 36).max(), 0.005)
        reference = dc.random_spans_noise_mask(rows // 2, 10, 0.5, 5 / 3, np.random.default_rng(3))
        self.assertEqual({row.tobytes() for row in mask}, {row.tobytes() for row in reference})

    def test_a_rows_mask_is_its_keys_alone(self):
        # Rows of three shapes: a row keeps its mask beside other rows, and rows of one shape get exactly
        # the collator's masks from the same keys (both cut the first distinct gaps a row draws).
        shapes = np.array([(567, 85, 28), (765, 382, 127), (10, 5, 5)] * 4)
        keys = row_keys.row_keys(5, np.arange(len(shapes)))

        def masks(rows):
            flat = span_masks.random_spans_noise_masks(keys[rows], *shapes[rows].T)
            return np.split(flat, np.cumsum(shapes[rows, 0])[:-1])

        together = masks(np.arange(len(shapes)))
        for rows in ([3, 0], [11, 7, 2], [4]):
            for row, mask in zip(rows, masks(np.array(rows))):
                np.testing.assert_array_equal(mask, together[row])
        for shape in range(3):
            rows = np.arange(shape, len(shapes), 3)
            length, noise, spans = shapes[shape]
            same = dc.random_spans_noise_mask(len(rows), length, noise / length, noise / spans, keys[rows])
            np.testing.assert_array_equal(same, np.stack([together[row] for row in rows]))

    def test_dense_rows_cut_the_first_distinct_gaps_they_draw_as_the_collator(self):
        # Half the gaps cut: (10, 5, 3) cuts exactly half of its 4 gaps per side (drawn, not flipped, as
        # the collator draws them), and (402, 201, 101), 100 cuts among 200 gaps, needs second and
        # third rounds of draws in some rows; (12, 6, 4) cuts 3 of 5 gaps by drawing the 2 it keeps.
        # Rows of each shape get the collator's masks from the same keys.
        shapes = np.array([(10, 5, 3), (402, 201, 101), (12, 6, 4)] * 100)
        keys = row_keys.row_keys(5, np.arange(len(shapes)))
        flat = span_masks.random_spans_noise_masks(keys, *shapes.T)
        rows = np.split(flat, np.cumsum(shapes[:, 0])[:-1])
        for shape in range(3):
            length, noise, spans = shapes[shape]
            self.assertEqual(dc.span_counts(length, noise / length, noise / spans), (noise, length - noise, spans))
            same = dc.random_spans_noise_mask(100, length, noise / length, noise / spans, keys[shape::3])
            np.testing.assert_array_equal(same, np.stack(rows[shape::3]))


if __name__ == "__main__":
    absltest.main()
