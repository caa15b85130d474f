"""Tests for t5_training.samplers: seeded shuffles and length-grouped batching."""

import collections

from absl.testing import absltest, parameterized
import numpy as np
import torch

from t5_training import samplers


class EpochShuffleSamplerTest(parameterized.TestCase):

    def _order(self, seed, epoch, length=50):
        sampler = samplers.EpochShuffleSampler(length, seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    def test_same_seed_and_epoch_same_order(self):
        self.assertEqual(self._order(42, 3), self._order(42, 3))

    def test_epochs_differ(self):
        orders = [tuple(self._order(42, epoch)) for epoch in range(5)]
        self.assertLen(set(orders), 5)

    def test_seeds_differ(self):
        self.assertNotEqual(self._order(1, 0), self._order(2, 0))

    @parameterized.named_parameters(("fifty", 50), ("one", 1), ("odd", 37))
    def test_permutation(self, length):
        sampler = samplers.EpochShuffleSampler(length, seed=0)
        self.assertLen(sampler, length)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            self.assertEqual(sorted(sampler), list(range(length)))

    def test_order_is_not_identity(self):
        self.assertNotEqual(self._order(42, 0), list(range(50)))

    def test_global_rng_untouched(self):
        torch.manual_seed(123)
        before = torch.get_rng_state()
        sampler = samplers.EpochShuffleSampler(1000, seed=7)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            list(sampler)
        self.assertTrue(torch.equal(torch.get_rng_state(), before))
        expected = torch.rand(3)
        torch.manual_seed(123)
        self.assertTrue(torch.equal(torch.rand(3), expected))

    def test_resume_replays_an_epoch(self):
        # A sampler created fresh (after a restart) at epoch 2 gives what the running one gave.
        running = samplers.EpochShuffleSampler(30, seed=5)
        seen = []
        for epoch in range(3):
            running.set_epoch(epoch)
            seen.append(list(running))
        fresh = samplers.EpochShuffleSampler(30, seed=5)
        fresh.set_epoch(2)
        self.assertEqual(list(fresh), seen[2])


def _lengths(n, seed=0):
    # Short-tailed lengths like SST-2's (most rows 5-30 tokens, a few long ones).
    return np.random.default_rng(seed).integers(3, 70, size=n).tolist()


class LengthGroupedSamplerTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("one_window", 100, 8), ("several_windows", 1000, 4), ("ragged_end", 1237, 8), ("tiny", 3, 8),
    )
    def test_every_row_once_per_epoch(self, n, batch_size):
        sampler = samplers.LengthGroupedSampler(_lengths(n), batch_size, seed=3)
        self.assertLen(sampler, n)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            order = list(sampler)
            self.assertLen(order, n)
            self.assertEqual(collections.Counter(order), collections.Counter(range(n)))

    def test_batches_hold_similar_lengths(self):
        n, batch_size = 2000, 16
        lengths = _lengths(n)
        sampler = samplers.LengthGroupedSampler(lengths, batch_size, seed=0)
        grouped = list(sampler)
        shuffled = list(samplers.EpochShuffleSampler(n, seed=0))

        def padded_tokens(order):
            batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
            return sum(len(b) * max(lengths[j] for j in b) for b in batches)

        real = sum(lengths)
        # Random batches of 16 from lengths 3..69 pad to about their maximum, roughly twice the
        # mean; sorted windows of 800 rows leave almost nothing to pad.
        self.assertGreater(padded_tokens(shuffled) / real, 1.7)
        self.assertLess(padded_tokens(grouped) / real, 1.05)

    def test_the_short_batch_holds_the_last_windows_shortest_rows(self):
        n, batch_size = 1237, 8
        lengths = _lengths(n)
        order = list(samplers.LengthGroupedSampler(lengths, batch_size, seed=1))
        window = samplers.MEGABATCH_BATCHES * batch_size
        last_window = order[(n // window) * window:]
        tail, rest = last_window[-(n % batch_size):], last_window[:-(n % batch_size)]
        # Kept last rather than shuffled among the full batches, so every other batch is full
        # and the ragged one is as cheap as it can be.
        self.assertLen(tail, 5)
        self.assertLessEqual(max(lengths[i] for i in tail), min(lengths[i] for i in rest))

    def test_pure_function_of_seed_and_epoch(self):
        lengths = _lengths(500)
        a = samplers.LengthGroupedSampler(lengths, 8, seed=5)
        b = samplers.LengthGroupedSampler(lengths, 8, seed=5)
        a.set_epoch(2)
        list(samplers.LengthGroupedSampler(lengths, 8, seed=9))
        b.set_epoch(2)
        self.assertEqual(list(a), list(b))
        b.set_epoch(3)
        self.assertNotEqual(list(a), list(b))
        self.assertNotEqual(list(a), list(samplers.LengthGroupedSampler(lengths, 8, seed=6)))

    def test_global_rng_untouched(self):
        torch.manual_seed(0)
        before = torch.get_rng_state()
        list(samplers.LengthGroupedSampler(_lengths(300), 8, seed=1))
        self.assertTrue(torch.equal(torch.get_rng_state(), before))

    def test_batch_order_inside_a_window_is_shuffled(self):
        # Not longest-first all the way down: the batches of a window come in shuffled order.
        n, batch_size = 400, 8
        lengths = _lengths(n)
        order = list(samplers.LengthGroupedSampler(lengths, batch_size, seed=2))
        batch_max = [max(lengths[j] for j in order[i:i + batch_size]) for i in range(0, n, batch_size)]
        self.assertNotEqual(batch_max, sorted(batch_max, reverse=True))


if __name__ == "__main__":
    absltest.main()
