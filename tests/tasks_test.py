"""Golden T5 text for every GLUE task, and the scorers, label checks and lookups of t5_training.tasks.

The expected strings are written out by hand from the files' rows, following Google's T5
(t5.data.preprocessors.glue): "<task> key1: v1 key2: v2" with the keys sorted by name, and the
TFDS class name (or STS-B's score rounded to 0.2) as the target.
"""

import dataclasses
import functools
import os
import tempfile

from absl.testing import absltest, parameterized

from t5_training import data, tasks
from t5_training.errors import UsageError
from tests import fixtures


@functools.lru_cache(maxsize=None)
def _validation(task, folder):
    """The real GLUE dev file (read in place, never copied into the project)."""
    return data.load_splits(tasks.get_entry("glue", task), data_dir=fixtures.real_data(folder))["validation"]


def _format_row(task, ds, i):
    formatted = tasks.make_formatter(tasks.get_entry("glue", task))(ds[i:i + 1])
    return formatted["source"][0], formatted["target"][0]


class RealRowsTest(parameterized.TestCase):

    @parameterized.named_parameters(
        # SST-2's sentences end with a space in the file; T5 joins the raw text, so it stays.
        ("sst2_first", "sst2", "SST-2", 0,
         "sst2 sentence: it 's a charming and often affecting journey . ", "positive"),
        ("sst2_second", "sst2", "SST-2", 1,
         "sst2 sentence: unflinchingly bleak and desperate ", "negative"),
        ("cola_first", "cola", "CoLA", 0,
         "cola sentence: The sailors rode the breeze clear of the rocks.", "acceptable"),
        ("cola_starred", "cola", "CoLA", 4,
         "cola sentence: As you eat the most, you want the least.", "unacceptable"),
        # The unbalanced quote is text: the files are read with QUOTE_NONE.
        ("mrpc_first", "mrpc", "MRPC", 0,
         "mrpc sentence1: He said the foodservice pie business doesn't fit the company's long-term growth "
         'strategy. sentence2: "The foodservice pie business does not fit our long-term growth strategy.',
         "equivalent"),
        ("mrpc_second", "mrpc", "MRPC", 1,
         "mrpc sentence1: Magnarelli said Racicot hated the Iraqi regime and looked forward to using his long "
         'years of training in the war. sentence2: His wife said he was "100 percent behind George Bush" and '
         "looked forward to using his years of training in the war.",
         "not_equivalent"),
        ("stsb_first", "stsb", "STS-B", 0,
         "stsb sentence1: A man with a hard hat is dancing. sentence2: A man wearing a hard hat is dancing.",
         "5.0"),
    )
    def test_golden(self, task, folder, row, source, target):
        self.assertEqual(_format_row(task, _validation(task, folder), row), (source, target))

    @parameterized.named_parameters(
        # (row, score in the file, T5 target): tf.round rounds half to even, in float32.
        ("quarter_up", 1, 4.75, "4.8", "A young child is riding a horse.", "A child is riding a horse."),
        ("half_to_even_down_0_4", 50, 0.5, "0.4",
         "Two little girls are talking on the phone.", "A little girl is walking down the street."),
        ("half_to_even_down_2_4", 208, 2.5, "2.4",
         "A monkey is karate kicking a person.", "A monkey pratices martial arts."),
        ("half_to_even_down_4_4", 49, 4.5, "4.4",
         "A man is fitting silencer on a pistol.", "A man is adding a silencer to a gun."),
        ("half_to_even_up_1_6", 1167, 1.5, "1.6",
         "The Dow Jones Industrial Average fell 0.7 per cent to 9,547.43 while the S&P 500 was 0.8 per cent "
         "weaker at 1,025.79.",
         "The Dow Jones industrial average <.DJI> fell 44 points, or 0.46 percent, to 9,568."),
        ("half_to_even_up_3_6", 1100, 3.5, "3.6",
         '"Now, the other guy, he\'s ashamed of his party," Street said to crowd laughter.',
         '"The other guy, he\'s ashamed of his party, and I don\'t blame him.'),
        # float32(0.1) * 5 is exactly 0.5, which rounds to 0; float64 would give 0.2.
        ("float32_tenth", 231, 0.1, "0.0",
         "A baby is crawling happily.", "A cat is walking on hardwood floor."),
    )
    def test_stsb_rounding(self, row, score, target, sentence1, sentence2):
        ds = _validation("stsb", "STS-B")
        self.assertEqual(ds[row], {"sentence1": sentence1, "sentence2": sentence2, "label": score})
        self.assertEqual(_format_row("stsb", ds, row),
                         (f"stsb sentence1: {sentence1} sentence2: {sentence2}", target))


