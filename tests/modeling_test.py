"""Freezing components, the start-of-run model summary, and gradient checkpointing."""
import copy
import json
import os
import re
import shutil
import tempfile
from types import SimpleNamespace
from unittest import mock

import torch
from absl.testing import absltest, parameterized
from transformers import T5Config, T5ForConditionalGeneration

import fine_tune_t5
from t5_training import model_sources, modeling
from t5_training.errors import UsageError
from tests import fixtures


_TINY_SHAPE = {**fixtures.TINY_T5_SHAPE, "dropout_rate": 0.0}


class LoadErrorsTest(parameterized.TestCase):
    """A typo in a local path, or a shape no model can have, is one line before anything loads."""

    @parameterized.named_parameters(
        ("config_file", None, "configs/t5-tinyy.json", "--config_name 'configs/t5-tinyy.json': no such file or folder"),
        ("absolute_folder", "/nonexistent/run/final", None,
         "--model_name_or_path '/nonexistent/run/final': no such file or folder"),
        ("three_folders_deep", "runs/pt/finall", None, "--model_name_or_path 'runs/pt/finall': no such file or folder"))
    def test_a_missing_local_path_is_named_without_asking_the_hub(self, model, config, said):
        with mock.patch("transformers.AutoConfig.from_pretrained") as hub, \
                mock.patch("transformers.AutoModelForSeq2SeqLM.from_pretrained") as hub_model:
            with self.assertRaisesRegex(UsageError, "^" + re.escape(said) + r"; check the path \(a hub name has the "
                                                                          r"form 'name' or 'org/name'\)$"):
                modeling.load_model(model, config, None)
        hub.assert_not_called()
        hub_model.assert_not_called()

    def test_a_checkpoint_or_a_run_folder_is_named_for_what_it_is(self):
        # Neither has a config.json, so transformers would answer "Unrecognized model".
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        with tempfile.TemporaryDirectory() as out:
            fine_tune_t5.main(fixtures.fine_tune_args(out, "--max_steps", "2", "--save_steps", "2"))
            step = os.path.join(out, "step-000002")
            with self.assertRaisesWithLiteralMatch(
                    UsageError, f"--model_name_or_path {step!r} is a training checkpoint, not a model: continue its "
                                "run with --resume_from_checkpoint and that run's --output_dir, or start from the "
                                "run's final/ or best/ folder"):
                modeling.load_model(step, None, tokenizer)
            with self.assertRaisesWithLiteralMatch(
                    UsageError, f"--model_name_or_path {out!r} is a run's output folder, not a model: pass its final/ "
                                f"or best/ folder, e.g. {os.path.join(out, 'final')}"):
                modeling.load_model(out, None, tokenizer)
            with self.assertRaisesRegex(UsageError, "^tokenizer .* is a training checkpoint"):
                modeling.load_tokenizer(step)
            self.assertIsInstance(modeling.load_model(os.path.join(out, "final"), None, tokenizer),
                                  T5ForConditionalGeneration)

    def test_a_missing_tokenizer_folder_is_named(self):
        with self.assertRaisesRegex(UsageError, "^tokenizer '/nonexistent/tok': no such file or folder"):
            modeling.load_tokenizer("/nonexistent/tok")

    @parameterized.named_parameters(
        ("zero_width", {"d_model": 0}, "d_model is 0"),
        ("no_heads", {"num_heads": 0}, "num_heads is 0"),
        ("negative_layers", {"num_layers": -1}, "num_layers is -1"))
    def test_a_shape_with_a_size_below_one_is_refused(self, values, said):
        path = self._shape(values)
        with self.assertRaisesWithLiteralMatch(UsageError, f"--config_name {path}: {said}; it must be a whole "
                                                           "number of at least 1"):
            modeling.load_model(None, path, modeling.load_tokenizer(fixtures.tokenizer_dir()))

    def test_a_field_of_another_type_is_one_line(self):
        # transformers 5 refuses it itself, with an error that is neither OSError nor ValueError.
        path = self._shape({"d_ff": 1.5})
        with self.assertRaisesRegex(UsageError, f"^could not load model {re.escape(repr(path))}: Validation error "
                                                "for field 'd_ff': .*expected int, got float \\(value: 1.5\\)$"):
            modeling.load_model(None, path, modeling.load_tokenizer(fixtures.tokenizer_dir()))

    def test_no_model_named_is_one_line(self):
        with self.assertRaisesWithLiteralMatch(UsageError, "no model: pass --model_name_or_path (pretrained) or "
                                                           "--config_name (from scratch)"):
            modeling.load_model(None, None, None)

    def test_a_config_that_does_not_parse_is_named_with_its_first_line(self):
        path = self._shape({})
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"model_type": "t5",\n "d_model": }')
        with self.assertRaisesRegex(UsageError, f"^could not load model {re.escape(repr(path))}: It looks like the "
                                                r"config file at .* is not a valid JSON file\.$"):
            modeling.load_model(None, path, None)

    def test_a_tokenizer_larger_than_the_model_is_refused(self):
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        model = fixtures.tiny_model()
        with tempfile.TemporaryDirectory() as folder:
            model.resize_token_embeddings(len(tokenizer))
            model.save_pretrained(folder)
            self.assertEqual(modeling.load_model(folder, None, tokenizer).config.vocab_size, len(tokenizer))
            model.resize_token_embeddings(len(tokenizer) - 1)
            model.save_pretrained(folder)
            with self.assertRaisesWithLiteralMatch(
                    UsageError, f"the tokenizer has {len(tokenizer)} tokens but the model only {len(tokenizer) - 1} "
                                "embeddings; use the tokenizer the model was trained with"):
                modeling.load_model(folder, None, tokenizer)

    def test_a_fresh_model_is_sized_and_labelled_by_its_tokenizer(self):
        # The vocabulary rounded up to a multiple of 8; pad, EOS and the decoder's start from the tokenizer.
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        config = modeling.load_model(None, fixtures.TINY_CONFIG, tokenizer).config
        self.assertEqual(config.vocab_size, -(-len(tokenizer) // 8) * 8)
        self.assertEqual(config.vocab_size % 8, 0)
        self.assertLess(config.vocab_size - len(tokenizer), 8)
        self.assertEqual((config.pad_token_id, config.eos_token_id, config.decoder_start_token_id),
                         (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id))

    def _shape(self, values):
        """configs/t5-tiny.json with `values` changed, in a file of its own."""
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder)
        path = os.path.join(folder, "shape.json")
        with open(fixtures.TINY_CONFIG, encoding="utf-8") as f:
            shape = json.load(f)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**shape, **values}, f)
        return path

    def test_the_shipped_shapes_pass(self):
        for name in ("t5-tiny", "t5-small", "t5-v1_1-base"):
            model_sources.check_shape(T5Config.from_pretrained(model_sources.resolve_config_name(name)), name)

    def test_no_tokenizer_or_one_that_does_not_load_is_one_line(self):
        with self.assertRaisesWithLiteralMatch(UsageError, "no tokenizer: pass --tokenizer_name (a folder from "
                                                           "`python -m t5_training.tokenizer` or a hub name) or "
                                                           "--model_name_or_path"):
            modeling.load_tokenizer(None)
        folder = os.path.dirname(self._shape({}))  # a folder, but one that holds no tokenizer
        with self.assertRaisesRegex(UsageError, f"^could not load tokenizer {re.escape(repr(folder))}: \\S"):
            modeling.load_tokenizer(folder)

    def test_a_fresh_model_takes_transformers_build_options(self):
        config = T5Config(**_TINY_SHAPE)
        for attention in ("eager", "sdpa"):
            self.assertEqual(modeling.fresh_model(config, attn_implementation=attention).config._attn_implementation,
                             attention)


