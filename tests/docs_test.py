"""Docs that cannot drift: every `--flag` a documented project command passes is one its parser knows.

The commands come from the fenced shell blocks of README.md and docs/**/*.md (tests/doc_commands.py
says which blocks and commands count); each is checked against the parser its script's main()
builds, so a flag renamed in a config dataclass or an argparse parser fails here until the docs
follow.
"""
from __future__ import annotations

import difflib
import glob
import os
import re

from absl.testing import absltest

from tests import doc_commands, fixtures

# Fewer would mean the extraction stopped seeing the docs' commands, not that the docs lost them:
# README's quick start, fine-tuning, pretraining and tools blocks, and the pages' blocks.
MIN_README_COMMANDS = 12
MIN_README_FLAGS = 40
MIN_DOCS_COMMANDS = 60


def doc_files() -> list[str]:
    """README.md and every markdown file under docs/, relative to the repository root."""
    docs = glob.glob(os.path.join(fixtures.REPO, "docs", "**", "*.md"), recursive=True)
    return ["README.md", *sorted(os.path.relpath(path, fixtures.REPO) for path in docs)]


def unknown_flags(commands: list[doc_commands.Command]) -> list[str]:
    """One line per flag its command's parser does not know: file:line, the flag, the closest known flag."""
    problems = []
    for command in commands:
        try:
            known = doc_commands.options_of(command.target)
        except (FileNotFoundError, ModuleNotFoundError) as err:  # a script or module the docs name is gone
            problems.append(f"{command.where}: {err}\n    {command.text}")
            continue
        for flag in command.flags:
            if flag not in known:
                close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(f"{command.where}: unknown flag {flag}{hint}\n    {command.text}")
    return problems


def read_commands(path: str) -> list[doc_commands.Command]:
    return doc_commands.commands_in(_read(path), path)


class DocsFlagsTest(absltest.TestCase):

    def test_every_documented_flag_is_one_its_command_takes(self):
        commands = [command for path in doc_files() for command in read_commands(path)]
        problems = unknown_flags(commands)
        self.assertEqual(problems, [], "flags in the docs that their command does not take:\n" + "\n".join(problems))

    def test_the_pages_show_enough_commands_to_check(self):
        commands = [command for path in doc_files()[1:] for command in read_commands(path)]
        self.assertGreaterEqual(len(commands), MIN_DOCS_COMMANDS)
        targets = {command.target for command in commands}
        for target in ("script:fine_tune_t5.py", "script:pre_train_t5.py", "module:t5_training.memory",
                       "module:t5_training.sweep", "script:demo.py"):
            self.assertIn(target, targets)

    def test_the_readme_shows_enough_commands_to_check(self):
        commands = read_commands("README.md")
        self.assertGreaterEqual(len(commands), MIN_README_COMMANDS)
        self.assertGreaterEqual(sum(len(command.flags) for command in commands), MIN_README_FLAGS)
        targets = {command.target for command in commands}
        for target in ("script:fine_tune_t5.py", "script:pre_train_t5.py", "module:t5_training.tokenizer"):
            self.assertIn(target, targets)

    def test_a_misspelt_flag_is_reported_with_the_flag_meant(self):
        readme = ("# Fine-tuning\n\n```bash\npython fine_tune_t5.py --benchmark glue --dataset_name sst2 \\\n"
                  "    --learning_rat 1e-4 --output_dir runs/sst2  # a comment --not_a_flag\n```\n")
        problems = unknown_flags(doc_commands.commands_in(readme, "README.md"))
        self.assertLen(problems, 1)
        self.assertIn("README.md:4: unknown flag --learning_rat (did you mean --learning_rate?)", problems[0])
        self.assertIn("python fine_tune_t5.py --benchmark glue", problems[0])

    def test_each_way_of_running_a_command_reaches_its_parser(self):
        readme = "\n".join([
            "```console", "$ accelerate launch --num_processes 2 pre_train_t5.py --objective ul2 --bad_one 1",
            "some output --not_checked", "```", "```", "t5-fine-tune --dataset_name=sst2 --bad_two",
            "srun --nodes=2 python fine_tune_t5.py --config run.yaml && python -m t5_training.memory --bad_three",
            "python -m t5_training.commands demo --bad_four; SCRIPT=pre_train_t5.py sbatch --nodes=4 "
            "slurm/multi_node.sbatch --objective ul2 --bad_five",
            "python benchmarks/peft.py --bad_six | tee log",
            "python -m t5_training.sweep sweeps/glue_sst2.yaml --bad_seven -- --data_dir d --bad_eight",
            "pip install --upgrade t5 && git log --oneline", "```", "```python", "main(['--bad_python'])", "```"])
        commands = doc_commands.commands_in(readme, "README.md")
        self.assertEqual([c.target for c in commands], [
            "script:pre_train_t5.py", "script:fine_tune_t5.py", "script:fine_tune_t5.py", "module:t5_training.memory",
            "script:demo.py", "script:pre_train_t5.py", "script:benchmarks/peft.py", "module:t5_training.sweep",
            "script:fine_tune_t5.py"])
        self.assertEqual([re.search(r"unknown flag (\S+)", problem).group(1) for problem in unknown_flags(commands)],
                         ["--bad_one", "--bad_two", "--bad_three", "--bad_four", "--bad_five", "--bad_six",
                          "--bad_seven", "--bad_eight"])

    def test_a_script_the_docs_name_must_exist(self):
        problems = unknown_flags(doc_commands.commands_in("```bash\npython fine_tune.py --seed 1\n```\n", "x.md"))
        self.assertEqual(problems, ["x.md:2: no such script in the repository: fine_tune.py\n"
                                    "    python fine_tune.py --seed 1"])