# Rows in the original GLUE layouts (header included), for the tasks without files here.
QQP_HEADER = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
QQP_TRAIN = "0\t1\t2\tWhat is the step by step guide to invest in share market?\tHow do I invest in shares?\t0"
QQP_DEV = '40\t79\t80\tWhat does "namaste" mean?\tWhat is the meaning of the word "namaste"?\t1'

MNLI_TRAIN_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                     "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
MNLI_DEV_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                   "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tlabel2\tlabel3\tlabel4\t"
                   "label5\tgold_label")
MNLI_TRAIN = ("0\t31193\t31193n\tgovernment\t( ( Conceptually cream ) skimming )\t( ( Product and ) geography )\t"
              "(ROOT (S (NP (JJ Conceptually) (NN cream))))\t(ROOT (S (NP (NN Product))))\t"
              "Conceptually cream skimming has two basic dimensions - product and geography.\t"
              "Product and geography are what make cream skimming work.\tneutral\tneutral")
# label1 differs from gold_label on purpose: the target is the gold label.
MNLI_MATCHED = ("0\t63735\t63735n\tslate\t( ( The ( new rights ) ) )\t( Everyone ( really likes ) )\t"
                "(ROOT (S (NP (DT The))))\t(ROOT (S (NP (NN Everyone))))\t"
                "The new rights are nice enough\tEveryone really likes the newest benefits\t"
                "entailment\tneutral\tneutral\tneutral\tneutral\tneutral")
MNLI_MISMATCHED = ("0\t75290\t75290c\tletters\t( ( Your contribution ) )\t( ( Your contributions ) )\t"
                   "(ROOT (S (NP (PRP$ Your))))\t(ROOT (S (NP (PRP$ Your))))\t"
                   "Your contribution helped make it possible for us to provide our students with a quality "
                   "education.\tYour contributions were of no help with our students' education.\t"
                   "contradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction\tcontradiction")

QNLI_HEADER = "index\tquestion\tsentence\tlabel"
QNLI_TRAIN = ("0\tWhen did the third Digimon series begin?\tUnlike the two seasons before it, the third season "
              "is not set in the same universe.\tnot_entailment")
QNLI_DEV = ("0\tWhat came into force after the new constitution was herald?\tAs of that day, the new "
            "constitution heralding the Second Republic came into force.\tentailment")

RTE_HEADER = "index\tsentence1\tsentence2\tlabel"
RTE_TRAIN = ("0\tNo Weapons of Mass Destruction Found in Iraq Yet.\tWeapons of Mass Destruction Found in Iraq."
             "\tnot_entailment")
RTE_DEV = ("0\tDana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age 44, according "
           "to the Christopher Reeve Foundation.\tChristopher Reeve had an accident.\tnot_entailment")

WNLI_HEADER = "index\tsentence1\tsentence2\tlabel"
WNLI_TRAIN = "0\tI stuck a pin through a carrot. When I pulled the pin out, it had a hole.\tThe carrot had a hole.\t1"
WNLI_DEV = ("0\tThe drain is clogged with hair. It has to be cleaned.\tThe hair has to be cleaned.\t0\n"
            "1\tJane knocked on Susan's door but she did not answer.\tSusan did not answer.\t1")

LAYOUTS = {
    "qqp": {"train.tsv": [QQP_HEADER, QQP_TRAIN], "dev.tsv": [QQP_HEADER, QQP_DEV]},
    "mnli": {"train.tsv": [MNLI_TRAIN_HEADER, MNLI_TRAIN],
             "dev_matched.tsv": [MNLI_DEV_HEADER, MNLI_MATCHED],
             "dev_mismatched.tsv": [MNLI_DEV_HEADER, MNLI_MISMATCHED]},
    "qnli": {"train.tsv": [QNLI_HEADER, QNLI_TRAIN], "dev.tsv": [QNLI_HEADER, QNLI_DEV]},
    "rte": {"train.tsv": [RTE_HEADER, RTE_TRAIN], "dev.tsv": [RTE_HEADER, RTE_DEV]},
    "wnli": {"train.tsv": [WNLI_HEADER, WNLI_TRAIN], "dev.tsv": [WNLI_HEADER, WNLI_DEV]},
}


class GlueLayoutTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory()
        for task, files in LAYOUTS.items():
            os.makedirs(os.path.join(cls._tmp.name, task))
            for name, lines in files.items():
                with open(os.path.join(cls._tmp.name, task, name), "w", encoding="utf-8") as f:
                    f.write("\n".join(lines) + "\n")

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
        super().tearDownClass()

    def _splits(self, task):
        return data.load_splits(tasks.get_entry("glue", task), data_dir=os.path.join(self._tmp.name, task))

    @parameterized.named_parameters(
        ("qqp", "qqp", "validation", 0,
         'qqp question1: What does "namaste" mean? question2: What is the meaning of the word "namaste"?',
         "duplicate"),
        ("qqp_train", "qqp", "train", 0,
         "qqp question1: What is the step by step guide to invest in share market? "
         "question2: How do I invest in shares?",
         "not_duplicate"),
        # T5 sorts the keys: the hypothesis (the TSV's sentence2) comes before the premise.
        ("mnli_matched", "mnli", "validation_matched", 0,
         "mnli hypothesis: Everyone really likes the newest benefits premise: The new rights are nice enough",
         "neutral"),
        ("mnli_mismatched", "mnli", "validation_mismatched", 0,
         "mnli hypothesis: Your contributions were of no help with our students' education. premise: Your "
         "contribution helped make it possible for us to provide our students with a quality education.",
         "contradiction"),
        ("mnli_train", "mnli", "train", 0,
         "mnli hypothesis: Product and geography are what make cream skimming work. premise: Conceptually "
         "cream skimming has two basic dimensions - product and geography.",
         "neutral"),
        ("qnli", "qnli", "validation", 0,
         "qnli question: What came into force after the new constitution was herald? sentence: As of that day, "
         "the new constitution heralding the Second Republic came into force.",
         "entailment"),
        ("rte", "rte", "validation", 0,
         "rte sentence1: Dana Reeve, the widow of the actor Christopher Reeve, has died of lung cancer at age "
         "44, according to the Christopher Reeve Foundation. sentence2: Christopher Reeve had an accident.",
         "not_entailment"),
        ("rte_train", "rte", "train", 0,
         "rte sentence1: No Weapons of Mass Destruction Found in Iraq Yet. "
         "sentence2: Weapons of Mass Destruction Found in Iraq.",
         "not_entailment"),
        # WNLI files hold ids, and class 0 is not_entailment (the reverse of RTE).
        ("wnli_0", "wnli", "validation", 0,
         "wnli sentence1: The drain is clogged with hair. It has to be cleaned. "
         "sentence2: The hair has to be cleaned.",
         "not_entailment"),
        ("wnli_1", "wnli", "validation", 1,
         "wnli sentence1: Jane knocked on Susan's door but she did not answer. sentence2: Susan did not answer.",
         "entailment"),
    )
    def test_golden(self, task, split, row, source, target):
        splits = self._splits(task)
        self.assertEqual(_format_row(task, splits[split], row), (source, target))

    @parameterized.named_parameters(
        ("qqp", "qqp", {"train": [0], "validation": [1]}),
        ("mnli", "mnli", {"train": [1], "validation_matched": [1], "validation_mismatched": [2]}),
        ("qnli", "qnli", {"train": [1], "validation": [0]}),
        ("rte", "rte", {"train": [1], "validation": [1]}),
        ("wnli", "wnli", {"train": [1], "validation": [0, 1]}),
    )
    def test_splits_and_class_ids(self, task, labels):
        splits = self._splits(task)
        self.assertEqual({split: ds["label"] for split, ds in splits.items()}, labels)

    def test_mnli_columns_renamed(self):
        matched = self._splits("mnli")["validation_matched"]
        self.assertEqual(matched.column_names, ["hypothesis", "premise", "label"])
        self.assertEqual(matched[0]["premise"], "The new rights are nice enough")
        self.assertEqual(matched[0]["hypothesis"], "Everyone really likes the newest benefits")


