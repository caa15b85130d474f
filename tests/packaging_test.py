"""The install files agree: one torch pin everywhere, and CI runs README's test command."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile

import yaml
from absl.testing import absltest

from t5_training.top_level import FILES
from tests import cli_batch, fixtures


def _read(name):
    with open(os.path.join(fixtures.REPO, name), encoding="utf-8") as f:
        return f.read()


class PackagingTest(absltest.TestCase):
    def test_torch_is_pinned_to_one_exact_version_everywhere(self):
        deps = tomllib.loads(_read("pyproject.toml"))["project"]["dependencies"]
        pins = [d for d in deps if d.startswith("torch")]
        self.assertLen(pins, 1)
        self.assertRegex(pins[0], r"^torch==\d+\.\d+\.\d+$")
        conda = yaml.safe_load(_read("conda_environment_slurm.yml"))
        pip_section = next(d["pip"] for d in conda["dependencies"] if isinstance(d, dict))
        self.assertIn(pins[0], pip_section)
        # DeepSpeed's version comes from pyproject's extras only, not a second, older pin.
        self.assertFalse([line for line in pip_section if line.startswith("deepspeed")], pip_section)
        self.assertIn(f"pip install --quiet {pins[0]}", _read(".ci/run"))

    def test_ci_runs_the_test_command_readme_gives(self):
        readme = _read("README.md")
        first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).splitlines()
        self.assertLen(first_block, 2)
        test_command = first_block[1].split("#")[0].strip()
        self.assertEqual(test_command, "python -m pytest tests")
        ci_lines = [line.strip() for line in _read(".ci/run").splitlines()]
        self.assertIn(test_command, ci_lines)
        self.assertIn("export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline", ci_lines)

    def test_readme_first_command_installs_and_runs_the_demo(self):
        first = re.search(r"```bash\n(.*?)```", _read("README.md"), re.S).group(1).splitlines()[0]
        self.assertIn('pip install torch==', first)
        self.assertIn('-e ".[dev]"', first)
        self.assertIn("python demo.py", first)

    def test_the_sweeps_engine_is_installed_the_same_way_by_readme_and_ci(self):
        first = re.search(r"```bash\n(.*?)```", _read("README.md"), re.S).group(1).splitlines()[0]
        pin = re.search(r"pip install --no-deps (sweeps==[\d.]+)", first).group(1)
        self.assertIn(f"pip install --quiet --no-deps {pin}", _read(".ci/run"))
        # The cluster's environment: its file's instructions install the same pin the same way.
        self.assertIn(f"#   pip install --no-deps {pin}\n", _read("conda_environment_slurm.yml"))
        deps = tomllib.loads(_read("pyproject.toml"))["project"]["dependencies"]
        self.assertContainsSubset({"jsonschema", "jsonref"}, {re.split(r"[<>=]", d)[0] for d in deps})



class OptionalDependenciesTest(absltest.TestCase):
    def test_training_runs_without_deepspeed(self):
        # DeepSpeed is an optional extra, and accelerate.utils leaves out its DeepSpeed names where
        # it is not installed: the scripts must import, and an optimizer build, without it.
        code = ("import sys; sys.modules['deepspeed'] = None\n"
                "import transformers, fine_tune_t5, pre_train_t5\n"
                "from t5_training import optim\n"
                "from t5_training.config import TrainingConfig\n"
                "model = transformers.T5ForConditionalGeneration(transformers.T5Config(\n"
                "    vocab_size=32, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2))\n"
                "print(type(optim.build_optimizer(model, TrainingConfig(output_dir='unused'))).__name__)\n")
        result = subprocess.run([sys.executable, "-c", code], cwd=fixtures.REPO, capture_output=True, text=True,
                                timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertEqual(result.stdout.strip().splitlines()[-1], "AdamW")


class WheelTest(absltest.TestCase):
    """A non-editable install is one package with every module, script and model config a command needs."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        # Built from a copy: setuptools reuses a checkout's build/ folder, whose stale files (a module
        # since moved) would ship in the wheel and hide a missing one.
        source = os.path.join(cls.tmp.name, "source")
        shutil.copytree(fixtures.REPO, source, ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "mutants", "runs", "wandb", "gpu_carry", "*.egg-info", "__pycache__"))
        # --no-build-isolation: setuptools is installed already, and the build needs no network.
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                        "-w", cls.tmp.name, source], check=True, capture_output=True, cwd=cls.tmp.name)
        cls.wheel = glob.glob(os.path.join(cls.tmp.name, "*.whl"))[0]
        cls.names = set(zipfile.ZipFile(cls.wheel).namelist())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    def test_it_installs_one_package_with_the_top_level_files_inside(self):
        outside = sorted(n for n in self.names if not n.startswith(("t5_training/", "t5_training-")))
        self.assertEqual(outside, [], "a bare module in site-packages shadows (or is shadowed by) another project's")
        top_level = {os.path.basename(p) for p in glob.glob(os.path.join(fixtures.REPO, "*.py"))}
        self.assertEqual(top_level, {f"{name}.py" for name in FILES})
        self.assertContainsSubset({f"t5_training/shipped/{name}" for name in top_level}, self.names)
        entry_points = zipfile.ZipFile(self.wheel).read(
            next(n for n in self.names if n.endswith(".dist-info/entry_points.txt"))).decode()
        for command, function in (("t5-pretrain", "pretrain"), ("t5-fine-tune", "fine_tune"), ("t5-demo", "demo")):
            self.assertIn(f"{command} = t5_training.commands:{function}", entry_points)
        package = {os.path.relpath(p, fixtures.REPO).replace(os.sep, "/")
                   for p in glob.glob(os.path.join(fixtures.REPO, "t5_training", "**", "*.py"), recursive=True)}
        self.assertContainsSubset({"t5_training/tools/memory.py", "t5_training/tools/sweep/cli.py"}, package)
        self.assertContainsSubset(package, self.names)

    def test_every_model_config_ships_inside_the_package(self):
        configs = {f"t5_training/configs/{os.path.basename(p)}"
                   for p in glob.glob(os.path.join(fixtures.REPO, "configs", "*.json"))}
        self.assertLen(configs, 5)
        self.assertContainsSubset(configs, self.names)

    def test_commands_run_from_the_unpacked_wheel_outside_the_checkout(self):
        site = os.path.join(self.tmp.name, "site")
        zipfile.ZipFile(self.wheel).extractall(site)
        env = {**os.environ, "PYTHONPATH": site, "HF_HUB_OFFLINE": "1"}
        # Another project's `constants` where the command runs: the wheel reads its own registry.
        with open(os.path.join(self.tmp.name, "constants.py"), "w", encoding="utf-8") as f:
            f.write("raise ImportError('another project')\n")
        probe = ("import t5_training.tools.dataset_stats\n"
                 "from t5_training import top_level\n"
                 "from t5_training.model_sources import resolve_config_name\n"
                 "print(top_level.load('pre_train_t5').__file__, top_level.load('constants').__name__,\n"
                 "      resolve_config_name('t5-tiny'),\n"
                 "      resolve_config_name('configs/t5-base.json'), resolve_config_name('google/t5-v1_1-small'))")
        commands = [["-m", "t5_training.dataset_stats", "--help"], ["-m", "t5_training.commands", "pretrain", "--help"],
                    ["-c", "from t5_training.commands import fine_tune; fine_tune()", "--help"],
                    ["-m", "t5_training.sweep", "--help"],
                    # its default --config_name is configs/t5-small.json, the checkout's path
                    ["-m", "t5_training.memory", "--batch_size", "1", "--source_length", "8", "--target_length", "2"]]
        # One Python start for all five, each command in a forked process (tests/cli_batch.py).
        probe_run, *runs = cli_batch.run_python([["-c", probe], *commands], preload=["torch", "transformers"],
                                                cwd=self.tmp.name, env=env)
        self.assertEqual(probe_run["returncode"], 0, probe_run["stderr"][-2000:])
        out = probe_run["stdout"].split()
        self.assertTrue(out[0].startswith(os.path.join(site, "t5_training", "shipped")), out[0])
        self.assertEqual(out[1], "t5_training.shipped.constants")
        for path in out[2:4]:  # the wheel's copies, not the checkout's
            self.assertTrue(path.startswith(site), path)
        self.assertTrue(out[2].endswith(os.path.join("t5_training", "configs", "t5-tiny.json")))
        self.assertTrue(out[3].endswith(os.path.join("t5_training", "configs", "t5-base.json")))
        self.assertEqual(out[4], "google/t5-v1_1-small")  # a hub name stays a hub name
        for command, run in zip(commands, runs):
            self.assertEqual(run["returncode"], 0, f"{command}: {run['stderr'][-800:]}")
        self.assertIn("60.5M parameters", run["stdout"])


if __name__ == "__main__":
    absltest.main()
