"""Tests for t5_training.row_keys: each row's key, (seed, its idx), and the draws made from it."""
import os
import types
from unittest import mock

from absl.testing import absltest
import numpy as np

from t5_training import row_keys as rk

# SplitMix64's first five outputs from state 1234567 (Rosetta Code, "Pseudo-random numbers/Splitmix64").
_SPLITMIX_1234567 = (6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
                     16408922859458223821)


def _splitmix(state: int) -> int:
    """SplitMix64's output for one state, in Python integers: the reference the module's draws follow."""
    z = (state + 0x9E3779B97F4A7C15) % 2 ** 64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2 ** 64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2 ** 64
    return z ^ (z >> 31)


def _finalise(z: int) -> int:
    """SplitMix64's mixing step alone (its output for the state one increment earlier)."""
    return _splitmix((z - 0x9E3779B97F4A7C15) % 2 ** 64)


def _in_worker(worker_id: int):
    """Runs the block as if inside DataLoader worker `worker_id`."""
    return mock.patch("torch.utils.data.get_worker_info", return_value=types.SimpleNamespace(id=worker_id))


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

    def test_draws_follow_splitmix64(self):
        # Masks are re-created on resume only while the derivation stays fixed: pin it to the reference.
        self.assertEqual([_splitmix(1234567 + i * 0x9E3779B97F4A7C15) for i in range(5)], list(_SPLITMIX_1234567))
        # Draw number c of key k is SplitMix64's output c + 1 from state k, top 53 bits.
        u = rk.uniforms(np.array([1234567], np.uint64), np.arange(5))
        self.assertEqual([int(x) for x in u * 2.0 ** 53], [v >> 11 for v in _SPLITMIX_1234567])
        # A row's key: the finaliser twice over its id XOR the seed's first SplitMix64 output.
        self.assertEqual([int(k) for k in rk.row_keys(1234567, [0, 5])],
                         [_finalise(_finalise(i ^ _SPLITMIX_1234567[0])) for i in (0, 5)])
        # A purpose's keys: the finaliser over the key XOR the purpose times an odd constant.
        key = 0x0123456789ABCDEF
        self.assertEqual([int(rk.stream(np.array([key], np.uint64), p)[0]) for p in (rk.DENOISER, rk.KEPT_CUTS)],
                         [_finalise(key ^ (p * 0xD1B54A32D192ED03 % 2 ** 64)) for p in (rk.DENOISER, rk.KEPT_CUTS)])

    def test_row_keys_take_any_seed_and_any_shape_of_ids(self):
        ids = np.arange(6)
        # Seeds are read modulo 2**64, as numpy's uint64 would hold them; small seeds all differ.
        np.testing.assert_array_equal(rk.row_keys(-1, ids), rk.row_keys(2 ** 64 - 1, ids))
        np.testing.assert_array_equal(rk.row_keys(2 ** 64 + 5, ids), rk.row_keys(5, ids))
        by_seed = [rk.row_keys(seed, ids) for seed in range(4)]
        self.assertLen({k for keys in by_seed for k in keys.tolist()}, 24)
        # One key per id, whatever the ids' integer type or shape.
        np.testing.assert_array_equal(rk.row_keys(3, np.array([[7, 2], [4, 1]], np.int32)),
                                      rk.row_keys(3, [7, 2, 4, 1]))
        np.testing.assert_array_equal(rk.row_keys(3, 7), rk.row_keys(3, [7]))

    def test_stream_keeps_distinct_keys_distinct(self):
        # Every single-bit difference between keys survives: a purpose's stream is a bijection of the keys.
        keys = np.array([0] + [1 << b for b in range(64)], np.uint64)
        for purpose in (rk.DENOISER, rk.PREFIX_SPLIT, rk.NOISE_CUTS, rk.KEPT_CUTS):
            self.assertLen(np.unique(rk.stream(keys, purpose)), 65)

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
        many = rk.keys_for(np.random.default_rng(0), 1000)  # the whole uint64 range, so rows never share a key
        self.assertLen(np.unique(many), 1000)
        self.assertGreater(int(many.max()), 2 ** 63)
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
        with mock.patch.dict(os.environ):
            os.environ.pop("RANK", None)  # a single process, not launched by torchrun: rank 0
            np.testing.assert_array_equal(rk.RowRandomness(5)(rows), first)

    def test_without_idx_each_worker_draws_its_own_stream(self):
        rows = [{}] * 4
        with mock.patch.dict(os.environ, {"RANK": "0"}):
            keys = rk.RowRandomness(5)
            in_main = keys(rows)
            by_worker = []
            for worker_id in (0, 1):
                with _in_worker(worker_id):
                    by_worker.append(keys(rows))  # the collator DataLoader copied into the worker
            with _in_worker(1):
                fresh = rk.RowRandomness(5)(rows)
        # A worker starts its own stream, as a collator first used there would, whatever the main
        # process drew before; no two of them share keys.
        np.testing.assert_array_equal(by_worker[1], fresh)
        streams = [in_main, *by_worker]
        self.assertLen({k for keys in streams for k in keys.tolist()}, 12)
        # SeedSequence takes entropy >= 0: the main process (worker -1) is entry 0, worker w is w + 1.
        for worker_id, drawn in ((-1, in_main), (0, by_worker[0])):
            expected = np.random.default_rng(np.random.SeedSequence([5, 0, worker_id + 1]))
            np.testing.assert_array_equal(drawn, expected.integers(0, 2 ** 64, 4, np.uint64))


if __name__ == "__main__":
    absltest.main()