class FormatterTest(parameterized.TestCase):

    def test_unlabelled_row_is_unk(self):
        # GLUE test sets carry label -1; T5 writes "<unk>".
        self.assertEqual(tasks.target_text(tasks.get_entry("glue", "rte"), -1), "<unk>")

    def test_seq2seq_without_keys(self):
        entry = tasks.get_entry("seq2seq", "summarization")
        formatted = tasks.make_formatter(entry)({"source": ["A long text."], "target": ["Short."]})
        self.assertEqual(formatted, {"source": ["summarize: A long text."], "target": ["Short."]})

    def test_comet_keys(self):
        entry = tasks.get_entry("seq2seq", "comet")
        formatted = tasks.make_formatter(entry)({"head": ["PersonX buys a car"], "relation": ["xIntent"],
                                                 "tail": ["to drive"]})
        self.assertEqual(formatted, {"source": ["comet head: PersonX buys a car relation: xIntent"],
                                     "target": ["to drive"]})

    def test_numbers_and_empty_cells_in_inputs(self):
        # CSV/JSON columns can hold numbers, and an empty CSV cell arrives as None.
        entry = tasks.get_entry("seq2seq", "comet")
        formatted = tasks.make_formatter(entry)({"head": [1999, None], "relation": ["year", "x"],
                                                 "tail": ["a", "b"]})
        self.assertEqual(formatted["source"], ["comet head: 1999 relation: year", "comet head:  relation: x"])

    def test_no_prefix_starts_with_the_first_column(self):
        # An entry without a prefix adds no word, not an empty one (which would open the text with a space).
        entry = dataclasses.replace(tasks.get_entry("seq2seq", "comet"), prefix="")
        formatted = tasks.make_formatter(entry)({"head": ["PersonX"], "relation": ["xIntent"], "tail": ["t"]})
        self.assertEqual(formatted["source"], ["head: PersonX relation: xIntent"])


class ScorerTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("sst2_invalid_counts_wrong", "sst2", ["positive", "negative", "maybe"],
         ["positive", "positive", "negative"], {"accuracy": 100 / 3}),
        # T5's string_label_to_class_id matches the exact string: a spaced label word is no label.
        ("sst2_spaced_label_is_invalid", "sst2", [" positive\n", "negative"], ["positive", "negative"],
         {"accuracy": 50.0}),
        # Ids: preds [-1, 1, 0, 0] vs [1, 1, 0, 1]: 2 right of 4; predicted counts 1, 2, 1 (-1, 0, 1),
        # true 0, 1, 3 -> MCC = (2 * 4 - 5) / sqrt((16 - 6) * (16 - 10)) = 3 / sqrt(60). Stripped: 4 / sqrt(48).
        ("cola_spaced_label_is_invalid", "cola", [" acceptable", "acceptable", "unacceptable", "unacceptable"],
         ["acceptable", "acceptable", "unacceptable", "acceptable"], {"matthews_corrcoef": 300 / 60 ** 0.5}),
        # Ids: preds [1, -1, 0, 1, 1] vs [1, 1, 0, 0, 1]. For F1 the invalid -1 becomes the wrong
        # class (0): TP 2, FP 1, FN 1 -> 2/3. Accuracy: 3 of 5.
        ("mrpc_invalid", "mrpc", ["equivalent", "garbage", "not_equivalent", "equivalent", "equivalent"],
         ["equivalent", "equivalent", "not_equivalent", "not_equivalent", "equivalent"],
         {"f1": 200 / 3, "accuracy": 60.0}),
        ("cola_perfect", "cola", ["acceptable", "unacceptable", "acceptable"],
         ["acceptable", "unacceptable", "acceptable"], {"matthews_corrcoef": 100.0}),
        ("cola_all_invalid", "cola", ["?", "?", "?"], ["acceptable", "unacceptable", "acceptable"],
         {"matthews_corrcoef": 0.0}),
        ("mnli", "mnli", ["entailment", "neutral", "contradiction", "entailment"],
         ["entailment", "neutral", "neutral", "contradiction"], {"accuracy": 50.0}),
        # x = [1, 2, 3], y = [1, 2, 4]: cov 3, |x| sqrt(2), |y| sqrt(42)/3 -> r = 9 / sqrt(84).
        ("stsb_pearson", "stsb", ["1.0", "2.0", "3.0"], ["1.0", "2.0", "4.0"],
         {"pearson_corrcoef": 100 * 9 / 84 ** 0.5, "spearman_corrcoef": 100.0}),
        # "abc" parses to -1: x = [1, -1, 3], y = [1, 2, 3] -> r = 2 / (sqrt(8) sqrt(2)) = 0.5;
        # ranks [2, 1, 3] vs [1, 2, 3] -> rho = 1 - 6 * 2 / 24 = 0.5.
        ("stsb_unparsable", "stsb", ["1.0", "abc", "3.0"], ["1.0", "2.0", "3.0"],
         {"pearson_corrcoef": 50.0, "spearman_corrcoef": 50.0}),
    )
    def test_scores(self, task, predictions, targets, expected):
        scores = tasks.make_scorer(tasks.get_entry("glue", task))(predictions, targets)
        self.assertEqual(sorted(scores), sorted(expected))
        for name, value in expected.items():
            self.assertAlmostEqual(scores[name], value, places=6, msg=name)

    def test_seq2seq_scores(self):
        entry = tasks.get_entry("seq2seq", "summarization")
        score = tasks.make_scorer(entry)
        targets = ["the cat sat on the mat today", "a dog barked at the mailman loudly"]
        perfect = score([" " + t + " " for t in targets], targets)  # predictions are stripped
        self.assertEqual(sorted(perfect), ["bleu", "rouge1", "rouge2", "rougeLsum"])
        for value in perfect.values():
            self.assertAlmostEqual(value, 100.0)
        self.assertEqual(score(["zzz", "qqq"], targets), {"rouge1": 0.0, "rouge2": 0.0, "rougeLsum": 0.0, "bleu": 0.0})
        # Stemming only when asked: "cats" is not "cat" for T5's ROUGE.
        self.assertEqual(score(["cats"], ["cat"])["rouge1"], 0.0)
        self.assertEqual(tasks.make_scorer(entry, rouge_use_stemmer=True)(["cats"], ["cat"])["rouge1"], 100.0)

    @parameterized.named_parameters(
        ("single_split", "glue", "sst2", "validation", "accuracy", "accuracy"),
        ("mnli_matched", "glue", "mnli", "validation_matched", "accuracy", "validation_matched/accuracy"),
        ("mnli_mismatched", "glue", "mnli", "validation_mismatched", "accuracy",
         "validation_mismatched/accuracy"),
        ("seq2seq", "seq2seq", "comet", "validation", "bleu", "bleu"),
    )
    def test_metric_key(self, benchmark, task, split, metric, expected):
        self.assertEqual(tasks.metric_key(tasks.get_entry(benchmark, task), split, metric), expected)


