"""The data the tests make (made_data.py): GLUE's layouts as the registry reads them, and the same bytes every time."""
import collections
import os

from absl.testing import absltest, parameterized

from t5_training import data, tasks
from tests import made_data


class MadeGlueTest(parameterized.TestCase):

    @parameterized.named_parameters(
        ("sst2", "sst2", "SST-2", {0: 600, 1: 600}),
        ("cola", "cola", "CoLA", {0: 600, 1: 600}),
        # A sentence and itself, its first half, or an unrelated one, in turn.
        ("stsb", "stsb", "STS-B", {5.0: 400, 2.5: 400, 0.0: 400}),
        # Itself less its last word counts as a paraphrase, as itself does; an unrelated one does not.
        ("mrpc", "mrpc", "MRPC", {1: 800, 0: 400}),
    )
    def test_the_registry_reads_every_split(self, task, folder, train_labels):
        entry = tasks.get_entry("glue", task)
        splits = data.load_splits(entry, data_dir=os.path.join(made_data.glue_dir(), folder))
        self.assertEqual({name: len(rows) for name, rows in splits.items()},
                         {"train": made_data.SIZES["train"], "validation": made_data.SIZES["dev"]})
        self.assertEqual(collections.Counter(splits["train"]["label"]), train_labels)
        self.assertEqual(splits["validation"].column_names, [*entry.inputs, "label"])

    def test_labels_follow_the_text(self):
        pairs = [p for p in made_data.bbc_sentences() if p[0] != "tech"][:made_data.SIZES["train"]]
        sst2 = data.load_splits(tasks.get_entry("glue", "sst2"), data_dir=os.path.join(made_data.glue_dir(), "SST-2"))
        self.assertEqual(sst2["train"]["sentence"], [s for _, s in pairs])
        self.assertEqual(sst2["train"]["label"], [int(t in ("sports", "entertainment")) for t, _ in pairs])
        cola = data.load_splits(tasks.get_entry("glue", "cola"), data_dir=os.path.join(made_data.glue_dir(), "CoLA"))
        first, second = cola["train"][0], cola["train"][1]
        self.assertEqual((first["sentence"], first["label"]), (pairs[0][1], 1))
        self.assertEqual((second["sentence"], second["label"]), (" ".join(reversed(pairs[1][1].split())), 0))

    def test_sentences_are_the_same_on_every_build(self):
        sentences = made_data.bbc_sentences()
        made_data.bbc_sentences.cache_clear()
        self.assertEqual(made_data.bbc_sentences(), sentences)
        # Topics in turn, so any prefix is balanced; each sentence is 6 to 40 words of ASCII.
        self.assertEqual([t for t, _ in sentences[:5]], list(made_data.TOPICS))
        self.assertTrue(all(6 <= len(s.split()) <= 40 and s.isascii() for _, s in sentences))
        self.assertGreater(len(sentences), 20000)

    def test_corpus_is_one_paragraph_a_line(self):
        train, held_out = made_data.corpus_files()
        for path, lines in ((train, 600), (held_out, 100)):
            with open(path, encoding="utf-8") as f:
                text = f.read().splitlines()
            self.assertLen(text, lines)
            self.assertTrue(all(line.strip() for line in text))


if __name__ == "__main__":
    absltest.main()