class LengthsTest(absltest.TestCase):
    """Lengths beyond a model's absolute position embeddings are refused (T5 has none)."""

    def test_a_model_with_absolute_positions_refuses_longer_inputs(self):
        from transformers import BartConfig, BartForConditionalGeneration

        model = BartForConditionalGeneration(BartConfig(vocab_size=50, d_model=8, encoder_layers=1, decoder_layers=1,
                                                        encoder_attention_heads=2, decoder_attention_heads=2,
                                                        encoder_ffn_dim=16, decoder_ffn_dim=16,
                                                        max_position_embeddings=64))
        modeling.check_lengths(model, max_source_length=64, max_target_length=8)
        with self.assertRaisesWithLiteralMatch(UsageError, "--max_source_length 65 is longer than this model's 64 "
                                                           "position embeddings; use --max_source_length 64 or less"):
            modeling.check_lengths(model, max_target_length=8, max_source_length=65)
        # GPT-2-style configs name the limit n_positions.
        model = SimpleNamespace(config=SimpleNamespace(n_positions=32))
        with self.assertRaisesRegex(UsageError, "^--max_seq_length 33 is longer than this model's 32"):
            modeling.check_lengths(model, max_seq_length=33)

    def test_t5_takes_any_length(self):
        modeling.check_lengths(fixtures.tiny_t5(), max_source_length=100_000, max_target_length=100_000)