# [text](target): a relative target is a file of the repository, with an optional #anchor.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    found = set()
    in_fence = False
    for line in markdown.splitlines():
        if doc_commands.FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def broken_links(path: str, markdown: str) -> list[str]:
    """One line per relative link in `markdown` (the file at `path`) whose file or anchor does not exist."""
    problems = []
    for number, line in enumerate(markdown.splitlines(), 1):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:: not the repository's
                continue
            file, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            full = os.path.join(fixtures.REPO, resolved)
            if not os.path.exists(full):
                problems.append(f"{path}:{number}: {target}: no such file {resolved}")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(_read(resolved)):
                problems.append(f"{path}:{number}: {target}: {resolved} has no heading #{anchor}")
    return problems


class DocsLinksTest(absltest.TestCase):

    def test_every_relative_link_reaches_a_file_and_heading(self):
        problems = [problem for path in doc_files() for problem in broken_links(path, _read(path))]
        self.assertEqual(problems, [], "links in the docs that lead nowhere:\n" + "\n".join(problems))

    def test_a_wrong_file_or_heading_is_reported(self):
        page = "see [a](fine-tuning.md#no-such-heading), [b](gone.md), [c](reliability.md#exit-codes), [d](https://x.y)"
        self.assertEqual(broken_links("docs/x.md", page), [
            "docs/x.md:1: fine-tuning.md#no-such-heading: docs/fine-tuning.md has no heading #no-such-heading",
            "docs/x.md:1: gone.md: no such file docs/gone.md"])


class StatedFiguresTest(absltest.TestCase):
    """Figures the docs state about the code are the code's: stated once, and checked here."""

    # README's quick start: "configs/t5-tiny.json), 1.43M parameters with the demo's 4,000-piece vocabulary".
    TINY = re.compile(r"configs/t5-tiny\.json\)?,\s+([\d.]+)M parameters with the demo's ([\d,]+)-piece vocabulary")
    # A parameter count such as "1.4M parameters" or "a 2M-parameter model".
    ANY_COUNT = re.compile(r"\d[\d.,]*\s?[MBK][- ]param", re.I)

    def test_the_demo_model_size_is_the_configs(self):
        import json

        import torch
        import transformers

        import demo

        match = self.TINY.search(_read("README.md"))
        self.assertIsNotNone(match, "README no longer states t5-tiny's size where this test looks for it")
        vocab = int(match.group(2).replace(",", ""))
        self.assertEqual(vocab, demo.DemoConfig.vocab_size)
        with open(fixtures.TINY_CONFIG, encoding="utf-8") as f:
            config = transformers.T5Config(**{**json.load(f), "vocab_size": vocab})
        with torch.device("meta"):  # shapes only: nothing is allocated
            parameters = transformers.T5ForConditionalGeneration(config).num_parameters()
        self.assertEqual(match.group(1), f"{parameters / 1e6:.2f}")

    def test_no_page_states_another_parameter_count(self):
        # One count, the one checked above: the rest link to the config instead of restating it.
        found = [f"{path}: {m.group(0)}" for path in doc_files() for m in self.ANY_COUNT.finditer(_read(path))]
        self.assertEqual(found, ["README.md: 1.43M param"])


def _read(path: str) -> str:
    with open(os.path.join(fixtures.REPO, path), encoding="utf-8") as f:
        return f.read()


if __name__ == "__main__":
    absltest.main()
