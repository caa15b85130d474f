"""DeepSpeed ZeRO-2 and ZeRO-3 through `accelerate launch` and the shipped configs, on 2 CPU processes.

Each run is fine_tune_t5.py started as a user starts it:

    accelerate launch --config_file accelerate_configs/deepspeed_zero2.yaml --num_processes 2 \\
        --mixed_precision no fine_tune_t5.py ...

with gloo between the processes and fp32 (CPUs have no bf16 units). Every run starts from the
same saved tiny model, so that its losses can be compared with one plain process: DeepSpeed
builds a from-scratch model under ZeRO-3 with `zero.Init`, which draws other random weights.
DeepSpeed's first use on a machine compiles native code (its CPU communication op, and CPU Adam
for the offload config: a few minutes in all, cached in ~/.cache/torch_extensions).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import torch
from transformers import AutoConfig, T5ForConditionalGeneration

import fine_tune_t5
from t5_training import checkpoint, modeling
from tests import fixtures

SCRIPT = os.path.join(fixtures.REPO, "fine_tune_t5.py")
CONFIGS = os.path.join(fixtures.REPO, "accelerate_configs")
# ACCELERATE_USE_CPU=1 is what slurm/*.sbatch set on nodes without GPUs: DeepSpeed must still run.
ENV = {"ACCELERATE_USE_CPU": "1", "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline"}
# Clipping at 0.5 is active in these first steps, so DeepSpeed's clipping (which --max_grad_norm
# sets through "auto") is compared with torch's as well.
COMMON = ["--max_steps", "4", "--save_steps", "2", "--save_total_limit", "0", "--dropout_rate", "0",
          "--max_grad_norm", "0.5"]


def _args(output_dir, init_dir, *extra):
    """fixtures.fine_tune_args, starting from the saved model instead of a fresh one."""
    args = fixtures.fine_tune_args(output_dir, *COMMON, *extra)
    at = args.index("--config_name")
    args[at:at + 2] = ["--model_name_or_path", init_dir]
    return args


def _launch(config_file, output_dir, init_dir, *extra, launcher_flags=()):
    """Two DeepSpeed processes on the CPU, batch 4 each; returns the run's log (stdout and stderr)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config_file,
               "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", "0", *launcher_flags,
               SCRIPT, *_args(output_dir, init_dir, "--per_device_train_batch_size", "4", *extra)]
    done = subprocess.run(command, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=900,
                          cwd=fixtures.REPO)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"exit code {done.returncode}:\n{log[-4000:]}")
    return log


def _losses(output_dir, step):
    with open(os.path.join(checkpoint.checkpoint_dir(output_dir, step), checkpoint.STATE_FILE)) as f:
        return json.load(f)["losses"]


def _ds_config(checkpoint_path):
    """The DeepSpeed config the engine really ran with, as its checkpoint records it."""
    folder = os.path.join(checkpoint_path, "pytorch_model")
    name = next(n for n in sorted(os.listdir(folder)) if n.endswith("model_states.pt"))
    return torch.load(os.path.join(folder, name), map_location="cpu", weights_only=True)["ds_config"]


