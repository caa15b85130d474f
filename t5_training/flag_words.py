"""The words of a command line before argparse reads them: a --config file's flags put first, a
repeated list flag's values joined, unknown flags refused. parse_config (config.py) reads what these return."""
from __future__ import annotations

import difflib
import json
import os
from typing import Sequence

import yaml

from t5_training.errors import UsageError, first_line


def flag_name(word: str) -> str:
    """The flag a word names: `--lr=3e-4` (how a W&B agent passes values) and `--lr` alike."""
    return word.split("=", 1)[0]


def join_repeated_lists(words: list[str], lists: dict[str, str]) -> list[str]:
    """`--train_file a --train_file b` as `--train_file a b`: every value of a list flag given more
    than once on the command line, where it first stands. argparse would keep the last alone, and a
    run would silently read part of what it was given. (Against a --config file's value the command
    line's still wins whole: the file's words come first.) `lists` maps each spelling of a list flag
    (--train_file, --train-file) to its field. An occurrence without values is left for argparse to refuse."""
    occurrences: list[tuple[str | None, list[str]]] = []  # (a list flag, its values), or (None, other words)
    for word in words:
        name = flag_name(word)
        if word.startswith("--") and name in lists:
            occurrences.append((name, [word.split("=", 1)[1]] if "=" in word else []))
        elif not word.startswith("--") and occurrences and occurrences[-1][0] is not None:
            occurrences[-1][1].append(word)
        else:
            occurrences.append((None, [word]))
    joined: dict[str, list[str]] = {}
    for flag, values in occurrences:
        if flag is not None and values:
            joined.setdefault(lists[flag], []).extend(values)
    out: list[str] = []
    for flag, values in occurrences:
        if flag is None:
            out.extend(values)
        elif not values:
            out.append(flag)
        elif lists[flag] in joined:
            out.extend([flag, *joined.pop(lists[flag])])
    return out


def split_config_file(words: list[str]) -> tuple[str | None, list[str], list[str]]:
    """(the `--config FILE` path, the flags the file holds as words, every other word); the
    caller puts the file's words first, so that the command line's flags win."""
    places = [i for i, word in enumerate(words) if word == "--config" or word.startswith("--config=")]
    if not places:
        return None, [], words
    paths = [words[i].split("=", 1)[1] if "=" in words[i] else (words[i + 1] if i + 1 < len(words) else "")
             for i in places]
    if len(places) > 1:
        raise UsageError(f"--config given {len(places)} times ({', '.join(map(repr, paths))}); pass one file, "
                         "and give other flags on the command line, which win over the file's")
    i, word = places[0], words[places[0]]
    return paths[0], file_to_words(paths[0]), words[:i] + words[i + (1 if "=" in word else 2):]


def file_to_words(path: str) -> list[str]:
    """A --config file's flag: value pairs as command-line words (a list: one flag, several words)."""
    if not path or not os.path.isfile(path):
        raise UsageError(f"--config file {path!r} not found; pass a YAML or JSON file of flag: value pairs")
    with open(path, encoding="utf-8") as f:
        try:
            values = json.load(f) if path.endswith(".json") else yaml.safe_load(f)
        except (json.JSONDecodeError, yaml.YAMLError) as err:
            raise UsageError(f"--config file {path} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: "
                             f"{first_line(err)}") from None
    if not isinstance(values, dict):
        raise UsageError(f"--config file {path} must hold a mapping of flag: value pairs")
    if "config" in values:
        raise UsageError(f"--config file {path} names another with config:; merge the two into one file")
    words = []
    for key, value in values.items():
        if value is None:
            continue
        words.append(f"--{key}")
        items = value if isinstance(value, list) else [value]
        words.extend(str(item).lower() if isinstance(item, bool) else str(item) for item in items)
    return words


def refuse_unknown(words: Sequence[str], known: list[str], where: str) -> None:
    """An unknown or misspelt flag among `words`, in one line naming the closest known flag."""
    for word in words:
        flag = flag_name(word)
        if flag.startswith("--") and flag not in known:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else "; run with --help to list the flags"
            raise UsageError(f"unknown flag {flag}{where}{hint}")


def refuse_file_lists(words: Sequence[str], lists: dict[str, str], path: str | None) -> None:
    """A --config file's list for a flag that takes one value: argparse would call its second item
    an unexpected argument, naming neither the file nor the flag."""
    flag, count = None, 0
    for word in [*words, "--"]:
        if word.startswith("--"):
            if flag is not None and flag not in lists and count > 1:
                raise UsageError(f"--config file {path}: {flag[2:]} is a list, but {flag} takes one value")
            flag, count = word, 0
        else:
            count += 1
