"""Tests for t5_training.runtime: the machine's setup, preparing a run, and its length."""
import os
import tempfile
from unittest import mock

import torch
import torch._functorch.config
import transformers
from absl.testing import absltest
from absl.testing import parameterized

from accelerate.utils import DistributedType, TorchDynamoPlugin

from t5_training import runtime
from t5_training.config import TrainingConfig
from t5_training.errors import UsageError
from tests import fixtures
from tests.simulated_gpu import gpu_host


class TotalStepsTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("max_steps_wins", dict(max_steps=5, num_train_epochs=10), 13, 5),
        ("epochs", dict(num_train_epochs=2), 13, 26),
        ("epochs_with_accumulation", dict(num_train_epochs=2, gradient_accumulation_steps=4), 13, 7),
        ("fractional_epoch", dict(num_train_epochs=0.5), 13, 7),
    )
    def test_total_train_steps(self, kwargs, batches_per_epoch, expected):
        self.assertEqual(runtime.total_train_steps(TrainingConfig(**kwargs), batches_per_epoch), expected)

def _accelerator_stand_in(**kwargs) -> mock.MagicMock:
    """What build_accelerator reads back from the Accelerator it builds: the compile settings it took."""
    return mock.MagicMock(state=mock.Mock(dynamo_plugin=kwargs["dynamo_plugin"] or TorchDynamoPlugin()))


class DeepSpeedZero3Test(parameterized.TestCase):
    @parameterized.named_parameters(
        ("zero3", DistributedType.DEEPSPEED, 3, True),
        ("zero2", DistributedType.DEEPSPEED, 2, False),
        ("data_parallel", DistributedType.MULTI_GPU, None, False),
        ("fsdp", DistributedType.FSDP, None, False),
        ("one_process", DistributedType.NO, None, False),
    )
    def test_only_zero_stage_3_counts(self, distributed_type, stage, expected):
        plugin = mock.Mock(zero_stage=stage) if stage else None
        accelerator = mock.Mock(distributed_type=distributed_type, state=mock.Mock(deepspeed_plugin=plugin))
        self.assertIs(runtime.uses_deepspeed_zero3(accelerator), expected)


class DeviceInUseTest(parameterized.TestCase):
    """On a GPU host, a process told to use the CPU (the Slurm scripts' ACCELERATE_USE_CPU=1) is a CPU run."""

    @parameterized.named_parameters(
        ("gpu_process", {}, "bf16"),
        ("cpu_process", {"ACCELERATE_USE_CPU": "1"}, "no"),
        ("cpu_process_spelled_true", {"ACCELERATE_USE_CPU": "true"}, "no"),
        ("cpu_asked_off", {"ACCELERATE_USE_CPU": "false"}, "bf16"),
    )
    def test_auto_precision_follows_the_device_in_use(self, env, expected):
        with gpu_host(**env):
            self.assertEqual(runtime.resolve_mixed_precision("auto"), expected)
            self.assertEqual(runtime.resolve_mixed_precision("fp16"), "fp16")  # asked for, kept

    def _built_with(self, **env) -> dict:
        """The arguments build_accelerator gives accelerate on a GPU host, without building anything there."""
        tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        self.addCleanup(setattr, torch.backends.cudnn, "allow_tf32", tf32[1])
        self.addCleanup(setattr, torch.backends.cuda.matmul, "allow_tf32", tf32[0])
        with gpu_host(**env), mock.patch.object(runtime, "Accelerator", side_effect=_accelerator_stand_in) as accelerator:
            runtime.build_accelerator(TrainingConfig(output_dir="unused"))
            self.environ = dict(os.environ)
        return accelerator.call_args.kwargs

    def test_a_gpu_process_trains_on_the_gpu_in_bf16(self):
        built = self._built_with()
        self.assertEqual((built["cpu"], built["mixed_precision"], built["kwargs_handlers"]), (False, "bf16", []))
        self.assertTrue(built["dataloader_config"].non_blocking)  # from pinned memory, without waiting
        self.assertNotIn("DS_ACCELERATOR", self.environ)

    def test_a_cpu_process_on_a_gpu_host_trains_on_the_cpu_in_fp32(self):
        built = self._built_with(ACCELERATE_USE_CPU="1")
        self.assertEqual((built["cpu"], built["mixed_precision"]), (True, "no"))
        self.assertFalse(built["dataloader_config"].non_blocking)
        self.assertEqual(self.environ["DS_ACCELERATOR"], "cpu")

    def test_deepspeed_on_the_cpu_of_a_gpu_host_keeps_deepspeed_and_the_cpu(self):
        # ACCELERATE_USE_CPU would make accelerate drop DeepSpeed; without it accelerate would pick
        # the GPU, so the device is named instead, and the processes talk over gloo.
        built = self._built_with(ACCELERATE_USE_CPU="1", ACCELERATE_USE_DEEPSPEED="true", WORLD_SIZE="2")
        self.assertEqual((built["cpu"], built["mixed_precision"]), (False, "no"))
        self.assertEqual([h.backend for h in built["kwargs_handlers"]], ["gloo"])
        self.assertEqual((self.environ["ACCELERATE_USE_CPU"], self.environ["ACCELERATE_TORCH_DEVICE"],
                          self.environ["DS_ACCELERATOR"]), ("false", "cpu", "cpu"))

    def test_fsdp_on_the_cpu_of_a_gpu_host_is_refused(self):
        with self.assertRaisesRegex(UsageError, "FSDP needs GPUs"):
            self._built_with(ACCELERATE_USE_CPU="1", ACCELERATE_USE_FSDP="true")

