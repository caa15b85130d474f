"""Tests for t5_training.tools.memory: a case worked out by hand, and how ZeRO, freezing, checkpointing
and precision move each component. The activation tracer is tested in activation_memory_test.py."""

import contextlib
import io
import json
import math
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import transformers

from t5_training import adapters, foreach, optim
from t5_training.tools import adapter_memory, memory
from t5_training.errors import UsageError, run_cli
from tests import fixtures


def _small_config(**overrides):
    return transformers.T5Config.from_pretrained(os.path.join(fixtures.REPO, "configs", "t5-small.json"), **overrides)


class HandComputedTest(absltest.TestCase):

    def test_tiny_t5_fp32_adamw_on_cpu(self):
        # d_model 8, d_kv 4 x 2 heads (inner 8), d_ff 16, vocab 32, 4 buckets, one layer a side, tied.
        # Parameters: shared 32*8 = 256.
        #   encoder layer: q,k,v,o 4*8*8 = 256, relative bias 4*2 = 8, 2 norms 16, wi 16*8 + wo 8*16 = 256: 536
        #   encoder final norm 8
        #   decoder layer: self q,k,v,o 256 + bias 8, cross q,k,v,o 256, 3 norms 24, wi + wo 256: 800
        #   decoder final norm 8; lm_head is shared.     256 + 536 + 8 + 800 + 8 = 1608
        # weights and gradients 4 * 1608 = 6432; AdamW 8 * 1608 = 12864.
        #
        # Activations, batch 2, source 6 (12 tokens), target 3 (6 tokens), fp32, dropout, no padding:
        #   encoder embedding: ids 12*8 = 96, dropout mask 12*8*4 = 384                         480
        #   encoder layer: per token 4*(8d + 2 + 4i + 3f) + 12*H*S = 4*146 + 144 = 728, x 12 = 8736,
        #     plus the 6x6 int64 relative buckets 288                                            9024
        #   encoder final norm: input, normed, dropout mask (3 x 12*8*4) + rsqrt 12*4          1200
        #   decoder embedding: ids 48, dropout mask 6*8*4 = 192                                  240
        #   decoder layer: per token 4*(12d + 3 + 6i + 3f) + 12*H*(T + S) = 780 + 216 = 996,
        #     x 6 = 5976; cross k, v copies 2*12*8*4 = 768; encoder output 384; causal
        #     mask 3*3 bools 9; buckets 3*3*8 = 72                                               7209
        #   decoder final norm: 3 x 6*8*4 + 6*4                                                   600
        #   head: lm_head input 6*8*4 = 192, fp32 log-probs 6*32*4 = 768, labels 48             1008
        # Saved in all: 19761. Backward runs the nodes in reverse; a tensor goes once the first node that
        # saved it has run, and each node needs its output's and inputs' gradients meanwhile:
        #   log_softmax: all but the labels (19761 - 48) + d log-probs + d logits (2 * 768) = 21249,
        #     the activations' peak; with the shared embedding's gradient (1024): 22273.
        #   the decoder layer's last node (dropout after wo): all but the final norm and head
        #     (19761 - 600 - 1008 = 18153) + 2 * 6*8*4 = 18537; with the gradients of the shared
        #     embedding, the final norm and the layer (1024 + 32 + 3200): 22793, the peak.
        #   In the encoder every gradient exists (6432) but at most 10272 bytes of activations: 16704.
        # Optimizer step (fused AdamW, in place): the gradients, 6432, less.
        # Total 6432 + 12864 + 22793 = 42089.
        result = memory.estimate(fixtures.tiny_t5_config(), batch_size=2, source_length=6, target_length=3, device="cpu",
                                 padding=False)
        self.assertEqual(result, memory.MemoryEstimate(
            parameters=1608, trainable_parameters=1608, weights=6432, gradients=6432, optimizer_state=12864,
            activations=21249, total=42089, peak_at="backward, decoder layer 0", saved_for_backward=19761))

    def test_adafactor_state(self):
        # HF's Adafactor factors every matrix (out, in): row + column each, the whole of each vector,
        # 4 bytes each: shared 32+8 = 40; encoder q,k,v,o 4*16, bias 4+2, wi 16+8, wo 8+16, norms
        # 2*8: 134; decoder 64 + 6 + 64 + 48 + 3*8 = 206; final norms 16.   4 * (40 + 134 + 206 + 16) = 1584.
        hf = memory.estimate(fixtures.tiny_t5_config(), batch_size=2, source_length=6, target_length=3, optim="adafactor_hf")
        self.assertEqual(hf.optimizer_state, 1584)
        # T5's factors only where both of the two largest dims are >= 128: none here, so one fp32
        # value per parameter.
        t5 = memory.estimate(fixtures.tiny_t5_config(), batch_size=2, source_length=6, target_length=3, optim="adafactor")
        self.assertEqual(t5.optimizer_state, 4 * 1608)
        # Under ZeRO the optimizer sees flat 1-D partitions: one fp32 value per parameter, sharded.
        zero = memory.estimate(fixtures.tiny_t5_config(), batch_size=2, source_length=6, target_length=3, optim="adafactor",
                               zero_stage=1, world_size=2)
        self.assertEqual(zero.optimizer_state, 4 * 1608 // 2)

    def test_t5_adafactor_state_of_t5_small(self):
        # Factored (row + column): shared 32128 + 512; q, k, v, o 512 + 512; wi, wo 2048 + 512.
        # Whole: the 32 x 8 relative attention bias (8 < 128) and the 512-wide layer norms.
        encoder = 6 * (4 * 1024 + 2 * 2560 + 2 * 512) + 256 + 512
        decoder = 6 * (8 * 1024 + 2 * 2560 + 3 * 512) + 256 + 512
        result = memory.estimate(_small_config(), batch_size=1, source_length=8, target_length=2, optim="adafactor")
        self.assertEqual(result.optimizer_state, 4 * (32128 + 512 + encoder + decoder))

    def test_adafactor_steps_a_chunk_at_a_time_on_a_gpu_and_a_tensor_at_a_time_on_a_cpu(self):
        # A tiny batch, so that the optimizer step is the peak. t5-small's largest tensor is the
        # shared embedding (32128 x 512 = 16.4M elements); its decay group packs into chunks of up
        # to 2^24 elements (foreach.foreach_chunks), the largest holding the embedding and more.
        config = _small_config()
        on = {device: memory.estimate(config, batch_size=1, source_length=8, target_length=2, optim="adafactor",
                                      device=device) for device in ("cpu", "cuda")}
        shapes = memory.parameter_shapes(config)
        learn = list(shapes)
        decay = [math.prod(shapes[n]) for n in learn if optim.takes_weight_decay(n, len(shapes[n]))]
        chunk = max(sum(decay[i] for i in c) for c in foreach.foreach_chunks(decay))
        self.assertLessEqual(chunk, foreach.FOREACH_CHUNK_ELEMENTS)
        self.assertGreater(chunk, 32128 * 512)
        for device, result in on.items():
            self.assertEqual(result.peak_at, "optimizer step", device)
        # On a GPU one copy of the largest chunk; on a CPU one copy of the largest tensor.
        self.assertEqual(on["cuda"].total - on["cpu"].total, 4 * (chunk - 32128 * 512))

    def test_fused_adamw_needs_no_copy_of_the_weights_to_step(self):
        # A tiny batch, so the step would be the peak if it held a copy of every parameter (what
        # foreach AdamW does, and what the estimator assumed before): weights, 2 moments, gradients
        # and that copy, 20 bytes per parameter. Fused AdamW steps in place: 16 plus activations.
        result = _estimate(batch_size=1, source_length=8, target_length=2)
        per_parameter = 16 * result.parameters
        self.assertGreater(result.total, per_parameter)
        self.assertLess(result.total, per_parameter * 1.02)
        self.assertTrue(result.peak_at.startswith("backward"), result.peak_at)


def _estimate(**options):
    values = dict(batch_size=8, source_length=512, target_length=114, device="cuda")
    return memory.estimate(_small_config(), **{**values, **options})


class ComponentsTest(parameterized.TestCase):

    def test_t5_small_parameters_count_tied_weights_once(self):
        # 32128 * 512 shared; per encoder layer 4 * 512^2 + 2 * 512 * 2048 + 2 * 512 norms; 8 * 32 bias.
        result = _estimate()
        encoder = 6 * (4 * 512 ** 2 + 2 * 512 * 2048 + 2 * 512) + 32 * 8 + 512
        decoder = 6 * (8 * 512 ** 2 + 2 * 512 * 2048 + 3 * 512) + 32 * 8 + 512
        self.assertEqual(result.parameters, 32128 * 512 + encoder + decoder)
        self.assertEqual(result.parameters, 60506624)  # t5-small, as the hub reports
        self.assertEqual((result.weights, result.gradients, result.optimizer_state),
                         (4 * result.parameters, 4 * result.parameters, 8 * result.parameters))

    @parameterized.named_parameters(("stage1", 1), ("stage2", 2), ("stage3", 3))
    def test_zero_divides_the_right_components(self, stage):
        # fp32, so that only the sharding differs from the single-process run.
        base, zero = _estimate(), _estimate(zero_stage=stage, world_size=4)
        n = base.parameters
        self.assertEqual(zero.optimizer_state, 8 * n // 4)
        bucket = 512 ** 2 * 4  # reduce_bucket_size "auto": d_model^2 elements
        self.assertEqual(zero.gradients, 4 * n // 4 + bucket if stage >= 2 else 4 * n)
        # ZeRO-3 gathers the largest layer (the shared embedding) whole while it runs.
        self.assertEqual(zero.weights, 4 * n // 4 + 4 * 32128 * 512 if stage == 3 else 4 * n)
        self.assertEqual(zero.activations, base.activations)
        self.assertLess(zero.total, base.total)

    def test_ddp_keeps_a_second_gradient_copy(self):
        self.assertEqual(_estimate(world_size=4).gradients, 2 * _estimate().gradients)

    def test_zero_16_bit_is_two_plus_two_plus_twelve(self):
        # DeepSpeed's bf16: 16-bit weights and gradients, fp32 master copy + two moments sharded.
        result = _estimate(zero_stage=1, world_size=2, precision="bf16")
        n = result.parameters
        self.assertEqual((result.weights, result.gradients, result.optimizer_state), (2 * n, 2 * n, 12 * n // 2))

    @parameterized.named_parameters(
        ("encoder", ("encoder",), lambda names: [n for n in names if n.startswith("encoder.")]),
        ("decoder", ("decoder",), lambda names: [n for n in names if n.startswith("decoder.")]),
        ("embeddings", ("embeddings",), lambda names: ["shared.weight"]),
    )
    def test_frozen_parameters_have_no_gradients_or_optimizer_state(self, frozen, names_of):
        shapes = memory.parameter_shapes(_small_config())
        frozen_count = sum(math.prod(shapes[n]) for n in names_of(list(shapes)))
        base, result = _estimate(), _estimate(frozen=frozen)
        self.assertEqual(result.trainable_parameters, base.parameters - frozen_count)
        self.assertEqual(result.weights, base.weights)
        self.assertEqual(result.gradients, 4 * result.trainable_parameters)
        self.assertEqual(result.optimizer_state, 8 * result.trainable_parameters)
        self.assertLessEqual(result.activations, base.activations)

    def test_frozen_encoder_and_embeddings_keep_no_encoder_activations(self):
        # Nothing before the decoder needs a gradient: the encoder runs as in inference.
        base = _estimate(frozen=("encoder",))
        result = _estimate(frozen=("encoder", "embeddings"))
        self.assertLess(result.activations, base.activations / 2)

    def test_gradient_checkpointing_lowers_activations(self):
        base, checkpointed = _estimate(), _estimate(gradient_checkpointing=True)
        self.assertLess(checkpointed.activations, base.activations / 3)
        self.assertEqual((checkpointed.weights, checkpointed.gradients), (base.weights, base.gradients))

    def test_precision(self):
        fp32, bf16 = _estimate(), _estimate(precision="bf16")
        # accelerate's autocast keeps fp32 weights, gradients and optimizer state...
        self.assertEqual((bf16.weights, bf16.gradients, bf16.optimizer_state),
                         (fp32.weights, fp32.gradients, fp32.optimizer_state))
        # ...and saves 16-bit matmul inputs (and weight copies); norms and the residual stream stay
        # fp32, and so does SDPA's math kernel, which the self-attention's trained position bias
        # sends it to on either device: at 512 tokens its fp32 L x L tensors dominate, and bf16
        # saves 8% less, not half (9% on an H200: activation_memory_test.OnAGpuTest's figures).
        self.assertLess(bf16.activations, 0.95 * fp32.activations)
        self.assertGreater(bf16.activations, 0.85 * fp32.activations)
        self.assertEqual(_estimate(precision="fp16"), bf16)

    def test_memory_grows_with_batch_and_length(self):
        small = _estimate(batch_size=4)
        self.assertLess(small.activations, _estimate().activations)
        self.assertLess(_estimate(source_length=128).total, _estimate().total)


class AdapterTest(parameterized.TestCase):
    """--peft: the adapter's parameters alone have gradients and optimizer state; the base weights stay."""

    def _adapter(self, **flags):
        return adapter_memory.describe(_small_config(), adapters.AdapterConfig(**flags))

    @parameterized.named_parameters(
        # LoRA: r * (d_in + d_out) per targeted matrix. t5-small's q, v (512 x 512) are in 6 encoder
        # self-attentions and 6 decoder self- and 6 cross-attentions: 36 matrices.
        ("lora_qv", {"peft": "lora", "lora_r": 8, "lora_target_modules": "q,v"}, 36 * 8 * (512 + 512)),
        # The default, every linear layer at r 8: q, k, v, o in 6 encoder and (twice) 6 decoder layers,
        # wi and wo in all 12.
        ("lora_default", {"peft": "lora"}, 8 * (6 * (4 + 8) * (512 + 512) + 12 * 2 * (512 + 2048))),
        # wi and wo (512 <-> 2048) in 12 feed-forward layers, r 4.
        ("lora_ffn", {"peft": "lora", "lora_r": 4, "lora_target_modules": "wi,wo"}, 24 * 4 * (512 + 2048)),
        # IA3's defaults: a vector over k's and v's outputs (512 each, 18 attentions) and over wo's
        # input (2048, 12 feed-forward layers).
        ("ia3", {"peft": "ia3"}, 36 * 512 + 12 * 2048),
        ("prompt", {"peft": "prompt_tuning", "num_virtual_tokens": 20}, 20 * 512),
    )
    def test_only_the_adapter_trains(self, flags, trainable):
        base, result = _estimate(), _estimate(adapter=self._adapter(**flags))
        self.assertEqual(result.trainable_parameters, trainable)
        self.assertEqual(result.parameters, base.parameters + trainable)
        self.assertEqual(result.weights, 4 * result.parameters)
        self.assertEqual(result.gradients, 4 * trainable)
        self.assertEqual(result.optimizer_state, 8 * trainable)
        self.assertLess(result.total, base.total)

    def test_adapter_activations_sit_between_frozen_and_full(self):
        # With every weight frozen the step saves what backward needs only once an adapter output
        # needs a gradient; LoRA in every layer keeps less than full fine-tuning (no weight
        # gradients' inputs for the frozen layers) and more than a fully frozen decoder-only run.
        lora = _estimate(adapter=self._adapter(peft="lora", lora_target_modules="q,k,v,o,wi,wo"))
        self.assertLess(lora.activations, _estimate().activations)
        self.assertGreater(lora.activations, _estimate(frozen=("encoder", "embeddings")).activations)

    def test_prompt_tuning_lengthens_the_encoder_input(self):
        prompt = _estimate(adapter=self._adapter(peft="prompt_tuning", num_virtual_tokens=100))
        shorter = _estimate(adapter=self._adapter(peft="prompt_tuning", num_virtual_tokens=1))
        self.assertGreater(prompt.activations, shorter.activations)

    def test_zero_shards_the_adapter_only(self):
        adapter = self._adapter(peft="lora")
        single, zero = _estimate(adapter=adapter), _estimate(adapter=adapter, zero_stage=2, world_size=4)
        n = single.trainable_parameters
        self.assertEqual(zero.optimizer_state, 8 * n // 4)
        self.assertEqual(zero.gradients, 4 * -(-n // 4) + 4 * min(n, 512 ** 2))


class BadInputTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("zero_batch", {"batch_size": 0}, "--batch_size must be at least 1"),
        ("negative_length", {"source_length": -5}, "--source_length must be at least 1"),
        ("zero_without_processes", {"zero_stage": 2}, "pass --world_size N"),
        ("zero_stage_4", {"zero_stage": 4, "world_size": 2}, "--zero_stage must be 0, 1, 2 or 3"),
        ("all_frozen", {"frozen": memory.FROZEN}, "nothing to train"),
        ("unknown_part", {"frozen": ("lm_head",)}, "cannot freeze"),
        ("precision", {"precision": "fp8"}, "precision, optim and device"),
    )
    def test_estimate_raises_usage_error(self, options, message):
        with self.assertRaisesRegex(UsageError, message):
            memory.estimate(fixtures.tiny_t5_config(), **{**dict(batch_size=2, source_length=6, target_length=3), **options})

    @parameterized.named_parameters(
        ("missing_config", ["--config_name", "configs/t5-nope.json"], "could not load model config"),
        ("zero_batch", ["--batch_size", "0"], "--batch_size must be at least 1"),
        ("zero_without_world", ["--zero_stage", "3"], "--world_size is 1"),
        ("bad_precision", ["--precision", "fp8"], "fp8"),
        ("misspelt_flag", ["--batch_sise", "4"], "did you mean --batch_size"),
        ("dropout", ["--dropout_rate", "1.5"], "--dropout_rate must be in"),
        ("freeze_everything", ["--freeze_encoder", "--freeze_decoder", "--freeze_embeddings"], "nothing to train"),
        ("lora_missing_target", ["--peft", "lora", "--lora_target_modules", "q,query"],
         "no linear layer named 'query'"),
        ("freeze_with_adapter", ["--peft", "ia3", "--freeze_encoder"], "--freeze_encoder with --peft ia3"),
        ("zero_virtual_tokens", ["--peft", "prompt_tuning", "--num_virtual_tokens", "0"],
         "--num_virtual_tokens must be at least 1"),
    )
    def test_command_line_errors_are_one_line(self, argv, message):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()) as stdout:
            code = run_cli(memory.main, argv)
        self.assertEqual(code, 2)
        self.assertEqual(stdout.getvalue(), "")
        self.assertIn(message, stderr.getvalue())
        self.assertEqual(len(stderr.getvalue().strip().splitlines()), 1)

    def test_not_a_t5_config(self):
        with tempfile.TemporaryDirectory() as folder:
            transformers.BartConfig(vocab_size=64, d_model=16).save_pretrained(folder)
            with self.assertRaisesRegex(UsageError, "is a 'bart' model"):
                memory.main(["--config_name", folder])


class CommandTest(absltest.TestCase):

    def _run(self, *argv):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            result = memory.main(["--config_name", os.path.join(fixtures.REPO, "configs", "t5-small.json"), *argv])
        return result, out.getvalue()

    def test_prints_the_table(self):
        result, text = self._run("--batch_size", "8", "--precision", "bf16", "--optim", "adafactor")
        self.assertEqual(result, _estimate(precision="bf16", optim="adafactor"))
        lines = text.splitlines()
        self.assertIn("60.5M parameters (60.5M trainable); batch 8, 512 -> 114 tokens, bf16, adafactor", lines[0])
        rows = {line.split("  ")[0]: line for line in lines[3:8]}
        self.assertEqual(list(rows), ["weights", "gradients", "optimizer state", "activations", "total (peak)"])
        self.assertIn("230.8 MiB", rows["weights"])  # 60506624 * 4 bytes
        self.assertIn(f"{result.total / 2**30:.2f} GiB", rows["total (peak)"])

    def test_json(self):
        result, text = self._run("--batch_size", "4", "--zero_stage", "2", "--world_size", "8",
                                 "--gradient_checkpointing", "--freeze_embeddings", "--device", "cpu", "--json")
        values = json.loads(text)
        self.assertEqual(values["bytes"], result.to_dict())
        self.assertEqual((values["inputs"]["zero_stage"], values["inputs"]["freeze_embeddings"]), (2, True))

    def test_peft_flags_are_fine_tune_t5s(self):
        result, text = self._run("--peft", "lora", "--lora_r", "4", "--lora_target_modules", "q,k,v,o")
        self.assertEqual(result.trainable_parameters, 72 * 4 * 1024)  # 4 matrices in 18 attentions
        self.assertIn("60.8M parameters (294,912 trainable: LoRA r=4 on k,o,q,v)", text.splitlines()[0])

    def test_overrides_reach_the_model_config(self):
        with_dropout, _ = self._run("--device", "cpu")
        without, _ = self._run("--device", "cpu", "--dropout_rate", "0", "--vocab_size", "1000")
        self.assertLess(without.activations, with_dropout.activations)
        self.assertEqual(with_dropout.parameters - without.parameters, (32128 - 1000) * 512)


if __name__ == "__main__":
    absltest.main()
