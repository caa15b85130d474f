"""Tests for tests/conftest.py: the suite runs on the CPU unless T5_TRAINING_TEST_DEVICE=cuda."""
import os

import torch
from absl.testing import absltest


class TestDeviceTest(absltest.TestCase):
    def test_gpus_are_hidden_unless_cuda_is_asked_for(self):
        if os.environ.get("T5_TRAINING_TEST_DEVICE") == "cuda":
            self.assertNotEqual(os.environ.get("CUDA_VISIBLE_DEVICES"), "")
            self.assertTrue(torch.cuda.is_available(), "T5_TRAINING_TEST_DEVICE=cuda on a host without a GPU")
        else:
            # Set in the environment, so that every process a test starts inherits it too.
            self.assertEqual(os.environ.get("CUDA_VISIBLE_DEVICES"), "")
            self.assertFalse(torch.cuda.is_available())


if __name__ == "__main__":
    absltest.main()