class CompileTest(parameterized.TestCase):
    @parameterized.named_parameters(
        # Pretraining's batches all have one shape: a static graph, marked dynamic only where a
        # shape changes (torch's default), such as an epoch's last, smaller batch.
        ("one_shape", 1, None),
        # Fine-tuning pads to a few widths under --torch_compile: a static graph for each, and
        # room for all of them (dynamo's default keeps 8 a frame).
        ("a_few_shapes", 40, False),
        # UL2's targets vary without a bound: symbolic lengths at once, not a graph for every length.
        ("shapes_without_a_bound", None, True),
    )
    def test_static_graphs_wherever_the_batch_shapes_are_bounded(self, shapes, dynamic):
        config = TrainingConfig(output_dir="unused", torch_compile=True)
        with mock.patch.dict(os.environ), mock.patch.object(runtime, "Accelerator",
                                                            side_effect=_accelerator_stand_in) as accelerator, \
                mock.patch.object(torch._dynamo.config, "recompile_limit", 8):
            os.environ.pop("ACCELERATE_DYNAMO_USE_DYNAMIC", None)  # an accelerate config's choice
            runtime.build_accelerator(config, shapes=shapes)
            self.assertEqual(torch._dynamo.config.recompile_limit, 40 if shapes == 40 else 8)
        plugin = accelerator.call_args.kwargs["dynamo_plugin"]
        self.assertEqual((plugin.backend.value.lower(), plugin.dynamic), ("inductor", dynamic))
        self.assertEqual("dynamic" in plugin.to_kwargs(), dynamic is not None)

    @parameterized.parameters("reduce-overhead", "max-autotune")
    def test_the_compile_mode_reaches_torch_compile(self, mode):
        config = TrainingConfig(output_dir="unused", torch_compile=True, torch_compile_mode=mode)
        with mock.patch.object(runtime, "Accelerator", side_effect=_accelerator_stand_in) as accelerator:
            runtime.build_accelerator(config, shapes=1)
        self.assertEqual(accelerator.call_args.kwargs["dynamo_plugin"].to_kwargs()["mode"], mode)

    def test_a_mode_with_a_backend_that_has_none_is_one_line(self):
        config = TrainingConfig(output_dir="unused", torch_compile=True, torch_compile_backend="aot_eager",
                                torch_compile_mode="reduce-overhead")
        with self.assertRaisesRegex(UsageError, r"^--torch_compile_mode reduce-overhead is a mode of the inductor "
                                                r"backend; drop it or use --torch_compile_backend inductor$"):
            runtime.build_accelerator(config)

    def test_a_second_run_in_one_process_with_other_compile_settings_is_refused(self):
        # accelerate keeps the first Accelerator's compile settings for the whole process: without
        # the check, the second run would train uncompiled and say nothing (the conftest resets the
        # state after each test, as a new process would start).
        runtime.build_accelerator(TrainingConfig(output_dir="unused"))
        runtime.build_accelerator(TrainingConfig(output_dir="unused"))  # the same settings: fine
        with self.assertRaisesRegex(UsageError, r"^this process already trained with other --torch_compile "
                                                r"settings \(NO\), .* run each training in a process of its own$"):
            runtime.build_accelerator(TrainingConfig(output_dir="unused", torch_compile=True,
                                                     torch_compile_backend="aot_eager"))


    def test_a_model_compiled_on_a_cpu_keeps_no_relu_masks_for_its_backward_pass(self):
        # What made compiled pretraining slower than eager on a CPU (see
        # runtime.save_whole_activations_for_backward): the compiled forward pass kept a bool mask of
        # every feed-forward activation for the ReLU's backward, which inductor's CPU kernels write
        # and read about 20 times slower than eager's.
        d_ff = 24  # a size no other dimension of the model has

        def masks_kept() -> list[tuple]:
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = transformers.T5ForConditionalGeneration(fixtures.tiny_t5_config(
                d_ff=d_ff, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0))
            kept = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
                loss = torch.compile(model)(input_ids=torch.randint(0, 32, (2, 8)),
                                            labels=torch.randint(0, 32, (2, 4))).loss
            loss.backward()
            return [tuple(t.shape) for t in kept if t.dtype == torch.bool and t.shape[-1] == d_ff]

        with torch._functorch.config.patch(recompute_views=False):
            self.assertTrue(masks_kept())  # torch's default: the masks this test looks for are there
            with mock.patch.dict(os.environ, {"ACCELERATE_USE_CPU": "1"}), \
                    mock.patch.object(runtime, "Accelerator", side_effect=_accelerator_stand_in):
                runtime.build_accelerator(TrainingConfig(output_dir="unused", torch_compile=True), shapes=1)
            self.assertEqual(masks_kept(), [])


