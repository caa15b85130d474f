"""Evaluation by label scoring gives greedy generation's exact predictions, faster.

A tiny T5 is fine-tuned briefly on real SST-2 rows (with length-grouped batches), so that most
dev rows follow a label candidate; a fresh random model makes the opposite case, where most
rows fall back to generation. Both are checked row by row against HF `generate` run on each
row alone, unpadded: an independent reference for greedy decoding.
"""
import csv
import math
import os
import tempfile
import warnings
from unittest import mock

import torch
from absl.testing import absltest, parameterized
from accelerate import Accelerator
from accelerate.utils import DistributedType

import fine_tune_t5
from t5_training import adapters, batching, data, evaluation, modeling
from t5_training.config import parse_config
from t5_training.errors import UsageError
from t5_training.modeling import load_tokenizer_and_model
from t5_training.tasks import get_entry
from tests import fixtures

EVAL_ROWS = 160


def _config(*extra):
    return parse_config(fine_tune_t5.FineTuneConfig,
                        fixtures.fine_tune_args("unused", "--max_eval_samples", str(EVAL_ROWS), *extra))


class ScoreEqualsGreedyTest(parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.trained = os.path.join(cls.tmp.name, "run")
        # 40 steps of 32 rows: enough for a label word on every row, of both classes (160 rows: 128
        # positive, 32 negative, none generated past the candidates, on 2026-11-26's main).
        fine_tune_t5.main(fixtures.fine_tune_args(
            cls.trained, "--max_train_samples", "3000", "--max_steps", "40", "--per_device_train_batch_size", "32",
            "--dropout_rate", "0", "--max_eval_samples", "32", "--group_by_length", "--eval_decoding", "score",
        ))
        # The run's accelerate state (a GPU's, in the CUDA subset) would refuse the tests'
        # Accelerator(cpu=True); conftest resets it only after each test, and this ran before the first.
        fixtures.reset_accelerate_state()
        cls.entry = get_entry("glue", "sst2")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    def _decode(self, model_flags, decoding):
        config = _config(*model_flags)
        torch.manual_seed(0)  # the random model's weights
        tokenizer, model = load_tokenizer_and_model(config)
        model.eval()
        accelerator = Accelerator(cpu=True)
        task = data.build_task_data(self.entry, config, tokenizer, log=lambda *_: None)
        _, loaders = data.build_loaders(task, config, tokenizer, model.config.decoder_start_token_id)
        candidates = (evaluation.label_candidates(self.entry, tokenizer, config.max_target_length)
                      if decoding == "score" else None)
        decoder = evaluation.GreedyDecoder(accelerator, tokenizer, task.max_target_tokens, candidates)
        out = evaluation.decode_split(accelerator, model, loaders["validation"], tokenizer, EVAL_ROWS, decoder)
        return out, decoder, task, tokenizer, model

    def _reference(self, task, tokenizer, model):
        """Greedy generation one row at a time, without padding, in the split's original row order."""
        ds = task.evals["validation"]
        predictions = [None] * len(ds)
        with torch.no_grad():
            for idx, ids in zip(ds["idx"], ds["input_ids"]):
                out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=task.max_target_tokens,
                                     num_beams=1, do_sample=False)
                predictions[idx] = tokenizer.decode(out[0], skip_special_tokens=True).lstrip()
        return predictions

    @parameterized.named_parameters(
        # Trained: nearly every row follows a candidate, so scoring does the work.
        ("trained", "trained", 0, EVAL_ROWS // 10),
        # Random weights: rows that follow no label are generated; the mix must still be exact.
        ("random", "random", 1, EVAL_ROWS),
    )
    def test_predictions_equal_greedy_generation(self, which, least_generated, most_generated):
        flags = (["--model_name_or_path", os.path.join(self.trained, "final")] if which == "trained" else [])
        scored, decoder, task, tokenizer, model = self._decode(flags, "score")
        generated, _, _, _, _ = self._decode(flags, "generate")
        reference = self._reference(task, tokenizer, model)
        self.assertEqual(scored.predictions, reference)
        self.assertEqual(generated.predictions, reference)
        self.assertBetween(decoder.generated_rows, least_generated, most_generated)
        # The loss comes from the same teacher-forced pass either way.
        self.assertAlmostEqual(scored.loss, generated.loss, places=5)
        if which == "trained":
            labels = set(self.entry.label_words)
            self.assertGreater(sum(p in labels for p in scored.predictions), 0.9 * EVAL_ROWS)
            self.assertGreater(len(set(scored.predictions)), 1, "a model that predicts one class tests little")

    def test_trained_run_used_scoring_and_wrote_predictions(self):
        with open(os.path.join(self.trained, "predictions_validation.tsv"), encoding="utf-8") as f:
            self.assertLen(f.read().splitlines(), 33)


class NoLabelCountTest(parameterized.TestCase):
    """The evaluator counts the dev outputs that name no label, per split, beside the metrics."""

    @parameterized.named_parameters(("sst2", "sst2", "SST-2"), ("stsb", "stsb", "STS-B"))
    def test_results_count_the_outputs_that_name_no_label(self, task, folder):
        entry = get_entry("glue", task)
        config = _config("--dataset_name", task, "--data_dir", os.path.join(fixtures.glue_dir(), folder))
        torch.manual_seed(0)  # random weights: few if any outputs are a label
        tokenizer, model = load_tokenizer_and_model(config)
        model.eval()
        task_data = data.build_task_data(entry, config, tokenizer, log=lambda *_: None)
        _, loaders = data.build_loaders(task_data, config, tokenizer, model.config.decoder_start_token_id)
        with tempfile.TemporaryDirectory() as out:
            results = evaluation.make_generation_evaluator(Accelerator(cpu=True), entry, task_data, loaders, tokenizer,
                                                           out)(model)
            with open(os.path.join(out, "predictions_validation.tsv"), encoding="utf-8") as f:
                outputs = [row["prediction"] for row in csv.DictReader(f, delimiter="\t")]
        expected = sum(not _is_label(entry, text) for text in outputs)
        self.assertGreater(expected, 0)
        self.assertEqual((results["no_label"], results["no_label_share"]), (expected, expected / len(outputs)))


def _is_label(entry, text: str) -> bool:
    """Whether an output names a label, worked out here: a label word, or for a score a finite number."""
    if entry.kind == "regression":
        try:
            return math.isfinite(float(text))
        except ValueError:
            return False
    return text in entry.label_words


class CandidateBlocksTest(parameterized.TestCase):
    """Candidates laid end to end in one decoder sequence give the logits of each decoded alone."""

    @parameterized.parameters("sdpa", "eager")
    def test_blocks_equal_separate_sequences(self, attention):
        from transformers import AutoConfig, T5ForConditionalGeneration

        config = AutoConfig.from_pretrained(fixtures.TINY_CONFIG, vocab_size=64)
        config._attn_implementation = attention
        torch.manual_seed(0)
        model = T5ForConditionalGeneration(config).eval()
        rows, k, width = 3, 3, 4
        candidates = torch.tensor([[5, 6, 7, 1], [8, 1, -100, -100], [9, 10, 1, -100]])
        mask = torch.tensor([[1] * 9, [1] * 5 + [0] * 4, [1] * 7 + [0] * 2])
        input_ids = torch.randint(2, 64, (rows, 9)) * mask
        decoder_input_ids = batching.shift_right(candidates.repeat(rows, 1), 0, 0)
        with torch.no_grad():
            encoded = model.get_encoder()(input_ids=input_ids, attention_mask=mask).last_hidden_state
            separate = model(encoder_outputs=(encoded.repeat_interleave(k, dim=0),),
                             attention_mask=mask.repeat_interleave(k, dim=0), decoder_input_ids=decoder_input_ids).logits
            with warnings.catch_warnings():
                # transformers' deprecations: a renamed keyword warns first and fails a few releases later.
                warnings.simplefilter("error", FutureWarning)
                blocks_mask = evaluation.candidate_blocks_mask(model, k, width)
            blocks = model(encoder_outputs=(encoded,), attention_mask=mask,
                           decoder_input_ids=decoder_input_ids.view(rows, k * width),
                           decoder_attention_mask=blocks_mask).logits
            # Without the mask, later candidates would see earlier ones: the check can fail.
            unmasked = model(encoder_outputs=(encoded,), attention_mask=mask,
                             decoder_input_ids=decoder_input_ids.view(rows, k * width)).logits
        torch.testing.assert_close(blocks.view(rows * k, width, -1), separate, rtol=1e-5, atol=1e-5)
        self.assertGreater(float((unmasked.view(rows * k, width, -1) - separate).abs().max()), 1e-3)


class CompiledModelTest(absltest.TestCase):
    def test_a_compiled_prompt_tuned_model_decodes_with_its_prompt(self):
        # --torch_compile wraps the model; evaluation must still see the peft model underneath, or
        # a prompt-tuned model would be decoded without its prompt. (Wrapping compiles nothing yet:
        # evaluation runs the model beneath the wrapper, so the test costs no compile time.)
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        torch.manual_seed(0)
        model = modeling.load_model(None, fixtures.TINY_CONFIG, tokenizer)
        config = parse_config(fine_tune_t5.FineTuneConfig, fixtures.fine_tune_args(
            "unused", "--peft", "prompt_tuning", "--num_virtual_tokens", "4"))
        model = adapters.apply(model, config, log=lambda *_: None).eval()
        torch.nn.init.normal_(model.prompt_encoder.default.embedding.weight, std=5.0)  # a prompt that matters
        ids = torch.tensor([[5, 9, 13, 1], [7, 11, 1, 0]])
        batch = {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": torch.tensor([[4, 1], [6, 1]]),
                 "decoder_input_ids": torch.tensor([[0, 4], [0, 6]])}
        decoder = evaluation.GreedyDecoder(Accelerator(cpu=True), tokenizer, 4, None)
        with torch.no_grad():
            plain = decoder(model, batch)
            compiled = decoder(torch.compile(model, backend="aot_eager"), batch)
            unprompted = decoder(adapters.base_model(model), batch)
        for want, got in zip(plain, compiled):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        self.assertFalse(torch.equal(plain[1], unprompted[1]), "the prompt changes the loss, so the check can fail")


class ResolveDecodingTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("classification_auto", "sst2", "auto", "score"),
        ("classification_generate", "cola", "generate", "generate"),
        ("regression_auto", "stsb", "auto", "generate"),
    )
    def test_choice(self, task, requested, expected):
        accelerator = Accelerator(cpu=True)
        self.assertEqual(evaluation.resolve_decoding(requested, get_entry("glue", task), accelerator), expected)

    @parameterized.named_parameters(
        ("zero3", DistributedType.DEEPSPEED, 3), ("fsdp", DistributedType.FSDP, None))
    def test_with_sharded_weights_classification_is_generated(self, distributed_type, zero_stage):
        # Every process must run the same forward passes (sharding.shards_weights): no scoring.
        accelerator = mock.Mock(distributed_type=distributed_type)
        accelerator.state.deepspeed_plugin.zero_stage = zero_stage
        self.assertEqual(evaluation.resolve_decoding("auto", get_entry("glue", "sst2"), accelerator), "generate")
        with self.assertRaisesRegex(UsageError, r"^--eval_decoding score scores label candidates, which does not "
                                                r"work with sharded weights \(ZeRO-3, FSDP\); use --eval_decoding "
                                                r"generate"):
            evaluation.resolve_decoding("score", get_entry("glue", "sst2"), accelerator)

    def test_score_refused_for_regression(self):
        with self.assertRaisesRegex(UsageError, "regression task.*--eval_decoding generate"):
            evaluation.resolve_decoding("score", get_entry("glue", "stsb"), Accelerator(cpu=True))

    def test_label_candidates_are_training_targets(self):
        config = _config()
        tokenizer, _ = load_tokenizer_and_model(config)
        entry = get_entry("glue", "sst2")
        candidates = evaluation.label_candidates(entry, tokenizer, max_target_length=8)
        for row, word in zip(candidates.tolist(), entry.label_words):
            ids = [t for t in row if t != -100]
            self.assertEqual(ids, tokenizer(word)["input_ids"])
            self.assertEqual(ids[-1], tokenizer.eos_token_id)
        cut = evaluation.label_candidates(entry, tokenizer, max_target_length=2)
        self.assertEqual(cut.shape[1], 2)
        self.assertTrue((cut[:, 1] == tokenizer.eos_token_id).all())



