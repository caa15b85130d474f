"""Tests for t5_training.device: whether this process trains on a CUDA GPU."""
import os
import re
import subprocess
from unittest import mock

from absl.testing import absltest, parameterized

from t5_training import batching, data, device, runtime
from tests import fixtures, simulated_gpu
from tests.simulated_gpu import gpu_host


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_CHECK = os.path.join(REPO, "tools", "gpu_check.sh")


class GpuCheckScriptTest(absltest.TestCase):
    """tools/gpu_check.sh runs only on a GPU machine, once per lent session: what can be checked here, is."""

    def test_it_parses_and_names_test_files_and_flags_that_exist(self):
        subprocess.run(["bash", "-n", GPU_CHECK], check=True)
        with open(GPU_CHECK, encoding="utf-8") as f:
            script = f.read()
        named = re.findall(r"tests/\w+_test\.py", script)
        self.assertGreaterEqual(len(named), 9)
        for path in named:
            self.assertTrue(os.path.isfile(os.path.join(REPO, path)), path)
        commands = re.findall(r"benchmarks/(\w+\.py)([^>]*)>", script.replace("\\\n", " "))
        self.assertEqual(sorted({name for name, _ in commands}),
                         ["attention_kernels.py", "fine_tune_throughput.py", "memory_estimator.py",
                          "pretraining_mfu.py"])
        for name, command in commands:
            helped = subprocess.run(["python", os.path.join(REPO, "benchmarks", name), "--help"],
                                    capture_output=True, text=True, check=True).stdout
            flags = [word for word in command.split() if word.startswith("--")]
            self.assertIn("--output" if name != "fine_tune_throughput.py" else "--work_dir", flags, name)
            self.assertContainsSubset(flags, re.findall(r"--\w+", helped), name)
        configs = re.findall(r"configs/[\w.-]+\.json", script)
        self.assertGreaterEqual(len(configs), 2)
        for config in configs:
            self.assertTrue(os.path.isfile(os.path.join(REPO, config)), config)


class RehearsalTest(absltest.TestCase):
    """simulated_gpu.rehearse, the GPU check's rehearsal on a CPU: a GPU's decisions, undone after."""

    def _decisions(self):
        return (runtime.resolve_mixed_precision("auto"), batching.pad_multiple(), data.pad_multiple(),
                fixtures.same_computation(1e-6))

    def test_runs_take_a_gpus_decisions_unless_sent_to_the_cpu(self):
        before = self._decisions()  # this host's own, or a rehearsal's (tests/gpu_rehearsal.py)
        with simulated_gpu.rehearse(), mock.patch.dict(os.environ):
            os.environ.pop("ACCELERATE_USE_CPU", None)
            self.assertEqual(self._decisions(), ("bf16", 8, 8, fixtures.COARSE_RELATIVE))
            self.assertEqual(runtime.resolve_mixed_precision("no"), "no")  # an explicit choice stands
            os.environ["ACCELERATE_USE_CPU"] = "1"
            self.assertEqual(self._decisions(), ("no", 1, 1, 1e-6))
        self.assertEqual(self._decisions(), before)


class RunsOnCudaTest(parameterized.TestCase):
    @parameterized.named_parameters(
        ("gpu_process", {}, False, True),
        ("cpu_flag", {}, True, False),
        ("cpu_variable", {"ACCELERATE_USE_CPU": "yes"}, False, False),
        ("cpu_variable_off", {"ACCELERATE_USE_CPU": "0"}, False, True),
        ("cpu_named", {"ACCELERATE_TORCH_DEVICE": "cpu"}, False, False),
        ("gpu_named", {"ACCELERATE_TORCH_DEVICE": "cuda:1"}, False, True),
    )
    def test_on_a_gpu_host(self, env, cpu, expected):
        with gpu_host(**env):
            self.assertEqual(device.runs_on_cuda(cpu=cpu), expected)

    def test_a_deepspeed_cpu_run_stays_a_cpu_run_once_settled(self):
        # settle_cpu_run turns ACCELERATE_USE_CPU off for DeepSpeed's sake; the answer must not flip
        # for what reads it later (the loaders' padding and pinning).
        with gpu_host(ACCELERATE_USE_CPU="1"):
            device.settle_cpu_run(deepspeed=True)
            self.assertEqual(os.environ["ACCELERATE_USE_CPU"], "false")
            self.assertFalse(device.runs_on_cuda())
        with gpu_host(ACCELERATE_USE_CPU="1"):
            device.settle_cpu_run(deepspeed=False)
            self.assertEqual((os.environ["ACCELERATE_USE_CPU"], os.environ["DS_ACCELERATOR"]), ("1", "cpu"))
            self.assertNotIn("ACCELERATE_TORCH_DEVICE", os.environ)


if __name__ == "__main__":
    absltest.main()
