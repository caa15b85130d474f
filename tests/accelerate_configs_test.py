"""Every shipped accelerate config and DeepSpeed JSON, read by the code that consumes it.

accelerate's launcher reads the YAML files and turns them into the environment the training
processes start with; accelerate's plugins read that environment, and DeepSpeed's own config
classes check the JSON once "auto" is filled in the way `accelerator.prepare` fills it. None of
this needs a GPU, so the GPU-only configs (FSDP, bf16) are checked here too.
"""
import json
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DeepSpeedPlugin, DistributedType, DummyOptim, FullyShardedDataParallelPlugin
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env
import torch
from torch.distributed.fsdp import ShardingStrategy, StateDictType
import transformers

from t5_training import optim, runtime
from t5_training.config import TrainingConfig
from t5_training.errors import UsageError
from tests import fixtures

CONFIGS = os.path.join(fixtures.REPO, "accelerate_configs")
SHIPPED = {
    "single_gpu.yaml": DistributedType.NO,
    "multi_gpu.yaml": DistributedType.MULTI_GPU,
    "multi_node.yaml": DistributedType.MULTI_GPU,
    "deepspeed_zero2.yaml": DistributedType.DEEPSPEED,
    "deepspeed_zero3.yaml": DistributedType.DEEPSPEED,
    "fsdp.yaml": DistributedType.FSDP,
}
DEEPSPEED_JSON = {"zero_stage2_config.json": 2, "zero_stage3_config.json": 3, "zero_stage2_offload_config.json": 2}
# What `accelerator.prepare` puts in place of "auto" (for a model with hidden size 512, batch 8 on
# each of 2 processes), and `DeepSpeedPlugin.set_mixed_precision` for bf16.enabled.
FILLED = {"train_micro_batch_size_per_gpu": 8, "train_batch_size": 16, "gradient_accumulation_steps": 1,
          "gradient_clipping": 1.0, "zero_optimization.reduce_bucket_size": 512 * 512,
          "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * 512 * 512),
          "zero_optimization.stage3_param_persistence_threshold": 10 * 512,
          "optimizer.params.lr": 3e-4, "optimizer.params.weight_decay": 0.0}


def _launcher(config_name, *flags):
    """The launcher's arguments after it has read the config file, as `accelerate launch` sees them."""
    argv = ["--config_file", os.path.join(CONFIGS, config_name), *flags, "train.py"]
    return _validate_launch_command(launch_command_parser().parse_args(argv))


def _deepspeed_env(config_name, *flags):
    """The environment `accelerate launch` gives DeepSpeed training processes (one machine unless flags say more)."""
    args, defaults, mixed_precision_from_file = _launcher(config_name, "--num_processes", "2", *flags)
    # launch_command's own step before the DeepSpeed launcher: which fields the file set.
    fields = list(defaults.deepspeed_config) + (["mixed_precision"] if mixed_precision_from_file else [])
    args.deepspeed_fields_from_accelerate_config = ",".join(fields)
    cmd, env = prepare_deepspeed_cmd_env(args)
    # The file names its JSON relative to the repository root, where jobs are launched.
    env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = os.path.join(fixtures.REPO, env["ACCELERATE_DEEPSPEED_CONFIG_FILE"])
    return args, cmd, env


def _filled(plugin, mixed_precision):
    plugin.set_mixed_precision(mixed_precision)
    plugin.deepspeed_config_process(must_match=False, **FILLED)
    return plugin.deepspeed_config


