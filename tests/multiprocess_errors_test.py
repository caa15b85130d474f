"""Bad input under two processes: every process stops within seconds, one line, exit code 2, no worker traceback.

Each case runs the real script under `accelerate launch --multi_gpu --num_processes 2` on the
CPU (gloo), with an input problem that is detected at a different point: while parsing flags
(every process at once), while the main process reads the data first (it alone), and on the
second process only (its share of a streamed corpus is empty). Before errors were agreed on
(t5_training.agreement), the other process died with gloo's "Connection closed by peer"
traceback; under NCCL it would have waited for the collective's timeout.
"""
import os
import tempfile
import time

from absl.testing import absltest, parameterized

from tests import fixtures, processes

FINE_TUNE = os.path.join(fixtures.REPO, "fine_tune_t5.py")
PRE_TRAIN = os.path.join(fixtures.REPO, "pre_train_t5.py")


class TwoProcessBadInputTest(parameterized.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory()
        folder = cls.tmp.name
        cls.no_label = os.path.join(folder, "no_label.csv")
        with open(cls.no_label, "w") as f:
            f.write("sentence,score\ngood film,1\nbad film,0\n")
        # One document: the streamed corpus's second reader (process 1) gets none of it.
        cls.one_document = os.path.join(folder, "one.txt")
        with open(cls.one_document, "w") as f:
            f.write(" ".join(fixtures.sentences(60)) + "\n")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    def _pretrain_args(self, output_dir):
        return ["--config_name", fixtures.TINY_CONFIG, "--tokenizer_name", fixtures.tokenizer_dir(),
                "--train_file", self.one_document, "--validation_file", self.one_document, "--streaming",
                "--max_steps", "3", "--max_seq_length", "32", "--per_device_train_batch_size", "2",
                "--output_dir", output_dir]

    @parameterized.named_parameters(
        # Every process, while parsing its flags.
        ("every_process_parsing_flags", "fine_tune", ["--learning_rate", "-1"], "--learning_rate must be positive"),
        # The main process alone, reading the data before the others (main_process_first).
        ("main_process_reading_data", "fine_tune", ["--train_file", "{no_label}", "--validation_file", "{no_label}"],
         "no column 'label'"),
        # The second process alone: its share of the stream is empty when training starts.
        ("second_process_without_data", "pre_train", [], "the training data yields no batch on this process"),
    )
    def test_one_line_exit_code_2_within_seconds(self, script, flags, message):
        with tempfile.TemporaryDirectory() as out:
            if script == "fine_tune":
                script, args = FINE_TUNE, fixtures.fine_tune_args(out, "--max_steps", "2")
            else:
                script, args = PRE_TRAIN, self._pretrain_args(out)
            args += [flag.format(no_label=self.no_label) for flag in flags]
            started = time.perf_counter()
            done = processes.launch_two(script, args, timeout=300)
            seconds = time.perf_counter() - started
        output = done.stdout + done.stderr
        self.assertNotEqual(done.returncode, 0)
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        self.assertLen(errors, 1, output[-3000:])
        self.assertIn(message, errors[0])
        # Neither worker printed a traceback or gloo's error; the launcher's own summary names
        # each worker's exit code.
        for marker in ("Connection closed by peer", "t5_training/", "fine_tune_t5.py\", line", "pre_train_t5.py\", line"):
            self.assertNotIn(marker, output, output[-3000:])
        if done.returncode != 2:  # accelerate launch reports a failed worker as its own exit code 1
            self.assertIn("exitcode  : 2", output.replace("exitcode: 2", "exitcode  : 2"), output[-3000:])
            self.assertNotIn("exitcode  : 1", output)
        # Both processes stop at once rather than one waiting for a collective's timeout:
        # the launch, imports and data of a 2-process run take about 20 s on 2 cores.
        self.assertLess(seconds, 120)


if __name__ == "__main__":
    absltest.main()
