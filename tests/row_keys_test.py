"""Tests for t5_training.row_keys: each row's key, (seed, its idx), and the draws made from it."""
import os
from unittest import mock

from absl.testing import absltest
import numpy as np

from t5_training import row_keys as rk


class RowKeysTest(absltest.TestCase):

    def test_row_keys_and_their_draws(self):
        keys = rk.row_keys(3, np.arange(50_000))
        self.assertLen(np.unique(keys), 50_000)
        self.assertTrue(np.all(keys != rk.row_keys(4, np.arange(50_000))))
        np.testing.assert_array_equal(rk.row_keys(3, [7, 2]), keys[[7, 2]])
        # Draws: uniform in [0, 1), the same for the same (key, counter), apart for other counters and streams.
        u = rk.uniforms(keys, 0)
        self.assertTrue(np.all((u >= 0) & (u < 1)))
        counts = np.bincount((u * 10).astype(int), minlength=10)
        self.assertLess(np.abs(counts / 5_000 - 1).max(), 0.06, counts)
        np.testing.assert_array_equal(rk.uniforms(keys[[7, 2]], 0), u[[7, 2]])
        for other in (rk.uniforms(keys, 1), rk.uniforms(rk.stream(keys, rk.PREFIX_SPLIT), 0)):
            self.assertLess(abs(np.corrcoef(u, other)[0, 1]), 0.02)

    def test_purposes_draw_apart(self):
        keys = rk.row_keys(0, np.arange(20_000))
        purposes = (rk.DENOISER, rk.PREFIX_SPLIT, rk.NOISE_CUTS, rk.KEPT_CUTS)
        self.assertLen(set(purposes), 4)
        draws = [rk.uniforms(rk.stream(keys, p), 0) for p in purposes]
        for i in range(4):
            for j in range(i):
                self.assertLess(abs(np.corrcoef(draws[i], draws[j])[0, 1]), 0.03, (i, j))

    def test_keys_for_takes_row_keys_or_a_generator(self):
        keys = rk.row_keys(1, np.arange(3))
        self.assertIs(rk.keys_for(keys, 3), keys)
        drawn = rk.keys_for(np.random.default_rng(0), 3)
        self.assertEqual((drawn.dtype, drawn.shape), (np.uint64, (3,)))
        np.testing.assert_array_equal(drawn, rk.keys_for(np.random.default_rng(0), 3))
        with self.assertRaisesRegex(ValueError, "Generator or 3 uint64 row keys"):
            rk.keys_for(np.arange(3), 3)  # int64 ids, not keys
        with self.assertRaisesRegex(ValueError, "Generator or 4 uint64 row keys"):
            rk.keys_for(keys, 4)

    def test_row_randomness_keys_rows_by_idx(self):
        rows = [{"idx": 9}, {"idx": 4}]
        np.testing.assert_array_equal(rk.RowRandomness(5)(rows), rk.row_keys(5, [9, 4]))
        with self.assertRaisesRegex(ValueError, '1 of 2 examples carry "idx"'):
            rk.RowRandomness(5)([{"idx": 9}, {}])

    def test_without_idx_each_rank_draws_its_own_stream(self):
        rows = [{}] * 4
        with mock.patch.dict(os.environ, {"RANK": "0"}):
            keys = rk.RowRandomness(5)
            first, second = keys(rows), keys(rows)
        self.assertFalse(np.array_equal(first, second))  # a stream: later batches draw anew
        with mock.patch.dict(os.environ, {"RANK": "1"}):
            other_rank = rk.RowRandomness(5)(rows)
        self.assertFalse(np.array_equal(first, other_rank))
        with mock.patch.dict(os.environ, {"RANK": "0"}):
            np.testing.assert_array_equal(rk.RowRandomness(5)(rows), first)


if __name__ == "__main__":
    absltest.main()
