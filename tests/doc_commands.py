"""The project's commands the docs show, and the flags each passes: what tests/docs_test.py checks.

Which blocks: fenced blocks labelled bash, sh, shell, zsh or console, and unlabelled ones (the
README's unlabelled blocks hold output, file trees and pseudocode, where no line starts with a
project command, but a command pasted into one later is checked all the same). Python, YAML and
other labelled blocks are not shell. In a console block only `$ ` lines are commands.

Inline code spans in prose (`python benchmarks/peft.py --threads 1`) are read as command lines too.

A command is the project's when it runs one of its scripts (`python X.py`, through `accelerate
launch`, `srun`, `torchrun` or `env VAR=...` too), a `t5-*` console command, `python -m t5_training...`,
or `sbatch slurm/{single,multi}_node.sbatch`, which hand what follows them to $SCRIPT
(fine_tune_t5.py unless the command sets SCRIPT=). Launchers' own flags (before the script) are
not checked; a `--` ends the flags, as in argparse, except that the flags after a sweep runner's
`--` go to every trial, and are checked against the sweep YAML's `program`.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import os
import re
import shlex
import sys
from unittest import mock

import yaml
from transformers import HfArgumentParser

from t5_training.commands import COMMANDS
from tests import fixtures

SHELL_LANGUAGES = ("bash", "sh", "shell", "zsh", "console", "")
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
INLINE_CODE = re.compile(r"`([^`]+)`")
# pyproject.toml's console commands: t5-pretrain, t5-fine-tune, t5-demo (commands.py's docstring).
CONSOLE_COMMANDS = {f"t5-{name}": script for name, script in COMMANDS.items()}
# Programs that run the command named further on in their arguments.
LAUNCHERS = ("python", "python3", "accelerate", "srun", "torchrun", "env", "time", "nohup", "exec")
# sbatch scripts that pass the words after their name to the training script $SCRIPT.
FORWARDING_SBATCH = ("slurm/single_node.sbatch", "slurm/multi_node.sbatch")
# Words that start a command inside a loop or a condition: `for t in a b; do python demo.py; done`.
SHELL_KEYWORDS = ("do", "then", "else", "!")
SWEEP_RUNNERS = ("module:t5_training.sweep", "module:t5_training.tools.sweep.cli")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&"}


@dataclasses.dataclass(frozen=True)
class Command:
    """One project command in the docs: where, what it runs (a key of `options_of`), its `--flags`."""

    where: str  # file:line
    text: str
    target: str
    flags: tuple[str, ...]


def shell_lines(text: str, path: str) -> list[tuple[str, str]]:
    """(file:line, logical line) for each command line of the shell blocks in markdown `text`."""
    lines, language, pending, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence:
            language = None if language is not None else fence.group(2).lower()
            continue
        if language is None:  # prose: its inline code spans, `python benchmarks/peft.py --threads 1` among them
            lines += [(f"{path}:{number}", span) for span in INLINE_CODE.findall(line)]
            continue
        if language not in SHELL_LANGUAGES:
            continue
        stripped = line.strip()
        if not pending:
            start = number
            if language == "console" and not stripped.startswith("$ "):
                continue
            stripped = stripped[2:] if stripped.startswith("$ ") else stripped
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((f"{path}:{start}", pending + stripped))
        pending = ""
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """A logical line's words, comments dropped, split at &&, ||, ;, | and parentheses."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: not a command line (output or prose)
        return []
    commands = [[]]
    for word in words:
        if word in SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(word)
    return [c for c in commands if c]


def _is_assignment(word: str) -> bool:
    return re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", word) is not None


