"""Freezing whole components and the parameter table by component (t5_training.components)."""
import os
import tempfile

import torch
import transformers
from absl.testing import absltest, parameterized
from safetensors.torch import load_file

import fine_tune_t5
from t5_training import components, modeling
from t5_training.errors import UsageError
from tests import fixtures


class FreezeTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("encoder", {"encoder": True}, True),
        ("decoder", {"decoder": True}, True),
        ("embeddings", {"embeddings": True}, True),
        ("embeddings_untied", {"embeddings": True}, False),
        ("encoder_and_embeddings", {"encoder": True, "embeddings": True}, True),
    )
    def test_no_gradient_reaches_frozen_weights(self, flags, tie):
        model = fixtures.tiny_t5(tie=tie)
        components.freeze(model, **flags)
        model(**fixtures.tiny_t5_batch()).loss.backward()
        names = [name for name, _ in model.named_parameters()]
        self.assertEqual("lm_head.weight" in names, not tie)
        for name, param in model.named_parameters():
            # The encoder's and decoder's embed_tokens are the shared weight, listed once as shared.weight.
            part = "embeddings" if name in ("shared.weight", "lm_head.weight") else name.split(".")[0]
            frozen = flags.get(part, False)
            with self.subTest(name=name):
                self.assertEqual(param.requires_grad, not frozen)
                if frozen:
                    self.assertIsNone(param.grad)
                else:
                    self.assertGreater(float(param.grad.abs().sum()), 0)

    def test_freezing_everything_is_refused(self):
        with self.assertRaisesRegex(UsageError, "^every weight is frozen, so there is nothing to train: drop one of "
                                                "--freeze_encoder, --freeze_decoder, --freeze_embeddings$"):
            components.freeze(fixtures.tiny_t5(), encoder=True, decoder=True, embeddings=True)

    def test_frozen_encoder_is_unchanged_by_a_run(self):
        with tempfile.TemporaryDirectory() as out:
            fine_tune_t5.main(fixtures.fine_tune_args(out, "--max_steps", "3", "--freeze_encoder",
                                                      "--freeze_embeddings", "--save_steps", "0"))
            # The run starts from seed 7's initialisation; rebuild it to compare.
            from transformers import set_seed
            from t5_training.config import parse_config
            set_seed(7)
            _, initial = modeling.load_tokenizer_and_model(
                parse_config(fine_tune_t5.FineTuneConfig, fixtures.fine_tune_args(out)))
            trained = load_file(os.path.join(out, "final", "model.safetensors"))
            before = initial.state_dict()
            changed = {name for name, value in trained.items() if not torch.equal(value, before[name])}
            self.assertTrue(changed)
            self.assertTrue(all(name.startswith("decoder.") for name in changed), sorted(changed)[:5])
            self.assertTrue(any(name.startswith("decoder.block") for name in changed))


class SummaryTest(absltest.TestCase):
    def test_counts_and_bytes_by_component(self):
        model = fixtures.tiny_t5(tie=True)
        # Embedding 32 x 8 = 256. Encoder: self-attention q,k,v,o 4 x 8 x 8 = 256, relative bias
        # 4 x 2 = 8, FF 8 x 16 x 2 = 256, two layer norms and a final one 3 x 8: 544. Decoder:
        # self-attention 256 + bias 8, cross-attention 256, FF 256, three norms and a final 32: 808.
        components.freeze(model, encoder=True)
        lines = components.model_summary(model).splitlines()
        rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
        self.assertEqual(rows["embeddings"], ["256", "256", "0.0"])
        self.assertEqual(rows["encoder"], ["544", "0", "0.0"])
        self.assertEqual(rows["decoder"], ["808", "808", "0.0"])
        self.assertEqual(rows["total"], ["1,608", "1,064", "0.0"])
        self.assertEqual(sum(p.numel() for p in model.parameters()), 1608)

    def test_the_whole_table_as_printed(self):
        # A vocabulary of 2**16 x d_model 8: 524,288 fp32 weights, 2 MiB, so the MiB column shows.
        model = transformers.T5ForConditionalGeneration(fixtures.tiny_t5_config(vocab_size=2 ** 16))
        components.freeze(model, encoder=True)
        # 1,352 weights besides the embedding (encoder 544, decoder 808), 544 of them frozen;
        # 525,640 x 4 bytes = 2.005 MiB; 525,096 / 525,640 = 99.897%.
        self.assertEqual(components.model_summary(model), "\n".join([
            "component          params     trainable       MiB",
            "embeddings        524,288       524,288       2.0",
            "encoder               544             0       0.0",
            "decoder               808           808       0.0",
            "total             525,640       525,096       2.0",
            "trainable: 525,096 of 525,640 parameters (99.90%)"]))

    def test_untied_output_layer_counts_as_embeddings(self):
        rows = {line.split()[0]: line.split()[1:] for line in components.model_summary(fixtures.tiny_t5(tie=False)).splitlines()}
        self.assertEqual(rows["embeddings"][0], "512")


    def test_an_adapter_model_counts_its_weights_where_they_sit(self):
        import peft

        # LoRA r 2 on every q (the encoder's; the decoder's self- and cross-attention): 2 x (8 + 8)
        # each, counted with its layer; a weight outside encoder, decoder and embeddings is "other".
        lora = peft.get_peft_model(fixtures.tiny_t5(), peft.LoraConfig(r=2, target_modules=["q"], task_type="SEQ_2_SEQ_LM"))
        lora.base_model.model.register_parameter("extra", torch.nn.Parameter(torch.zeros(5)))
        rows = {line.split()[0]: line.split()[1:3] for line in components.model_summary(lora).splitlines()[1:-1]}
        self.assertEqual(rows, {"embeddings": ["256", "0"], "encoder": ["576", "32"], "decoder": ["872", "64"],
                                "other": ["5", "5"], "total": ["1,709", "101"]})
        # Prompt tuning, 3 virtual tokens for each of the encoder and the decoder, d_model 8: 48.
        prompt = peft.get_peft_model(fixtures.tiny_t5(), peft.PromptTuningConfig(num_virtual_tokens=3, task_type="SEQ_2_SEQ_LM"))
        rows = {line.split()[0]: line.split()[1:3] for line in components.model_summary(prompt).splitlines()[1:-1]}
        self.assertEqual(rows, {"embeddings": ["256", "0"], "encoder": ["544", "0"], "decoder": ["808", "0"],
                                "prompt": ["48", "48"], "total": ["1,656", "48"]})


if __name__ == "__main__":
    absltest.main()
