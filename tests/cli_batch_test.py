"""tests/cli_batch.py runs command lines as `python -m`, `-c` or `python SCRIPT` would: argv, exit codes, output."""
import contextlib
import io
import os
import sys
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


class ForkScriptTest(absltest.TestCase):

    def test_runs_the_script_as_python_would_in_a_child_of_this_process(self):
        with tempfile.TemporaryDirectory() as folder:
            scripts = os.path.join(folder, "scripts")
            os.makedirs(scripts)
            with open(os.path.join(scripts, "helper_of_the_script.py"), "w", encoding="utf-8") as f:
                f.write("import os\nPID = os.getpid()\n")
            with open(os.path.join(scripts, "probe_script.py"), "w", encoding="utf-8") as f:
                f.write("import os, sys\nimport helper_of_the_script\n"
                        "print(__name__, sys.argv[1:], os.environ['PROBE'], os.getcwd(),\n"
                        "      helper_of_the_script.PID, flush=True)\n"
                        "os.write(2, b'to fd 2\\n')\nsys.exit(int(sys.argv[1]))\n")
            sys.path.insert(0, scripts)
            try:
                import helper_of_the_script  # noqa: F401 - the child must run its own copy, not this one
                log = os.path.join(folder, "run.log")
                # Output this process redirects (as the benchmarks' quick runs do) still reaches the child's log.
                with contextlib.redirect_stdout(io.StringIO()) as caught:
                    code = cli_batch.fork_script([os.path.join(scripts, "probe_script.py"), "3"], log,
                                                 {**os.environ, "PROBE": "set"}, cwd=folder)
            finally:
                sys.path.remove(scripts)
                sys.modules.pop("helper_of_the_script", None)
            self.assertEqual((code, caught.getvalue()), (3, ""))
            with open(log, encoding="utf-8") as f:
                printed, error = f.read().splitlines()
            name, argv, probe, cwd, pid = printed.split(" ", 4)
            self.assertEqual((name, argv, probe, cwd, error), ("__main__", "['3']", "set", folder, "to fd 2"))
            self.assertNotEqual(int(pid), os.getpid())  # its own process, with the helper imported there
            self.assertNotIn("PROBE", os.environ)


if __name__ == "__main__":
    absltest.main()