class PrepareTest(absltest.TestCase):
    def test_the_config_accumulation_reaches_accelerate_and_the_run_has_its_length(self):
        from accelerate import Accelerator
        # Built with 2, as before --auto_find_batch_size raised the config's accumulation to 6.
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        config = TrainingConfig(output_dir="unused", gradient_accumulation_steps=6, num_train_epochs=2)
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2))
        train = torch.utils.data.DataLoader(list(range(30)), batch_size=2)  # 15 micro-batches
        evals = {"validation": torch.utils.data.DataLoader(list(range(4)), batch_size=2)}
        run = runtime.prepare(accelerator, config, model, train, evals)
        self.assertEqual(accelerator.gradient_accumulation_steps, 6)
        self.assertEqual((run.batches_per_epoch, run.total_steps), (15, 5))  # ceil(2 x 15 / 6)
        self.assertEqual(list(run.eval_loaders), ["validation"])
        self.assertIsNot(run.train_loader, train)  # sharded by accelerate
        unsharded = runtime.prepare(accelerator, config, model, train, evals, shard_train_loader=False)
        self.assertIs(unsharded.train_loader, train)


class WandbLoginTest(parameterized.TestCase):
    """--report_to wandb is refused up front only where W&B could not start: online, no key, no terminal."""

    def setUp(self):
        super().setUp()
        folder = tempfile.TemporaryDirectory()  # create_tempdir needs absl flags, which pytest does not parse
        self.addCleanup(folder.cleanup)
        self.netrc = os.path.join(folder.name, "netrc")

    def _check(self, report_to="wandb", interactive=False, **environ):
        runtime.check_wandb_login(report_to, {"NETRC": self.netrc, **environ}, interactive)

    def test_no_key_anywhere_is_one_line(self):
        with self.assertRaisesWithLiteralMatch(
                UsageError, "--report_to all needs a W&B API key, and none is set for api.wandb.ai: run `wandb login` "
                            "(or set WANDB_API_KEY), set WANDB_MODE=offline to log locally and `wandb sync` later, or "
                            "pass --report_to tensorboard"):
            self._check("all")

    @parameterized.named_parameters(
        ("not_asked_for", dict(report_to="tensorboard")),
        ("offline", dict(WANDB_MODE="offline")),
        ("disabled", dict(WANDB_MODE="Disabled")),
        ("a_key", dict(WANDB_API_KEY="k" * 40)),
        ("a_token_file", dict(WANDB_IDENTITY_TOKEN_FILE="/run/token")),
        ("a_terminal_to_ask_on", dict(interactive=True)))
    def test_passes(self, arguments):
        self._check(**arguments)

    def test_the_netrc_entry_of_the_host_passes(self):
        with open(self.netrc, "w", encoding="utf-8") as f:
            f.write("machine wandb.example.com\n  login user\n  password " + "k" * 40 + "\n")
        os.chmod(self.netrc, 0o600)
        self._check(WANDB_BASE_URL="https://wandb.example.com")
        with self.assertRaisesRegex(UsageError, "none is set for api.wandb.ai"):
            self._check()


if __name__ == "__main__":
    absltest.main()
