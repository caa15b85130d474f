"""Adapters through peft (t5_training.adapters): what trains, what a checkpoint holds, what the exports predict.

Every run starts from one saved tiny model, as a user fine-tunes a pretrained one, so that its
frozen weights can be compared with the file they came from.
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile

import torch
from absl.testing import absltest, parameterized
from peft import AutoPeftModelForSeq2SeqLM, PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM

import fine_tune_t5
from t5_training import adapters, checkpoint, components, modeling, run_dir
from t5_training.config import parse_config
from t5_training.errors import UsageError
from tests import fixtures

# t5-tiny: d_model 128, 4 heads x d_kv 32 = 128 inside attention, d_ff 512, 2 + 2 layers.
D_MODEL, INNER, D_FF = 128, 128, 512
# LoRA adds r x (d_in + d_out) per adapted matrix. With q,k,v,o,wi,wo: an encoder layer has four
# attention matrices of 128 -> 128 and wi, wo of 128 <-> 512; a decoder layer eight attention ones.
ENCODER_LAYER = 4 * (D_MODEL + INNER) + 2 * (D_MODEL + D_FF)
DECODER_LAYER = 8 * (D_MODEL + INNER) + 2 * (D_MODEL + D_FF)
ALL_LINEAR = "q,k,v,o,wi,wo"


def _tiny_model():
    return fixtures.tiny_model()


def _config(*flags):
    return parse_config(fine_tune_t5.FineTuneConfig, ["--config_name", fixtures.TINY_CONFIG, *flags])


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class DefaultLearningRateTest(parameterized.TestCase):
    """An unset --learning_rate under AdamW is the adapter's own rate: AdamW's 3e-4 left LoRA at one label."""

    @parameterized.named_parameters(
        ("full", [], 3e-4),
        ("lora", ["--peft", "lora"], 5e-4),
        ("dora", ["--peft", "lora", "--use_dora"], 1e-3),
        ("ia3", ["--peft", "ia3"], 1e-1),
        ("prompt_tuning", ["--peft", "prompt_tuning"], 3e-1),
        ("adamw_scale", ["--peft", "lora", "--optim", "adamw_scale"], 5e-4),
        ("given", ["--peft", "lora", "--learning_rate", "2e-4"], 2e-4),
        # Adafactor's steps are relative to each weight's scale: T5's 1e-3 stays.
        ("adafactor", ["--peft", "lora", "--optim", "adafactor"], 1e-3),
    )
    def test_resolved_learning_rate(self, flags, expected):
        self.assertEqual(_config(*flags).resolved_learning_rate, expected)


class CountTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("lora_all_linear_r4", ["--peft", "lora", "--lora_r", "4", "--lora_target_modules", ALL_LINEAR],
         4 * (2 * ENCODER_LAYER + 2 * DECODER_LAYER)),
        # The default: every linear layer but the output layer, at r 8.
        ("lora_default_all_linear", ["--peft", "lora"], 8 * (2 * ENCODER_LAYER + 2 * DECODER_LAYER)),
        # q and v (peft's T5 default): 2 per encoder layer, 4 per decoder layer (self and cross).
        ("lora_q_v", ["--peft", "lora", "--lora_target_modules", "q,v"], 8 * (2 * 2 + 2 * 4) * (D_MODEL + INNER)),
        # DoRA adds a magnitude per output of each adapted matrix: q and v both give INNER outputs.
        ("dora_q_v", ["--peft", "lora", "--use_dora", "--lora_target_modules", "q,v"],
         (8 * (D_MODEL + INNER) + INNER) * (2 * 2 + 2 * 4)),
        ("dora_default_all_linear", ["--peft", "lora", "--use_dora"],
         8 * (2 * ENCODER_LAYER + 2 * DECODER_LAYER) + 2 * (5 * D_MODEL + D_FF) + 2 * (9 * D_MODEL + D_FF)),
        # On all six: wi's outputs are D_FF wide, every other matrix's D_MODEL (= INNER here).
        ("dora_all_linear_r4", ["--peft", "lora", "--use_dora", "--lora_r", "4", "--lora_target_modules", ALL_LINEAR],
         4 * (2 * ENCODER_LAYER + 2 * DECODER_LAYER) + 2 * (5 * D_MODEL + D_FF) + 2 * (9 * D_MODEL + D_FF)),
        # IA3 (peft's T5 default k, v, wo): one scale per output of k and v, per input of wo.
        ("ia3_default", ["--peft", "ia3"], 2 * (2 * INNER + D_FF) + 2 * (4 * INNER + D_FF)),
        ("prompt_tuning", ["--peft", "prompt_tuning", "--num_virtual_tokens", "20"], 20 * D_MODEL),
    )
    def test_trainable_parameters_follow_the_formula(self, flags, expected):
        model = adapters.apply(_tiny_model(), _config(*flags), fixtures.tokenizer_dir())
        self.assertEqual(_trainable(model), expected)
        # Only the adapter trains: every base weight is frozen.
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        self.assertTrue(all(any(k in n for k in ("lora_", "ia3_", "prompt_encoder")) for n in trainable), trainable)
        summary = components.model_summary(model).splitlines()
        total = sum(p.numel() for p in model.parameters())
        self.assertEqual(summary[-1], f"trainable: {expected:,} of {total:,} parameters "
                                      f"({100 * expected / total:.2f}%)")

    def test_none_leaves_the_model_as_it_is(self):
        model = _tiny_model()
        self.assertIs(adapters.apply(model, _config()), model)
        self.assertFalse(adapters.is_adapter_model(model))

    @parameterized.named_parameters(
        # The layers listed are those a target may name: T5's output layer is its tied embedding.
        ("missing_target", ["--peft", "lora", "--lora_target_modules", "q,query"],
         "no linear layer named 'query'; it has k, o, q, v, wi, wo$"),
        ("feedforward_outside_targets", ["--peft", "ia3", "--ia3_target_modules", "k,v",
                                         "--ia3_feedforward_modules", "wo"], "must be a subset"),
        ("lora_on_a_tied_output_layer", ["--peft", "lora", "--lora_target_modules", "q,lm_head"],
         r"^--lora_target_modules names lm_head, this model's output layer, which shares its weight with the input "
         r"embedding \(tied, as in T5\), so the merged export would change the embedding too; drop lm_head and name "
         r"only k, o, q, v, wi, wo"),
        ("ia3_on_a_tied_output_layer", ["--peft", "ia3", "--ia3_target_modules", "k,lm_head"],
         "^--ia3_target_modules names lm_head, this model's output layer"),
    )
    def test_bad_targets_are_refused(self, flags, message):
        with self.assertRaisesRegex(UsageError, message):
            adapters.apply(_tiny_model(), _config(*flags))

    @parameterized.named_parameters(("fresh", False), ("pretrained", True))
    def test_lora_on_a_v1_1_merges_exactly(self, pretrained):
        # T5 v1.1: one input embedding, an output layer apart. Loaded from a checkpoint, the model's
        # config once still said "tied", and the merged copy built from it put the embedding in the
        # output layer's place (logits off by about 2.6 here).
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "config.json")
            fixtures.tiny_t5_config(vocab_size=1000, d_model=16, d_ff=32, feed_forward_proj="gated-gelu",
                                    tie_word_embeddings=False).to_json_file(path)
            torch.manual_seed(0)
            model = modeling.load_model(None, path, tokenizer)
            if pretrained:
                model.save_pretrained(folder)
                model = modeling.load_model(folder, None, tokenizer)
        targets = "q,lm_head" if not pretrained else "q"
        model = adapters.apply(model, _config("--peft", "lora", "--lora_target_modules", targets)).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:  # B starts at zero, which would make any merge exact
                    param.normal_(std=0.1)
        merged = adapters.merged_copy(model, model.state_dict()).eval()
        self.assertIsNot(merged.get_output_embeddings().weight, merged.get_input_embeddings().weight)
        self.assertFalse(torch.equal(merged.get_output_embeddings().weight, merged.get_input_embeddings().weight))
        # Its input embeddings stay one matrix, so the export holds it once, not three times.
        self.assertIs(merged.encoder.embed_tokens.weight, merged.shared.weight)
        self.assertIs(merged.decoder.embed_tokens.weight, merged.shared.weight)
        with tempfile.TemporaryDirectory() as folder:
            merged.save_pretrained(folder)
            stored = load_file(os.path.join(folder, "model.safetensors"))
        self.assertEqual(sorted(n for n in stored if "embed" in n or "shared" in n or "lm_head" in n),
                         ["lm_head.weight", "shared.weight"])
        ids = torch.tensor([[5, 6, 7, 1]])
        start = torch.zeros((1, 2), dtype=torch.long)
        with torch.no_grad():
            torch.testing.assert_close(merged(input_ids=ids, decoder_input_ids=start).logits,
                                       model(input_ids=ids, decoder_input_ids=start).logits, rtol=1e-5, atol=1e-5)

    @parameterized.named_parameters(
        ("freezing", ["--peft", "prompt_tuning", "--freeze_encoder"], "--freeze_encoder with --peft prompt_tuning"),
        ("rank", ["--peft", "lora", "--lora_r", "0"], "--lora_r must be >= 1"),
        ("text_without_text", ["--peft", "prompt_tuning", "--prompt_init", "text"], "go together"),
        ("virtual_tokens", ["--peft", "prompt_tuning", "--num_virtual_tokens", "0"], "at least 1"),
        ("dora_without_lora", ["--peft", "ia3", "--use_dora"], "--use_dora is a kind of LoRA: pass it with --peft lora"),
    )
    def test_bad_flags_are_refused(self, flags, message):
        with self.assertRaisesRegex(UsageError, message):
            _config(*flags)


class _SavedBase(fixtures.SavedModelTestCase):
    """A tiny model saved once, which every run fine-tunes."""

    @classmethod
    def args(cls, name, *flags, base=None):
        """The flags of a run into tmp/<name> that fine-tunes `base` (default: the saved model; "random": none)."""
        out = os.path.join(cls.tmp, name)
        args = fixtures.fine_tune_args(out, "--max_steps", "8", "--save_steps", "4", "--eval_steps", "4",
                                       "--learning_rate", "1e-2", *flags)
        if base != "random":
            at = args.index("--config_name")
            args[at:at + 2] = ["--model_name_or_path", base or cls.base]
        return out, args

    def run_fine_tune(self, name, *flags):
        out, args = self.args(name, *flags)
        return out, fine_tune_t5.main(args)

    def dev_batch(self):
        tokenizer = modeling.load_tokenizer(self.base)
        sentences = [f"sst2 sentence: {s}" for s in fixtures.sentences(12)]
        return tokenizer(sentences, return_tensors="pt", padding=True)


class ExportTest(_SavedBase):

    @parameterized.named_parameters(("lora", "lora", ["--lora_target_modules", ALL_LINEAR]), ("ia3", "ia3", []),
                                    ("dora", "lora", ["--use_dora", "--lora_target_modules", ALL_LINEAR]))
    def test_merged_model_predicts_what_the_adapter_predicts(self, method, flags):
        out, _ = self.run_fine_tune(self._testMethodName, "--peft", method, *flags)
        merged = AutoModelForSeq2SeqLM.from_pretrained(os.path.join(out, "final")).eval()
        adapter = PeftModel.from_pretrained(AutoModelForSeq2SeqLM.from_pretrained(self.base),
                                            os.path.join(out, "final", adapters.ADAPTER_DIR)).eval()
        batch = self.dev_batch()
        start = torch.zeros((len(batch["input_ids"]), 1), dtype=torch.long)
        with torch.no_grad():
            torch.testing.assert_close(merged(**batch, decoder_input_ids=start).logits,
                                       adapter(**batch, decoder_input_ids=start).logits, rtol=1e-5, atol=1e-5)
            generated = [m.generate(**batch, max_new_tokens=6, do_sample=False, num_beams=1) for m in (merged, adapter)]
        self.assertTrue(torch.equal(*generated))
        # The adapter trained: the merged model is not the base model.
        base = load_file(os.path.join(self.base, "model.safetensors"))
        final = load_file(os.path.join(out, "final", "model.safetensors"))
        self.assertTrue(any(not torch.equal(base[n], final[n]) for n in base))

    def test_frozen_weights_are_bitwise_unchanged_and_lora_is_exactly_b_a(self):
        # Weight decay acts on what the optimizer holds: the frozen weights must not be among them.
        out, _ = self.run_fine_tune("frozen", "--peft", "lora", "--lora_r", "4", "--lora_alpha", "8",
                                    "--weight_decay", "0.1")
        base = load_file(os.path.join(self.base, "model.safetensors"))
        merged = load_file(os.path.join(out, "final", "model.safetensors"))
        lora = load_file(os.path.join(out, "final", adapters.ADAPTER_DIR, "adapter_model.safetensors"))
        self.assertEqual(merged.keys(), base.keys())
        targeted = 0
        for name, weight in base.items():
            prefix = "base_model.model." + name.removesuffix(".weight")
            if f"{prefix}.lora_A.weight" not in lora:
                self.assertTrue(torch.equal(merged[name], weight), name)
                continue
            targeted += 1
            delta = (8 / 4) * lora[f"{prefix}.lora_B.weight"] @ lora[f"{prefix}.lora_A.weight"]
            self.assertGreater(delta.abs().max().item(), 0, name)
            torch.testing.assert_close(merged[name], weight + delta, rtol=0, atol=1e-6, msg=name)
        # By default every linear layer: 6 per encoder layer, 10 per decoder layer.
        self.assertEqual(targeted, 2 * 6 + 2 * 10)

    def test_checkpoints_hold_the_adapter_and_its_optimizer_state_only(self):
        out, _ = self.run_fine_tune("checkpoint", "--peft", "lora")
        step = checkpoint.checkpoint_dir(out, 8)
        saved = load_file(os.path.join(step, "model.safetensors"))
        self.assertTrue(saved and all("lora_" in name for name in saved), sorted(saved)[:3])
        self.assertEqual(sum(t.numel() for t in saved.values()), 8 * (2 * ENCODER_LAYER + 2 * DECODER_LAYER))
        optimizer = torch.load(os.path.join(step, "optimizer.bin"), weights_only=True)
        moments = [s["exp_avg"].numel() for s in optimizer["state"].values()]
        self.assertEqual(sum(moments), sum(t.numel() for t in saved.values()))
        # The file is those fp32 weights and a header naming them: nothing of the frozen base.
        adapter_bytes = 4 * sum(t.numel() for t in saved.values())
        self.assertBetween(os.path.getsize(os.path.join(step, "model.safetensors")), adapter_bytes,
                           adapter_bytes + 200 * len(saved))
        self.assertIsNotNone(run_dir.read_results(out))
        # The best evaluation's export has the same two forms as final/.
        for name in ("config.json", os.path.join(adapters.ADAPTER_DIR, "adapter_config.json")):
            self.assertTrue(os.path.isfile(os.path.join(out, "best", name)), name)


class RandomBaseTest(_SavedBase):
    """--peft on a randomly initialised model (--config_name alone): a warning, and exports that load with their base."""

    @parameterized.named_parameters(("lora", "lora"), ("prompt_tuning", "prompt_tuning"))
    def test_the_adapter_loads_with_the_base_it_was_trained_on(self, method):
        out, args = self.args(f"random-{method}", "--peft", method, "--max_steps", "2", "--eval_steps", "2",
                              base="random")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            fine_tune_t5.main(args)
        final = os.path.join(out, "final")
        # Loaded from another working directory, the export still finds its base.
        with contextlib.chdir(tempfile.mkdtemp()):
            loaded = AutoPeftModelForSeq2SeqLM.from_pretrained(os.path.join(final, adapters.ADAPTER_DIR)).eval()
        self.assertIn(f"warning: --peft {method} adapts a randomly initialised model", printed.getvalue())
        frozen = AutoModelForSeq2SeqLM.from_pretrained(os.path.join(final, adapters.BASE_DIR))
        # The saved base is the random draw the run trained on: the seed draws it again.
        torch.manual_seed(7)
        drawn = modeling.load_model(None, fixtures.TINY_CONFIG, modeling.load_tokenizer(fixtures.tokenizer_dir()))
        for name, weight in drawn.state_dict().items():
            torch.testing.assert_close(frozen.state_dict()[name], weight, rtol=0, atol=0, msg=name)
        batch = self.dev_batch()
        start = torch.zeros((len(batch["input_ids"]), 1), dtype=torch.long)
        with torch.no_grad():
            logits = loaded(**batch, decoder_input_ids=start).logits
            if method == "lora":  # ... and the merged export computes what the adapter on it computes
                merged = AutoModelForSeq2SeqLM.from_pretrained(final).eval()
                torch.testing.assert_close(merged(**batch, decoder_input_ids=start).logits, logits,
                                           rtol=1e-5, atol=1e-5)
            else:
                self.assertFalse(torch.allclose(frozen.eval()(**batch, decoder_input_ids=start).logits, logits))


class FeaturesTest(_SavedBase):

    def test_accumulation_length_grouping_scoring_and_checkpointing_work_with_lora(self):
        # alpha = r (a scale of 1, not the default 8): Adam turns the gradients' rounding differences
        # into steps of about the learning rate, which alpha / r then multiplies, and the losses
        # below are compared to 1e-5.
        flags = ["--peft", "lora", "--lora_alpha", "8", "--gradient_accumulation_steps", "2", "--group_by_length",
                 "--eval_decoding", "score", "--early_stopping_patience", "1", "--auto_find_batch_size",
                 "--dropout_rate", "0.1"]
        plain, _ = self.run_fine_tune("plain", *flags)
        checkpointed, results = self.run_fine_tune("checkpointed", *flags, "--gradient_checkpointing")
        # Non-reentrant checkpointing recomputes the forward with the same dropout masks; only the
        # order of float sums in the gradients differs.
        expected, got = run_dir.read_losses(plain), run_dir.read_losses(checkpointed)
        self.assertLen(expected, 8)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=0)
        self.assertIn("accuracy", results["eval"])

    def test_non_finite_steps_leave_the_adapter_unchanged(self):
        with fixtures.nan_on_steps({3, 4}):
            out, _ = self.run_fine_tune("nonfinite", "--peft", "lora", "--save_steps", "1", "--save_total_limit",
                                        "0", "--max_nonfinite_steps", "3")
        weights = [load_file(os.path.join(checkpoint.checkpoint_dir(out, s), "model.safetensors")) for s in (2, 4)]
        self.assertTrue(all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0]))


if __name__ == "__main__":
    absltest.main()
