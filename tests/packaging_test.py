"""The install files agree: one torch pin everywhere, and CI runs README's test command."""
import os
import re
import tomllib

import yaml
from absl.testing import absltest

from tests import fixtures


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
        deps = tomllib.loads(_read("pyproject.toml"))["project"]["dependencies"]
        self.assertContainsSubset({"jsonschema", "jsonref"}, {re.split(r"[<>=]", d)[0] for d in deps})


if __name__ == "__main__":
    absltest.main()