class ShippedFilesTest(parameterized.TestCase):

    def test_the_expected_configs_are_shipped(self):
        self.assertEqual(sorted(os.listdir(CONFIGS)), sorted(SHIPPED))
        for name in DEEPSPEED_JSON:
            self.assertTrue(os.path.isfile(os.path.join(fixtures.REPO, name)), name)

    @parameterized.named_parameters(*[(name.removesuffix(".yaml"), name, kind) for name, kind in SHIPPED.items()])
    def test_loads_with_accelerates_loader_and_defaults_to_bf16(self, name, kind):
        config = load_config_from_file(os.path.join(CONFIGS, name))
        self.assertIsInstance(config, ClusterConfig)
        self.assertEqual(config.distributed_type, kind)
        with open(os.path.join(CONFIGS, name), encoding="utf-8") as f:
            self.assertNotIn("fp16", f.read())
        args, _, mixed_precision_from_file = _launcher(name, "--num_processes", "2")
        self.assertEqual(args.use_deepspeed, kind == DistributedType.DEEPSPEED)
        self.assertEqual(args.use_fsdp, kind == DistributedType.FSDP)
        if kind == DistributedType.DEEPSPEED:
            # With deepspeed_config_file, accelerate refuses a mixed_precision from the file;
            # the JSON's "bf16": {"enabled": "auto"} follows the script's --mixed_precision
            # (auto: bf16 on a GPU that has it).
            self.assertIsNone(config.mixed_precision)
            self.assertFalse(mixed_precision_from_file)
            json_file = config.deepspeed_config["deepspeed_config_file"]
            self.assertTrue(os.path.isfile(os.path.join(fixtures.REPO, json_file)), json_file)
            # One `accelerate launch` per node (torchrun), as the Slurm script starts them: no pdsh or ssh.
            self.assertEqual(config.deepspeed_config["deepspeed_multinode_launcher"], "standard")
        else:
            self.assertEqual(config.mixed_precision, "bf16")
            self.assertEqual(args.mixed_precision, "bf16")

    def test_multi_node_placeholders_give_way_to_the_command_line(self):
        args, _, _ = _launcher("multi_node.yaml", "--num_processes", "12", "--num_machines", "3", "--machine_rank",
                               "2", "--main_process_ip", "10.1.2.3", "--main_process_port", "29555",
                               "--rdzv_backend", "c10d")
        prepare_multi_gpu_env(args)
        self.assertEqual((args.nnodes, args.node_rank, args.nproc_per_node), ("3", 2, "4"))
        self.assertEqual(args.rdzv_endpoint, "10.1.2.3:29555")
        self.assertEqual(args.rdzv_backend, "c10d")

    def test_fsdp_shards_t5_blocks_and_gathers_a_full_state_dict(self):
        args, _, _ = _launcher("fsdp.yaml", "--num_processes", "2", "--main_process_port", "0")
        env = prepare_multi_gpu_env(args)
        self.assertEqual(env["ACCELERATE_USE_FSDP"], "true")
        self.assertEqual(env["ACCELERATE_MIXED_PRECISION"], "bf16")
        # Loading on rank 0 and broadcasting (sync_module_states) needs a GPU to build the plugin.
        cpu_env = {**env, "FSDP_SYNC_MODULE_STATES": "false", "FSDP_CPU_RAM_EFFICIENT_LOADING": "false"}
        with mock.patch.dict(os.environ, cpu_env):
            plugin = FullyShardedDataParallelPlugin()
        self.assertEqual(plugin.sharding_strategy, ShardingStrategy.FULL_SHARD)
        self.assertEqual(plugin.state_dict_type, StateDictType.FULL_STATE_DICT)
        self.assertTrue(plugin.use_orig_params)
        self.assertEqual(env["FSDP_SYNC_MODULE_STATES"], "true")
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1))
        plugin.set_auto_wrap_policy(model)  # raises if no module class is named T5Block
        self.assertIsNotNone(plugin.auto_wrap_policy)

    @absltest.skipIf(torch.cuda.is_available(), "a machine with GPUs runs FSDP")
    def test_fsdp_without_gpus_is_refused_with_one_line(self):
        # accelerate would train plain DDP instead, under a config that says FSDP.
        args, _, _ = _launcher("fsdp.yaml", "--num_processes", "2", "--main_process_port", "0")
        with mock.patch.dict(os.environ, prepare_multi_gpu_env(args)):
            with self.assertRaisesRegex(UsageError, "FSDP needs GPUs.*deepspeed_zero3.yaml"):
                runtime.build_accelerator(TrainingConfig(output_dir="unused"))


class DeepSpeedJsonTest(parameterized.TestCase):

    @parameterized.named_parameters(*[(name.removesuffix(".json"), name) for name in DEEPSPEED_JSON])
    def test_bf16_follows_the_script_and_fp16_is_off(self, name):
        with open(os.path.join(fixtures.REPO, name), encoding="utf-8") as f:
            raw = json.load(f)
        self.assertEqual(raw["bf16"], {"enabled": "auto"})
        self.assertNotIn("fp16", raw)
        self.assertNotIn("scheduler", raw)  # the script's --lr_scheduler_type drives the learning rate

    @parameterized.named_parameters(
        ("zero2", "deepspeed_zero2.yaml", ()),
        ("zero3", "deepspeed_zero3.yaml", ()),
        ("zero2_offload", "deepspeed_zero2.yaml", ("--deepspeed_config_file", "zero_stage2_offload_config.json")),
    )
    def test_deepspeed_accepts_the_config_once_auto_is_filled(self, config_name, flags):
        from deepspeed.runtime.config import DeepSpeedConfig

        _, cmd, env = _deepspeed_env(config_name, *flags)
        self.assertIsNone(cmd)  # one machine: torchrun, not the deepspeed launcher
        stage = DEEPSPEED_JSON[os.path.basename(env["ACCELERATE_DEEPSPEED_CONFIG_FILE"])]
        for precision in ("bf16", "no"):
            with mock.patch.dict(os.environ, env):
                plugin = DeepSpeedPlugin()
            # evaluation.decode_split reads zero_stage to generate with synced_gpus under ZeRO-3.
            self.assertEqual(plugin.zero_stage, stage)
            filled = _filled(plugin, precision)
            self.assertNotIn('"auto"', json.dumps(filled))
            # DeepSpeed's own parser: unknown keys in zero_optimization are errors, batch sizes must agree.
            parsed = DeepSpeedConfig(dict(filled, train_batch_size=8))
            self.assertEqual(parsed.zero_optimization_stage, stage)
            self.assertEqual(parsed.bfloat16_config.enabled, precision == "bf16")
            self.assertFalse(parsed.float16_config.enabled)
        if stage == 3:
            # export_model's get_state_dict gathers a whole model only with this on.
            self.assertTrue(plugin.zero3_save_16bit_model)
            self.assertTrue(plugin.zero3_init_flag)

    def test_deepspeed_uses_one_launcher_per_node(self):
        args, cmd, _ = _deepspeed_env("deepspeed_zero2.yaml", "--num_machines", "2", "--machine_rank", "1",
                                      "--main_process_ip", "10.1.2.3", "--rdzv_backend", "c10d")
        self.assertIsNone(cmd)
        self.assertEqual((args.nnodes, args.node_rank, args.nproc_per_node), ("2", 1, "1"))

    def test_the_offload_configs_optimizer_agrees_with_the_default_flags(self):
        with open(os.path.join(fixtures.REPO, "zero_stage2_offload_config.json"), encoding="utf-8") as f:
            ds_config = json.load(f)
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1))
        optimizer = optim.build_optimizer(model, TrainingConfig(output_dir="unused"), ds_config)
        self.assertIsInstance(optimizer, DummyOptim)


if __name__ == "__main__":
    absltest.main()
