"""losses: the cross entropy training and evaluation share, against one written out by hand."""
import math

from absl.testing import absltest, parameterized
import torch

from t5_training import losses

IGNORE = losses.IGNORE


def _by_hand(logits: torch.Tensor, labels: torch.Tensor) -> list[tuple[float, int]]:
    """Per row: -sum(log softmax at the label) over positions that are not padding, and their count."""
    rows = []
    for row_logits, row_labels in zip(logits.double().tolist(), labels.tolist()):
        total, count = 0.0, 0
        for position, label in zip(row_logits, row_labels):
            if label == IGNORE:
                continue
            log_norm = math.log(sum(math.exp(v) for v in position))
            total += log_norm - position[label]
            count += 1
        rows.append((total, count))
    return rows


class CrossEntropyTest(parameterized.TestCase):

    def setUp(self):
        super().setUp()
        generator = torch.Generator().manual_seed(0)
        # 3 rows of 5 target positions over a vocabulary of 7; padding at each row's end, and
        # one row that is all padding (a row can hold no target token at all).
        self.logits = 3 * torch.randn(3, 5, 7, generator=generator)
        self.labels = torch.tensor([[1, 6, 0, IGNORE, IGNORE],
                                    [IGNORE, IGNORE, IGNORE, IGNORE, IGNORE],
                                    [2, 2, 5, 4, 3]])
        self.expected = _by_hand(self.logits, self.labels)

    def test_the_sum_is_over_target_tokens_only_not_their_mean(self):
        got = losses.token_cross_entropy_sum(self.logits, self.labels)
        self.assertEqual(got.dtype, torch.float32)
        self.assertAlmostEqual(got.item(), sum(total for total, _ in self.expected), places=4)

    def test_each_row_has_its_sum_and_its_count_of_target_tokens(self):
        loss, count = losses.row_cross_entropy(self.logits, self.labels)
        self.assertEqual(loss.shape, (3,))
        self.assertEqual(loss.dtype, torch.float32)
        self.assertEqual(count.tolist(), [3, 0, 5])
        for got, (want, _) in zip(loss.tolist(), self.expected):
            self.assertAlmostEqual(got, want, places=4)

    @parameterized.parameters(torch.bfloat16, torch.float16)
    def test_half_precision_logits_are_summed_in_fp32(self, dtype):
        # The same rounded logits, upcast before the softmax: a half-precision sum of 8 tokens with
        # values near 10 would be off in the first decimal.
        low = self.logits.to(dtype)
        want = _by_hand(low.float(), self.labels)
        got = losses.token_cross_entropy_sum(low, self.labels)
        self.assertEqual(got.dtype, torch.float32)
        self.assertAlmostEqual(got.item(), sum(total for total, _ in want), places=4)
        rows, _ = losses.row_cross_entropy(low, self.labels)
        self.assertEqual(rows.dtype, torch.float32)
        for got_row, (want_row, _) in zip(rows.tolist(), want):
            self.assertAlmostEqual(got_row, want_row, places=4)


class ForwardLossTest(absltest.TestCase):

    def test_the_model_sees_the_batch_inputs_mask_and_decoder_inputs(self):
        seen = {}
        logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(1))

        class Model(torch.nn.Module):
            def forward(self, **kwargs):
                seen.update(kwargs)
                return type("Output", (), {"logits": logits})()

        batch = {"input_ids": torch.tensor([[5, 6, 1], [7, 1, 0]]), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
                 "decoder_input_ids": torch.tensor([[0, 3, 4], [0, 2, 9]]),
                 "labels": torch.tensor([[3, 4, 1], [2, 1, IGNORE]])}
        got = losses.forward_loss_sum(Model(), batch)
        self.assertEqual(set(seen), {"input_ids", "attention_mask", "decoder_input_ids"})  # never labels: no HF mean
        for name in seen:
            self.assertIs(seen[name], batch[name])
        self.assertAlmostEqual(got.item(), sum(total for total, _ in _by_hand(logits, batch["labels"])), places=4)


if __name__ == "__main__":
    absltest.main()
