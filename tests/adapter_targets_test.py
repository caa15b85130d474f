"""What LoRA adapts by default (t5_training.adapter_targets): every linear layer but the output layer."""
from __future__ import annotations

import os

from absl.testing import absltest, parameterized
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from t5_training import adapter_targets, adapters
from t5_training.adapters import AdapterConfig
from tests import fixtures

CONFIGS = os.path.join(fixtures.REPO, "configs")


def _model(config_file: str, **overrides):
    config = AutoConfig.from_pretrained(os.path.join(CONFIGS, config_file))
    # One layer each and a small vocabulary: the layers' names are what matters, not their size.
    config.update({"num_layers": 1, "num_decoder_layers": 1, "vocab_size": 64, **overrides})
    return AutoModelForSeq2SeqLM.from_config(config)


class DefaultLoraTargetsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("t5", "t5-tiny.json", {}, ["k", "o", "q", "v", "wi", "wo"]),
        ("gated_feed_forward", "t5-v1_1-small.json", {}, ["k", "o", "q", "v", "wi_0", "wi_1", "wo"]),
        # An output layer with a weight of its own may be named, but is not adapted unasked.
        ("untied_output_layer", "t5-tiny.json", {"tie_word_embeddings": False}, ["k", "o", "q", "v", "wi", "wo"]),
    )
    def test_every_linear_layer_but_the_output_layer(self, config_file, overrides, expected):
        model = _model(config_file, **overrides)
        self.assertEqual(adapter_targets.default_lora_targets(model), expected)

    def test_an_unset_flag_adapts_what_naming_the_defaults_adapts(self):
        unset = adapters.apply(_model("t5-tiny.json"), AdapterConfig(peft="lora"))
        named = adapters.apply(_model("t5-tiny.json"), AdapterConfig(peft="lora", lora_target_modules="q,k,v,o,wi,wo"))
        names = [sorted(n for n, p in m.named_parameters() if p.requires_grad) for m in (unset, named)]
        self.assertEqual(names[0], names[1])
        # One encoder layer (q, k, v, o, wi, wo) and one decoder layer (self and cross attention, wi, wo).
        self.assertLen([n for n in names[0] if n.endswith("lora_A.default.weight")], 6 + 10)
        self.assertEqual(unset.active_peft_config.lora_alpha / unset.active_peft_config.r, 8)


if __name__ == "__main__":
    absltest.main()