class GradientCheckpointingTest(absltest.TestCase):
    def test_same_gradients_as_without(self):
        plain, checkpointed = fixtures.tiny_t5(), fixtures.tiny_t5()
        modeling.enable_activation_checkpointing(checkpointed)
        for model in (plain, checkpointed):
            model.train()
            model(**fixtures.tiny_t5_batch()).loss.backward()
        for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters()):
            torch.testing.assert_close(a.grad, b.grad, msg=name)

    def test_blocks_train_below_frozen_embeddings(self):
        # Checkpointed blocks get gradients only if an input carries one: with frozen embeddings
        # none does, unless the checkpointing is of the kind that needs none (or a hook adds one).
        model = fixtures.tiny_t5().train()
        modeling.enable_activation_checkpointing(model)  # in load_tokenizer_and_model's order
        modeling.freeze(model, embeddings=True)
        model(**fixtures.tiny_t5_batch()).loss.backward()
        self.assertGreater(float(model.encoder.block[0].layer[0].SelfAttention.q.weight.grad.abs().sum()), 0)

    def test_non_reentrant_through_the_method_this_transformers_has(self):
        # transformers renamed the method within 5.x; the newer name is used where both exist.
        calls = []
        both = SimpleNamespace(activation_checkpointing_enable=lambda **kw: calls.append(("new", kw)),
                               gradient_checkpointing_enable=lambda **kw: calls.append(("old", kw)))
        modeling.enable_activation_checkpointing(both)
        older = SimpleNamespace(gradient_checkpointing_enable=both.gradient_checkpointing_enable)
        modeling.enable_activation_checkpointing(older)
        self.assertEqual(calls, [("new", {"activation_checkpointing_kwargs": {"use_reentrant": False}}),
                                 ("old", {"gradient_checkpointing_kwargs": {"use_reentrant": False}})])

    def test_the_model_flags_are_applied_where_the_model_is_loaded(self):
        from t5_training.config import parse_config

        config = parse_config(fine_tune_t5.FineTuneConfig, fixtures.fine_tune_args(
            "unused", "--dropout_rate", "0.3", "--freeze_decoder", "--gradient_checkpointing"))
        tokenizer, model = modeling.load_tokenizer_and_model(config)
        self.assertEqual(tokenizer.name_or_path, fixtures.tokenizer_dir())
        self.assertEqual(model.config.dropout_rate, 0.3)
        self.assertTrue(model.is_gradient_checkpointing)
        self.assertFalse(any(p.requires_grad for p in model.decoder.block.parameters()))
        self.assertTrue(all(p.requires_grad for p in model.encoder.parameters()))

    def test_run_with_flag_equals_run_without(self):
        # Dropout is on: recomputation must replay the same dropout masks.
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            plain = fine_tune_t5.main(fixtures.fine_tune_args(a, "--max_steps", "3"))
            checkpointed = fine_tune_t5.main(fixtures.fine_tune_args(b, "--max_steps", "3",
                                                                     "--gradient_checkpointing"))
            self.assertAlmostEqual(plain["train"]["train_loss"], checkpointed["train"]["train_loss"],
                                   delta=fixtures.same_computation(1e-6) * checkpointed["train"]["train_loss"])