class LabelNormalizerTest(parameterized.TestCase):

    def _normalize(self, benchmark, task, values):
        entry = tasks.get_entry(benchmark, task)
        normalize = tasks.make_label_normalizer(entry, "validation split")
        return normalize({entry.target: values}, list(range(len(values))))

    def test_classification_words_and_ids(self):
        self.assertEqual(self._normalize("glue", "mnli", ["neutral", "0", " contradiction ", 2, 1.0]),
                         {"label": [1, 0, 2, 2, 1]})

    @parameterized.named_parameters(
        ("unknown_word", ["positive", "negative", "great"], r"row 3: label 'great'"),
        ("id_too_large", ["1", "2"], r"row 2: label '2'"),
        ("negative_id", [-1], r"row 1: label -1"),
        ("fraction", [0.0, 0.5], r"row 2: label 0.5"),
        ("empty", ["positive", ""], r"row 2: label ''"),
        ("missing", [None], r"row 1: label None"),
        ("wrong_case", ["Positive"], r"row 1: label 'Positive'"),
    )
    def test_classification_errors(self, values, where):
        with self.assertRaisesRegex(UsageError, r"^validation split " + where +
                                    r" is not one of the label words \(0 or 'negative', 1 or 'positive'\); "
                                    r"fix the row or the entry's label_words$"):
            self._normalize("glue", "sst2", values)

    def test_missing_cell_is_the_empty_label_word(self):
        # A CSV's empty cell arrives as None and a TSV's as "": the same cell, never the text "None".
        entry = dataclasses.replace(tasks.get_entry("glue", "sst2"), label_words=("", "None"))
        normalize = tasks.make_label_normalizer(entry, "validation split")
        self.assertEqual(normalize({"label": [None, "", "None"]}, [0, 1, 2]), {"label": [0, 0, 1]})

    def test_regression(self):
        self.assertEqual(self._normalize("glue", "stsb", ["4.750", 3, " 0.2 ", 5.0]),
                         {"label": [4.75, 3.0, 0.2, 5.0]})

    @parameterized.named_parameters(
        ("nan_float", [1.0, float("nan")], r"row 2: label nan is not a number"),
        ("nan_text", ["NaN"], r"row 1: label 'NaN' is not a number"),
        ("empty", ["2.5", "3", ""], r"row 3: label '' is not a number"),
        ("none", [None], r"row 1: label None is not a number"),
        ("word", ["high"], r"row 1: label 'high' is not a number"),
    )
    def test_regression_errors(self, values, message):
        with self.assertRaisesRegex(UsageError, r"^validation split " + message):
            self._normalize("glue", "stsb", values)

    def test_seq2seq(self):
        self.assertEqual(self._normalize("seq2seq", "summarization", [" Short. ", 42]),
                         {"target": ["Short.", "42"]})

    @parameterized.named_parameters(
        ("empty", ["fine", ""], 2),
        ("spaces", [" \t "], 1),
        ("none", ["ok", "ok", None], 3),
    )
    def test_seq2seq_empty_target(self, values, row):
        with self.assertRaisesRegex(UsageError, rf"^validation split row {row}: the 'target' column is empty"):
            self._normalize("seq2seq", "summarization", values)

    @parameterized.named_parameters(
        ("classification", "sst2", [-1, "-1", None, "", " ", 1, "positive"], [-1, -1, -1, -1, -1, 1, 1],
         "row 1: label -1 is not one of the label words"),
        # A labelled STS-B row may hold any number, -1 too (as before); a missing one is refused.
        ("regression", "stsb", [-1.0, "-1.0", None, "", 2.5], [-1.0, -1.0, -1.0, -1.0, 2.5],
         "row 3: label None is not a number"),
    )
    def test_unlabelled_rows_only_where_allowed(self, task, values, expected, refused):
        entry = tasks.get_entry("glue", task)
        normalize = tasks.make_label_normalizer(entry, "test split", unlabelled_ok=True)
        self.assertEqual(normalize({"label": values}, list(range(len(values)))), {"label": expected})
        with self.assertRaisesRegex(UsageError, "^validation split " + refused):
            self._normalize("glue", task, values)

    @parameterized.named_parameters(
        ("minus_one", -1, True), ("minus_one_float", -1.0, True), ("text", " -1 ", True), ("none", None, True),
        ("empty", "", True), ("zero", 0, False), ("word", "negative", False), ("minus_two", "-2", False),
    )
    def test_is_unlabelled(self, value, expected):
        self.assertIs(tasks.is_unlabelled(value), expected)

    def test_rows_numbered_from_indices(self):
        # Batches after the first: the row number comes from the dataset index, not the batch.
        normalize = tasks.make_label_normalizer(tasks.get_entry("glue", "cola"), "train split")
        with self.assertRaisesRegex(UsageError, r"^train split row 1001: label 'x'"):
            normalize({"label": ["1", "x"]}, [999, 1000])


class GetEntryTest(parameterized.TestCase):

    def test_known(self):
        entry = tasks.get_entry("glue", "mnli")
        self.assertEqual((entry.prefix, entry.inputs), ("mnli", ("hypothesis", "premise")))

    def test_unknown_benchmark(self):
        with self.assertRaisesRegex(UsageError, r"^unknown --benchmark 'superglue'; known: embedded, glue, seq2seq$"):
            tasks.get_entry("superglue", "boolq")

    @parameterized.named_parameters(("typo", "sst-2"), ("other_benchmark", "summarization"), ("case", "SST2"))
    def test_unknown_task(self, task):
        with self.assertRaisesRegex(
                UsageError, rf"^unknown --dataset_name '{task}' for benchmark 'glue'; "
                            r"known: cola, mnli, mrpc, qnli, qqp, rte, sst2, stsb, wnli$"):
            tasks.get_entry("glue", task)


if __name__ == "__main__":
    absltest.main()