def target_of(words: list[str]) -> tuple[str, list[str]] | None:
    """(what the command runs, the words its parser reads), or None when it is not a project command."""
    env = dict(w.split("=", 1) for w in words if _is_assignment(w))
    words = [w for w in words if not _is_assignment(w)]
    while words and words[0] in SHELL_KEYWORDS:
        words = words[1:]
    if not words:
        return None
    program = os.path.basename(words[0])
    if program in CONSOLE_COMMANDS:
        return f"script:{CONSOLE_COMMANDS[program]}.py", words[1:]
    if program == "sbatch":
        script = next((i for i, w in enumerate(words) if w in FORWARDING_SBATCH), None)
        if script is None:
            return None
        return f"script:{env.get('SCRIPT', 'fine_tune_t5.py')}", words[script + 1:]
    if program not in LAUNCHERS:
        return None
    for i, word in enumerate(words[1:], 1):
        if word == "-m" and i + 1 < len(words):
            module = words[i + 1]
            if module == "t5_training.commands" and i + 2 < len(words):
                return f"script:{COMMANDS.get(words[i + 2], words[i + 2])}.py", words[i + 3:]
            return (f"module:{module}", words[i + 2:]) if module.startswith("t5_training") else None
        if word.endswith(".py") and not word.startswith("-"):
            return f"script:{os.path.normpath(word)}", words[i + 1:]
    return None


def flags_of(words: list[str]) -> tuple[str, ...]:
    """The `--flag`s among a command's words (`--flag=value` is `--flag`), up to a `--`."""
    words = words[:words.index("--")] if "--" in words else words
    return tuple(w.split("=", 1)[0] for w in words if w.startswith("--") and len(w) > 2)


def commands_in(text: str, path: str) -> list[Command]:
    """The project commands of markdown `text` (named `path` in messages), in order."""
    found = []
    for where, line in shell_lines(text, path):
        for words in simple_commands(line):
            target = target_of(words)
            if target is not None:
                found.append(Command(where, " ".join(words), target[0], flags_of(target[1])))
                trials = trial_target(*target)
                if trials is not None:
                    found.append(Command(where, " ".join(words), trials[0], flags_of(trials[1])))
    return found


def trial_target(target: str, words: list[str]) -> tuple[str, list[str]] | None:
    """A sweep runner's `-- FLAGS` go to every trial: (the sweep YAML's program, those flags), if the YAML exists."""
    if target not in SWEEP_RUNNERS or "--" not in words:
        return None
    sweep_file = os.path.join(fixtures.REPO, next((w for w in words if w.endswith((".yaml", ".yml"))), ""))
    if not os.path.isfile(sweep_file):
        return None
    with open(sweep_file, encoding="utf-8") as f:
        program = yaml.safe_load(f).get("program")
    return (f"script:{program}", words[words.index("--") + 1:]) if program else None


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__()
        self.parser = parser


def _load(target: str):
    """The module `target` names: a t5_training module, a top-level script, or another .py file of the repo."""
    kind, name = target.split(":", 1)
    if kind == "module":
        return importlib.import_module(name)
    path = os.path.join(fixtures.REPO, name)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such script in the repository: {name}")
    if os.path.dirname(name) == "":
        return importlib.import_module(name[:-3])
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.append(folder)  # benchmarks import _harness; last on the path, as _harness puts it
    spec = importlib.util.spec_from_file_location("docs_" + re.sub(r"\W", "_", name[:-3]), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=None)
def options_of(target: str) -> frozenset[str]:
    """The option strings `target`'s main() accepts, from the very parser it builds.

    main() runs until it parses its command line and is stopped there (argparse's parse_known_args,
    which parse_args and HfArgumentParser both call, raises instead), so nothing runs past the
    parse and no script needs a seam for this test. parse_config's parser also takes --config FILE.
    """
    def stop(self, *args, **kwargs):
        raise _Parsed(self)

    with mock.patch.dict(os.environ), contextlib.ExitStack() as stack:
        module = _load(target)
        stack.enter_context(mock.patch.object(argparse.ArgumentParser, "parse_known_args", stop))
        try:
            module.main()
        except _Parsed as parsed:
            parser = parsed.parser
        else:
            raise AssertionError(f"{target}: main() returned without parsing a command line")
    options = {option for action in parser._actions for option in action.option_strings}
    if isinstance(parser, HfArgumentParser):
        options.add("--config")  # t5_training.config.parse_config reads it before the parser sees the words
    return frozenset(options)
