"""Tests for t5_training.pretrain_data's record of what a run draws from, and the resume check on it."""
from types import SimpleNamespace

from absl.testing import absltest, parameterized

from t5_training import denoisers, pretrain_data
from t5_training.errors import UsageError

SPAN = {"objective": "span_corruption", "max_seq_length": 128, "noise_density": 0.15, "mean_noise_span_length": 3.0}
PREFIX = {"objective": "prefix_lm", "max_seq_length": 128}
UL2 = denoisers.denoiser_record(denoisers.UL2_DENOISERS, denoisers.UL2_RATES, 512)
NEW_RUN = "; resume with the checkpoint's flags, or start a new run from its weights with --model_name_or_path"


class DrawnFromTest(absltest.TestCase):
    def _config(self, objective, **flags):
        return SimpleNamespace(resolved_objective=objective, max_seq_length=128, noise_density=0.15,
                               mean_noise_span_length=3.0, **flags)

    def test_span_corruption_records_the_flags_that_shape_its_chunks_and_masks(self):
        self.assertEqual(pretrain_data.drawn_from(self._config("span_corruption"), None), SPAN)

    def test_the_prefix_lm_records_its_length(self):
        self.assertEqual(pretrain_data.drawn_from(self._config("prefix_lm"), None), PREFIX)

    def test_ul2_records_its_mixture(self):
        collator = SimpleNamespace(denoisers=denoisers.UL2_DENOISERS, rates=denoisers.UL2_RATES, input_length=512)
        self.assertEqual(pretrain_data.drawn_from(self._config("ul2"), collator), UL2)


class CheckSameObjectiveTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("same_span_corruption", SPAN, dict(SPAN)),
        ("same_prefix_lm", PREFIX, dict(PREFIX)),
        ("same_ul2", UL2, denoisers.denoiser_record(denoisers.UL2_DENOISERS, denoisers.UL2_RATES, 512)),
        # An earlier version recorded nothing for span corruption or the prefix LM: resumed as before.
        ("earlier_version_as_span_corruption", {}, SPAN),
        ("earlier_version_as_prefix_lm", {}, PREFIX))
    def test_resumes(self, saved, now):
        pretrain_data.check_same_objective(saved, now, "ckpt")

    @parameterized.named_parameters(
        # As a checkpoint's JSON gives it back: keys sorted.
        ("span_corruption_as_prefix_lm", dict(sorted(SPAN.items())), PREFIX,
         "checkpoint ckpt was pretrained with --objective span_corruption --max_seq_length 128 --noise_density 0.15 "
         "--mean_noise_span_length 3.0, and this run asks for --objective prefix_lm --max_seq_length 128" + NEW_RUN),
        ("another_length", PREFIX, {**PREFIX, "max_seq_length": 256},
         "checkpoint ckpt was pretrained with --objective prefix_lm --max_seq_length 128, and this run asks for "
         "--objective prefix_lm --max_seq_length 256" + NEW_RUN),
        ("another_noise_density", SPAN, {**SPAN, "noise_density": 0.3},
         "checkpoint ckpt was pretrained with --objective span_corruption --max_seq_length 128 --noise_density 0.15 "
         "--mean_noise_span_length 3.0, and this run asks for --objective span_corruption --max_seq_length 128 "
         "--noise_density 0.3 --mean_noise_span_length 3.0" + NEW_RUN),
        ("span_corruption_as_ul2", SPAN, UL2,
         "checkpoint ckpt was pretrained with --objective span_corruption --max_seq_length 128 --noise_density 0.15 "
         "--mean_noise_span_length 3.0, and this run asks for --objective ul2" + NEW_RUN))
    def test_refuses_in_one_line(self, saved, now, line):
        with self.assertRaisesWithLiteralMatch(UsageError, line):
            pretrain_data.check_same_objective(saved, now, "ckpt")

    @parameterized.named_parameters(
        ("ul2_as_span_corruption", UL2, SPAN, "was pretrained with --objective ul2 (R_3_0.15 "),
        ("ul2_as_prefix_lm", UL2, PREFIX, "and this run has another objective; resume with --objective ul2"),
        ("earlier_version_as_ul2", {}, UL2, "was pretrained with another objective than this run's --objective ul2"),
        ("another_mixture", UL2, denoisers.denoiser_record(denoisers.UL2_DENOISERS, denoisers.UL2_RATES, 256),
         "was pretrained on another mixture of denoisers"))
    def test_a_ul2_side_gets_the_mixtures_message(self, saved, now, said):
        with self.assertRaises(UsageError) as raised:
            pretrain_data.check_same_objective(saved, now, "ckpt")
        self.assertIn(said, str(raised.exception))


if __name__ == "__main__":
    absltest.main()