class OutputLayerTest(absltest.TestCase):
    """A fresh T5 v1.1 (tie_word_embeddings false) gets an output layer of its own, drawn as Google's
    T5 draws it (modeling.untie_output_layer), where transformers 5 would share the embedding."""

    def _load(self, **overrides):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "config.json")
            T5Config(**{**_TINY_SHAPE, "d_model": 64, **overrides}).to_json_file(path)
            torch.manual_seed(0)
            return modeling.load_model(None, path, modeling.load_tokenizer(fixtures.tokenizer_dir()))

    def test_a_v1_1_output_layer_is_apart_and_drawn_at_google_scale(self):
        model = self._load(tie_word_embeddings=False, feed_forward_proj="gated-gelu")
        head, shared = model.lm_head.weight, model.shared.weight
        self.assertIsNot(head, shared)
        # The input embeddings stay one matrix, as in every T5.
        self.assertIs(model.encoder.embed_tokens.weight, shared)
        self.assertIs(model.decoder.embed_tokens.weight, shared)
        self.assertFalse(model.config.scale_decoder_outputs)
        # Truncated at 2 std, std 64 ** -0.5 = 0.125: a truncated normal's std is 0.880 of that.
        self.assertLessEqual(head.abs().max().item(), 2 * 0.125)
        self.assertAlmostEqual(head.std().item(), 0.880 * 0.125, delta=0.005)
        self.assertAlmostEqual(shared.std().item(), 1.0, delta=0.02)
        # So the first loss is about ln(vocabulary), where the shared std-1 matrix gives several times it.
        batch = {"input_ids": torch.randint(2, 999, (4, 16)), "labels": torch.randint(2, 999, (4, 8))}
        vocabulary = torch.log(torch.tensor(float(model.config.vocab_size))).item()
        self.assertLess(abs(model(**batch).loss.item() - vocabulary), 0.5)
        as_transformers_builds_it = T5ForConditionalGeneration(T5Config(**{**model.config.to_dict(),
                                                                         "tie_word_embeddings": False}))
        self.assertIs(as_transformers_builds_it.lm_head.weight, as_transformers_builds_it.shared.weight)
        self.assertGreater(as_transformers_builds_it(**batch).loss.item(), 2 * vocabulary)

    def test_a_v1_1_model_saves_and_loads_with_its_output_layer_apart(self):
        model = self._load(tie_word_embeddings=False)
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            reloaded = T5ForConditionalGeneration.from_pretrained(folder)
        self.assertIsNot(reloaded.lm_head.weight, reloaded.shared.weight)
        self.assertFalse(reloaded.config.scale_decoder_outputs)
        for name, value in model.state_dict().items():
            torch.testing.assert_close(reloaded.state_dict()[name], value, rtol=0, atol=0, msg=name)

    def test_a_loaded_v1_1_keeps_its_output_layer_and_says_so_in_its_export(self):
        # Google's v1.1 checkpoints and this project's exports of them load with their output
        # layer apart; the config must say so, or tie_weights() (FSDP2 loading calls it) would put
        # the embedding in its place and the next export would tell transformers 4 to tie them.
        fresh = self._load(tie_word_embeddings=False, feed_forward_proj="gated-gelu")
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as second:
            fresh.save_pretrained(first)
            loaded = modeling.load_model(first, None, tokenizer)
            self.assertFalse(loaded.config.tie_word_embeddings)
            loaded.tie_weights()
            self.assertIsNot(loaded.lm_head.weight, loaded.shared.weight)
            torch.testing.assert_close(loaded.lm_head.weight, fresh.lm_head.weight, rtol=0, atol=0)
            loaded.save_pretrained(second)
            with open(os.path.join(second, "config.json"), encoding="utf-8") as saved:
                self.assertIs(json.load(saved)["tie_word_embeddings"], False)
            again = modeling.load_model(second, None, tokenizer)
        self.assertFalse(again.config.scale_decoder_outputs)
        self.assertIsNot(again.lm_head.weight, again.shared.weight)
        self.assertFalse(modeling.record_output_layer(again))

    def test_a_loaded_t5_1_0_stays_tied(self):
        fresh = self._load()
        with tempfile.TemporaryDirectory() as folder:
            fresh.save_pretrained(folder)
            loaded = modeling.load_model(folder, None, modeling.load_tokenizer(fixtures.tokenizer_dir()))
        self.assertTrue(loaded.config.tie_word_embeddings)
        self.assertIs(loaded.lm_head.weight, loaded.shared.weight)

    def test_the_callers_config_is_left_as_it_was(self):
        # A second model, or the memory estimator's meta model, built from the same config after a
        # first must have the same layout: one input embedding, an output layer apart.
        from t5_training.tools import memory

        config = T5Config(**_TINY_SHAPE, tie_word_embeddings=False)
        modeling.fresh_model(config)
        self.assertTrue(config.tie_word_embeddings)
        shapes = memory.parameter_shapes(config)
        self.assertIn("lm_head.weight", shapes)
        self.assertNotIn("encoder.embed_tokens.weight", shapes)

    def test_another_encoder_decoder_keeps_its_tied_output_layer(self):
        # A config without T5's scale_decoder_outputs (BART's) is read by its tie_word_embeddings.
        from transformers import BartConfig

        model = modeling.fresh_model(BartConfig(vocab_size=50, d_model=8, encoder_layers=1, decoder_layers=1,
                                                encoder_attention_heads=2, decoder_attention_heads=2,
                                                encoder_ffn_dim=16, decoder_ffn_dim=16))
        self.assertIs(model.get_output_embeddings().weight, model.get_input_embeddings().weight)
        self.assertFalse(modeling.untie_output_layer(model))

    def test_its_scale_follows_initializer_factor_and_an_apart_layer_is_left_alone(self):
        model = self._load(tie_word_embeddings=False, initializer_factor=2.0)
        # std 2.0 * 64 ** -0.5 = 0.25, truncated at 2 std.
        self.assertAlmostEqual(model.lm_head.weight.std().item(), 0.880 * 0.25, delta=0.01)
        self.assertLessEqual(model.lm_head.weight.abs().max().item(), 0.5)
        head = model.lm_head.weight
        self.assertFalse(modeling.untie_output_layer(model))
        self.assertIs(model.lm_head.weight, head)

    def test_it_unties_in_the_model_s_own_dtype_and_device_and_stays_untied(self):
        config = T5Config(**_TINY_SHAPE, tie_word_embeddings=False)
        for device, dtype in (("cpu", torch.bfloat16), ("meta", torch.float32)):
            with self.subTest(device=device):
                with torch.device(device):
                    model = T5ForConditionalGeneration(copy.deepcopy(config)).to(dtype)
                # Outside the context, which would put any new tensor on its device: the layer follows the model.
                self.assertTrue(modeling.untie_output_layer(model))
                self.assertEqual((model.lm_head.weight.dtype, model.lm_head.weight.device.type), (dtype, device))
                self.assertIs(model.config.tie_word_embeddings, False)
        model.tie_weights()  # what FSDP2's loading calls
        self.assertIsNot(model.lm_head.weight, model.shared.weight)

    def test_a_loaded_model_s_flag_is_set_only_where_its_layers_are_apart(self):
        model = T5ForConditionalGeneration(T5Config(**_TINY_SHAPE))
        self.assertFalse(modeling.record_output_layer(model))  # tied: the flag stays True
        self.assertTrue(model.config.tie_word_embeddings)
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
        self.assertTrue(modeling.record_output_layer(model))
        self.assertIs(model.config.tie_word_embeddings, False)

    def test_a_t5_1_0_model_keeps_one_scaled_matrix(self):
        model = self._load()
        self.assertIs(model.lm_head.weight, model.shared.weight)
        self.assertTrue(model.config.scale_decoder_outputs)
        self.assertFalse(modeling.untie_output_layer(model))