class _DeepSpeedCase(absltest.TestCase):
    """A tiny model saved once, and one plain process's run that every DeepSpeed run must reproduce."""

    EXTRA: tuple[str, ...] = ()  # flags of every run of the class, the plain one included
    # Whether the class also resumes its run. A resume is a second 2-process launch (about 25 s of
    # CPU); two classes cover what it can break: a whole model's shards under ZeRO-2 and an
    # adapter's (frozen weights absent from the checkpoint) under ZeRO-3.
    RESUME = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        tmp = tempfile.TemporaryDirectory()
        cls.addClassCleanup(tmp.cleanup)
        cls.tmp = tmp.name
        tokenizer = modeling.load_tokenizer(fixtures.tokenizer_dir())
        torch.manual_seed(0)
        model = modeling.load_model(None, fixtures.TINY_CONFIG, tokenizer)
        cls.init = os.path.join(cls.tmp, "init")
        model.save_pretrained(cls.init)
        tokenizer.save_pretrained(cls.init)
        # One plain process with twice the batch: what every 2-process run must reproduce.
        cls.plain = os.path.join(cls.tmp, "plain")
        fine_tune_t5.main(_args(cls.plain, cls.init, "--per_device_train_batch_size", "8", *cls.EXTRA))
        cls.plain_losses = _losses(cls.plain, 4)

    def assert_matches_plain_run(self, losses, rel=1e-4):
        self.assertLen(losses, 4)
        for step, (got, want) in enumerate(zip(losses, self.plain_losses), start=1):
            self.assertAlmostEqual(got, want, delta=rel * abs(want), msg=f"step {step}")

    def assert_trains_resumes_and_exports(self, config_file, stage):
        out = os.path.join(self.tmp, f"zero{stage}")
        _launch(config_file, out, self.init, *self.EXTRA)
        losses = _losses(out, 4)
        # DeepSpeed divides by the accumulation steps in its backward and averages gradients over
        # processes, as DDP does, so the loop's token-mean scaling holds and ZeRO only moves where
        # the state lives: 2 processes x batch 4 train like 1 x batch 8.
        self.assert_matches_plain_run(losses)
        ds_config = _ds_config(checkpoint.checkpoint_dir(out, 4))
        self.assertEqual(ds_config["zero_optimization"]["stage"], stage)
        self.assertEqual(ds_config["gradient_clipping"], 0.5)
        self.assertEqual(ds_config["train_batch_size"], 8)
        self.assertFalse(ds_config["bf16"]["enabled"])
        # The manifest covers DeepSpeed's shards in their subfolder.
        with open(os.path.join(checkpoint.checkpoint_dir(out, 2), checkpoint.MANIFEST)) as f:
            files = json.load(f)["files"]
        shards = [name for name in files if name.startswith("pytorch_model/")]
        self.assertLen([n for n in shards if n.endswith("optim_states.pt")], 2)
        if self.EXTRA:
            # An adapter run's checkpoint leaves out the frozen weights (and has no state for them).
            full = os.path.getsize(os.path.join(self.init, "model.safetensors"))
            self.assertLess(sum(size for name, size in files.items() if name.startswith("pytorch_model/")),
                            full / 2)
        self.assertEqual(checkpoint.list_checkpoints(out), [checkpoint.checkpoint_dir(out, s) for s in (2, 4)])

        if self.RESUME:
            # As if the run had died after saving step 2: auto resumes there and ends where it did.
            shutil.rmtree(checkpoint.checkpoint_dir(out, 4))
            log = _launch(config_file, out, self.init, *self.EXTRA, "--resume_from_checkpoint", "auto")
            self.assertIn(f"resumed from {checkpoint.checkpoint_dir(out, 2)} at step 2", log)
            self.assertEqual(_losses(out, 4), losses)

        # final/ is a whole model (ZeRO-3 gathers it; an adapter run's merged model) that equals the plain run's.
        model = T5ForConditionalGeneration.from_pretrained(os.path.join(out, "final"))
        plain = T5ForConditionalGeneration.from_pretrained(os.path.join(self.plain, "final"))
        tiny = AutoConfig.from_pretrained(fixtures.TINY_CONFIG)
        self.assertEqual((model.config.d_model, model.config.num_layers), (tiny.d_model, tiny.num_layers))
        weights, expected = model.state_dict(), plain.state_dict()
        start = T5ForConditionalGeneration.from_pretrained(self.init).state_dict()
        self.assertEqual(weights.keys(), expected.keys())
        for name, tensor in weights.items():
            self.assertEqual(tensor.shape, expected[name].shape, name)
            self.assertTrue(torch.isfinite(tensor).all(), name)
            # Compared as a whole tensor against how far training moved it, not element by
            # element: the two runs sum in other orders (two processes, other padding), and Adam
            # moves a weight by about lr whatever its gradient, so an element whose gradient is
            # rounding noise can end up to about 2 x (lr summed over steps) apart, as far as a
            # whole update. Such elements are few: the difference is about 2 x sqrt(their
            # fraction) of the update (1e-3 measured on 6 steps of the same model). A model
            # saved a step early, left unmerged, or not gathered is off by 25% to 100% of it.
            # A frozen tensor moved by nothing, and must not differ at all.
            moved = (expected[name] - start[name]).norm().item()
            off = (tensor - expected[name]).norm().item()
            self.assertLessEqual(off, 0.05 * moved, f"{name}: |final - plain| {off:.3g}, |plain - init| {moved:.3g}")
        # Generation (under ZeRO-3 with synced_gpus) decoded every dev row once across both processes.
        with open(os.path.join(out, "predictions_validation.tsv"), encoding="utf-8") as f:
            self.assertLen(f.readlines(), 33)


# One class per run: the test runner spreads classes over its workers, and the plain run they
# share costs seconds.
class Zero2Test(_DeepSpeedCase):

    def test_zero2_trains_like_one_process_and_exports(self):
        self.assert_trains_resumes_and_exports(os.path.join(CONFIGS, "deepspeed_zero2.yaml"), 2)


class Zero3Test(_DeepSpeedCase):
    RESUME = False  # LoraZero3Test resumes under ZeRO-3

    def test_zero3_trains_like_one_process_and_exports(self):
        self.assert_trains_resumes_and_exports(os.path.join(CONFIGS, "deepspeed_zero3.yaml"), 3)


