"""tests/cli_batch.py runs each command line as `python -m`/`-c` would: argv, exit codes, stdout and stderr."""
import os
import tempfile

from absl.testing import absltest

from tests import cli_batch


class RunPythonTest(absltest.TestCase):

    def test_each_command_line_is_a_process_of_its_own(self):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "probe_module.py"), "w", encoding="utf-8") as f:
                f.write("import os, sys\nprint(__name__, sys.argv[1:], os.getpid())\n"
                        "if sys.argv[1:] == ['fail']:\n    sys.exit('failed: one line')\n")
            runs = cli_batch.run_python([
                ["-m", "probe_module", "a", "--b"],        # found in the working directory, as with `python -m`
                ["-m", "probe_module", "fail"],            # SystemExit(str): printed to stderr, exit 1
                ["-c", "import sys; print(sys.argv); sys.exit(3)"],
                ["-c", "import os; os.write(2, b'fd 2\\n'); raise KeyError('k')"],  # a traceback, exit 1
                ["-c", "import probe_module"],             # the first case's import did not leak into this one
            ], preload=["json"], cwd=folder)
        self.assertEqual([run["returncode"] for run in runs], [0, 1, 3, 1, 0])
        name, argv, pid = runs[0]["stdout"].split(" ", 1)[0], runs[0]["stdout"].split("[")[1].split("]")[0], \
            runs[0]["stdout"].split()[-1]
        self.assertEqual((name, argv), ("__main__", "'a', '--b'"))
        self.assertNotEqual(pid, runs[1]["stdout"].split()[-1])
        self.assertEqual(runs[1]["stderr"], "failed: one line\n")
        self.assertEqual(runs[2]["stdout"], "['-c']\n")
        self.assertStartsWith(runs[3]["stderr"], "fd 2\nTraceback")
        self.assertEndsWith(runs[3]["stderr"], "KeyError: 'k'\n")
        self.assertStartsWith(runs[4]["stdout"], "probe_module [] ")  # imported, not run as __main__

    def test_anything_but_m_or_c_is_refused(self):
        with self.assertRaisesRegex(ValueError, r"expected \['-m', MODULE, ...\]"):
            cli_batch.run_python([["script.py"]])


if __name__ == "__main__":
    absltest.main()