class DecodeTextsTest(absltest.TestCase):
    """Decoded outputs as T5's SentencePiece decode gives them: its label matching sees every space."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        import sentencepiece
        from transformers import AutoTokenizer

        cls.tok = AutoTokenizer.from_pretrained(fixtures.tokenizer_dir())
        cls.sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(fixtures.tokenizer_dir(), "spiece.model"))

    def test_a_trailing_space_stays_and_a_leading_one_goes_as_in_sentencepiece(self):
        pieces = [["▁positive", "▁"], ["▁", "▁positive"], ["▁positive", "</s>"]]
        ids = torch.tensor([[self.sp.piece_to_id(p) for p in row] for row in pieces])
        self.assertEqual(evaluation.decode_texts(self.tok, ids), ["positive ", "positive", "positive"])

    def test_random_rows_decode_as_sentencepiece_does(self):
        rng, space = torch.Generator().manual_seed(0), self.sp.piece_to_id("▁")
        rows = torch.randint(3, self.sp.get_piece_size(), (500, 6), generator=rng)
        rows[::3, 0], rows[::4, -1] = space, space  # spaces at either end
        self.assertEqual(evaluation.decode_texts(self.tok, rows), [self.sp.decode(row) for row in rows.tolist()])


if __name__ == "__main__":
    absltest.main()