class LoraZero2Test(Zero2Test):
    # As DoRA, whose layers are LoRA's plus a magnitude per output: one run covers both under ZeRO-2
    # (plain LoRA runs under ZeRO-3 below, where DoRA is refused).
    EXTRA = ("--peft", "lora", "--use_dora", "--lora_target_modules", "q,k,v,o,wi,wo", "--lora_r", "4")
    RESUME = False  # Zero2Test resumes under ZeRO-2


class LoraZero3Test(Zero3Test):
    EXTRA = ("--peft", "lora", "--lora_target_modules", "q,k,v,o,wi,wo", "--lora_r", "4")
    RESUME = True


class DoraZero3RefusedTest(absltest.TestCase):

    def test_dora_under_zero3_is_one_line_and_exit_2(self):
        # peft's DoRA reads each frozen weight whole, which ZeRO-3 partitions: refused before any
        # training, not an IndexError from inside peft on every process.
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")  # refused before training: a fresh tiny model will do
            command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                       os.path.join(CONFIGS, "deepspeed_zero3.yaml"), "--num_processes", "2", "--mixed_precision",
                       "no", "--main_process_port", "0", SCRIPT,
                       *fixtures.fine_tune_args(out, *COMMON, "--peft", "lora", "--use_dora",
                                                "--per_device_train_batch_size", "4")]
            done = subprocess.run(command, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=900,
                                  cwd=fixtures.REPO)
            self.assertNotEqual(done.returncode, 0)
            refusals = [line for line in done.stderr.splitlines() if "--use_dora does not run under DeepSpeed ZeRO-3" in line]
            self.assertLen(refusals, 1, done.stderr[-3000:])  # printed by the main process
            self.assertIn("failed (exitcode: 2)", done.stderr)  # both processes stop with the usage error's code
            self.assertNotIn("IndexError", done.stderr)
            self.assertFalse(os.path.exists(out) and os.listdir(out))


class FreshV11Zero3Test(absltest.TestCase):

    def test_a_fresh_t5_v1_1_gets_its_whole_output_layer_under_zero3(self):
        # zero.Init partitions each weight as the model is built, so the output layer that
        # modeling.untie_output_layer gives a v1.1 must be drawn whole (it once had 0 elements, and
        # the first forward pass failed on every process).
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "v1_1.json")
            fixtures.tiny_t5_config(vocab_size=1000, d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                                    num_decoder_layers=2, feed_forward_proj="gated-gelu",
                                    tie_word_embeddings=False).to_json_file(config)
            args = fixtures.fine_tune_args(os.path.join(tmp, "out"), *COMMON, "--per_device_train_batch_size", "4")
            args[args.index("--config_name") + 1] = config
            args[args.index("--max_steps") + 1] = "2"
            command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                       os.path.join(CONFIGS, "deepspeed_zero3.yaml"), "--num_processes", "2", "--mixed_precision",
                       "no", "--main_process_port", "0", SCRIPT, *args]
            done = subprocess.run(command, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=900,
                                  cwd=fixtures.REPO)
            self.assertEqual(done.returncode, 0, (done.stdout + done.stderr)[-4000:])
            final = os.path.join(tmp, "out", "final")
            model = T5ForConditionalGeneration.from_pretrained(final)
            with open(os.path.join(final, "config.json"), encoding="utf-8") as saved:
                self.assertIs(json.load(saved)["tie_word_embeddings"], False)
        head, shared = model.lm_head.weight, model.shared.weight
        self.assertEqual(tuple(head.shape), (1000, 32))
        self.assertIsNot(head, shared)
        # Two steps barely move it from its draw: std 0.880 * 32 ** -0.5 (a normal truncated at 2 std).
        self.assertAlmostEqual(head.std().item(), 0.880 * 32 ** -0.5, delta=0.01)
        self.assertAlmostEqual(shared.std().item(), 1.0, delta=0.05)


class OffloadTest(_DeepSpeedCase):

    def test_offload_with_deepspeed_cpu_adam_trains_like_torch_adamw(self):
        # The config's "optimizer" block makes DeepSpeed build CPU Adam (the script passes a
        # DummyOptim); its lr comes from --learning_rate and the script's schedule drives it.
        out = os.path.join(self.tmp, "offload")
        offload = os.path.join(fixtures.REPO, "zero_stage2_offload_config.json")
        _launch(os.path.join(CONFIGS, "deepspeed_zero2.yaml"), out, self.init,
                launcher_flags=["--deepspeed_config_file", offload])
        # CPU Adam's fused arithmetic differs from torch's in the last bits.
        self.assert_matches_plain_run(_losses(out, 4), rel=1e-5)
        ds_config = _ds_config(checkpoint.checkpoint_dir(out, 4))
        self.assertEqual(ds_config["zero_optimization"]["offload_optimizer"]["device"], "cpu")
        self.assertEqual(ds_config["optimizer"]["params"]["lr"], 1e-3)


if __name__ == "__main__":
    absltest.main()