class FusedGeluTest(absltest.TestCase):
    """load_model runs T5 v1.1's gelu_new as one kernel (modeling.fuse_gelu): the same function,
    fewer tensors kept for backward, and nothing about the model as saved changes."""

    def _v1_1_and_transformers_own(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "v1_1.json")
            fixtures.tiny_t5_config(feed_forward_proj="gated-gelu", d_ff=48, num_layers=2, num_decoder_layers=2,
                                    tie_word_embeddings=False).to_json_file(path)
            torch.manual_seed(0)
            fused = modeling.load_model(None, path, modeling.load_tokenizer(fixtures.tokenizer_dir()))
        # The same model with transformers' own GELU modules put back.
        plain = copy.deepcopy(fused)
        modeling.unfuse_gelu(plain)
        return fused.train(), plain.train()

    @staticmethod
    def _loss_grads_and_saved_bytes(model):
        torch.manual_seed(1)  # one dropout mask for both models
        saved = {}

        def keep(tensor):
            saved[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            loss = model(**fixtures.tiny_t5_batch()).loss
        loss.backward()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, sum(
            size for pointer, size in saved.items() if pointer not in params)

    def test_same_loss_and_gradients_as_transformers_with_fewer_saved_activations(self):
        fused, plain = self._v1_1_and_transformers_own()
        # Two blocks a side, one gated GELU each; transformers' modules are all gone.
        self.assertEqual(sum(isinstance(m, torch.nn.GELU) for m in fused.modules()), 4)
        self.assertFalse(any(type(m).__name__ == "NewGELUActivation" for m in fused.modules()))
        self.assertEqual(modeling.fuse_gelu(copy.deepcopy(plain)), 4)  # one per feed-forward
        self.assertEqual(modeling.fuse_gelu(fused), 0)
        loss, grads, saved = self._loss_grads_and_saved_bytes(fused)
        plain_loss, plain_grads, plain_saved = self._loss_grads_and_saved_bytes(plain)
        # The fused kernel rounds once where transformers' eight ops round eight times: fp32 rounding,
        # up to 1.1e-6 of a gradient's largest element here. A different formula (GELU without its
        # tanh form) is 4.5e-5 apart in the loss and 1.3e-3 in the gradients.
        torch.testing.assert_close(loss, plain_loss, rtol=1e-6, atol=0)
        for name, grad in plain_grads.items():
            scale = grad.abs().max().item()
            torch.testing.assert_close(grads[name], grad, rtol=0, atol=4e-6 * scale, msg=name)
        # Three d_ff-wide tensors fewer per gated GELU (tanh, x/2 and 1 + tanh): 4 layers, fp32.
        tokens = {"encoder": 2 * 4, "decoder": 2 * 3}
        self.assertEqual(plain_saved - saved, 3 * 48 * 4 * 2 * sum(tokens.values()))

    def test_the_model_saves_and_loads_as_transformers_wrote_it(self):
        fused, plain = self._v1_1_and_transformers_own()
        with tempfile.TemporaryDirectory() as folder:
            fused.save_pretrained(folder)
            reloaded = T5ForConditionalGeneration.from_pretrained(folder)
        self.assertEqual(reloaded.config.dense_act_fn, "gelu_new")
        self.assertEqual(type(reloaded.decoder.block[0].layer[2].DenseReluDense.act).__name__, "NewGELUActivation")
        for name, value in plain.state_dict().items():
            torch.testing.assert_close(reloaded.state_dict()[name], value, rtol=0, atol=0, msg=name)

    def test_a_relu_model_is_left_alone(self):
        model = fixtures.tiny_model()
        self.assertEqual(modeling.fuse_gelu(model), 0)
        self.assertIsInstance(model.encoder.block[0].layer[1].DenseReluDense.act, torch.nn.ReLU)


if __name__ == "__main__":
    absltest.main()
