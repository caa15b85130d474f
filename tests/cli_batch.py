"""Runs many short command lines in one Python start: each in its own forked process.

A fresh `python fine_tune_t5.py ...` spends about 9 s importing torch, transformers, accelerate
and datasets before it reads its first flag; a test of refused input then costs 9 s per case.
Here one process imports what the commands share once and forks a child per command line. The
child is still a process of its own: its own stdout and stderr at the file-descriptor level, so
whatever a library writes there is caught too, and its own exit code. Nothing a case does
reaches the next one.

Two kinds of command line:

    run([("fine_tune_t5", ["--learning_rte", "1"]), ...])   # a script's exact entry: run_cli(main, argv)
    run_python([["-m", "t5_training.sweep", "--help"], ["-c", "print(1)"]], preload=["torch"])
        # what `python -m ...` / `python -c ...` would do, after importing `preload` in the parent
    fork_script([script, *args], log_path, env)
        # `python SCRIPT ARGS`, forked from the calling process itself (the benchmarks' quick runs)

The first two return [{"returncode", "stdout", "stderr", "cpu_seconds"}], in order (the last, the child's CPU
time, shows which cases a batch spends its time on). The first imports the scripts in the
parent; `python -m X` in a child runs X fresh as __main__, so the parent preloads only libraries,
never X itself (runpy would warn about a module imported twice).
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS_PRELOAD = ("transformers.models.t5.modeling_t5",)


def run(cases: list[tuple[str, list[str]]], timeout: float = 900) -> list[dict]:
    """[(script module, argv)] -> [{"returncode", "stdout", "stderr", "cpu_seconds"}], in order."""
    return _batch({"scripts": [{"script": script, "argv": argv} for script, argv in cases]}, REPO, None, timeout)


def run_python(command_lines: list[list[str]], *, preload: list[str] = (), cwd: str = REPO, env: dict | None = None,
               timeout: float = 900) -> list[dict]:
    """[python's arguments: "-m", module, args... or "-c", code, args...] -> results, in order.

    Runs in `cwd` with `env` (default: this process's), as `python ARGS...` started there would.
    """
    for argv in command_lines:
        if len(argv) < 2 or argv[0] not in ("-m", "-c"):
            raise ValueError(f"expected ['-m', MODULE, ...] or ['-c', CODE, ...], got {argv!r}")
    return _batch({"preload": list(preload), "python": command_lines}, cwd, env, timeout)


def _batch(spec: dict, cwd: str, env: dict | None, timeout: float) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cases.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        # By path, not `-m tests.cli_batch`: `cwd` need not be the checkout (a wheel's test runs
        # elsewhere). One thread per child: the cases are short, and the suite runs two test workers.
        done = subprocess.run([sys.executable, os.path.abspath(__file__), path, folder], cwd=cwd, timeout=timeout,
                              capture_output=True, text=True, env={**(env or os.environ), "OMP_NUM_THREADS": "1"})
        if done.returncode != 0:
            raise RuntimeError(f"cli_batch failed ({done.returncode}): {done.stderr[-3000:]}")
        results = []
        for i in range(len(spec.get("scripts") or spec["python"])):
            with open(os.path.join(folder, f"{i}.json"), encoding="utf-8") as f:
                results.append(json.load(f))
        return results


def _script_entry(module, argv: list[str]):
    def entry() -> int:
        sys.argv = [module.__file__, *argv]
        from t5_training.errors import run_cli
        return run_cli(module.main, argv)
    return entry


def _python_entry(argv: list[str]):
    def entry() -> int:
        option, target, *rest = argv
        if option == "-m":
            sys.argv = [target, *rest]  # runpy puts the module's path in argv[0], as `python -m` does
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *rest]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the test's own code
        return 0
    return entry


def fork_script(argv: list[str], log_path: str, env: dict, cwd: str = REPO) -> int:
    """`python SCRIPT ARGS...` (argv: [SCRIPT, ARGS...]) in a process forked from this one, in `cwd`
    with `env`, its stdout and stderr both to `log_path`; returns its exit code.

    For a test process that has already imported what the script imports: the child skips those
    seconds. Unlike `run`, it forks the calling process itself, so call it from one thread.
    """
    script = os.path.abspath(argv[0])

    def entry() -> int:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [script, *argv[1:]]
        folder = os.path.dirname(script)
        sys.path[0] = folder  # as `python SCRIPT` puts the script's folder first
        # Modules of the script's own folder run afresh, as in a new process (they may set up the path).
        for name, module in list(sys.modules.items()):
            if os.path.dirname(os.path.abspath(getattr(module, "__file__", None) or "/")) == folder:
                del sys.modules[name]
        runpy.run_path(script, run_name="__main__")
        return 0
    return _run_one(entry, log_path, log_path)[0]


def _run_one(entry, out_path: str, err_path: str) -> tuple[int, float]:
    """Forks; the child runs `entry` with stdout/stderr sent to files (one file where the paths are
    equal). Returns its exit code and CPU seconds."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            for fd, path in ((1, out_path), (2, err_path)):
                if fd == 2 and path == out_path:
                    os.dup2(1, 2)
                    continue
                target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(target, fd)
                os.close(target)
            # The caller may have replaced sys.stdout/stderr (pytest's capture, redirect_stdout):
            # the child's Python-level output goes to its own descriptors too.
            sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
            sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)
            code = entry()
        except SystemExit as exit_:
            # As the interpreter exits: None is 0, a number is the code, anything else is printed and 1.
            code = 0 if exit_.code is None else exit_.code
            if not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - the child must reach os._exit whatever happens
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 1)
    _, status, usage = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def main(spec_path: str, folder: str) -> None:
    # As `python -m`/`-c` started here: the working directory first on the path, not tests/.
    sys.path[0] = os.getcwd()
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    if "scripts" in spec:
        modules = {name: importlib.import_module(name) for name in sorted({case["script"] for case in spec["scripts"]})}
        # The scripts load T5's model code lazily (transformers' auto classes), about 1 s of each
        # case that gets as far as building a model: once here instead.
        for name in SCRIPTS_PRELOAD:
            importlib.import_module(name)
        entries = [_script_entry(modules[case["script"]], case["argv"]) for case in spec["scripts"]]
    else:
        for name in spec["preload"]:
            importlib.import_module(name)
        entries = [_python_entry(argv) for argv in spec["python"]]
    for i, entry in enumerate(entries):
        out_path, err_path = os.path.join(folder, f"{i}.out"), os.path.join(folder, f"{i}.err")
        code, cpu_seconds = _run_one(entry, out_path, err_path)
        with open(out_path, encoding="utf-8", errors="replace") as out, \
                open(err_path, encoding="utf-8", errors="replace") as err:
            result = {"returncode": code, "stdout": out.read(), "stderr": err.read(), "cpu_seconds": cpu_seconds}
        with open(os.path.join(folder, f"{i}.json"), "w", encoding="utf-8") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
