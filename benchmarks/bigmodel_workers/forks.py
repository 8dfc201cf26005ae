"""Run `python SCRIPT ARGS...` commands as forks of one interpreter that imported torch and transformers once.

    forks = Forks(env)  # imports torch and transformers' Llama once
    proc = forks.run([sys.executable, "worker.py", "{...}"], env=env, timeout=900)  # like subprocess.run
    forks.close()

--quick's way to start bench_bigmodel.py's and bench_pretrained.py's workers: a fresh interpreter
spends ~6 s of CPU importing transformers' Llama before a worker's untimed set-up, more than the
smoke's whole variant on its small model. A fork starts where that worker would stand after its
imports, and is still a process of its own: its own RSS peak, page-cache state and environment
(TMPDIR included). What each worker times starts after its imports, so its times are alike either
way; its RSS rises are 1-6 MiB larger, as the library code pages the imports touched are mapped
into the fork again when it runs them. The server (this file, run as a script) must be started
with the environment the workers' imports read (thread counts, HF_HUB_OFFLINE); it runs no torch
op itself, so no OpenMP thread pool is forked.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback

LLAMA = ("torch", "transformers.models.llama.modeling_llama")  # what every Llama worker imports first


class Forks:
    def __init__(self, env: dict[str, str], modules: tuple[str, ...] = LLAMA) -> None:
        argv = [sys.executable, __file__, *modules]
        self.server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def run(self, argv: list[str], *, env: dict[str, str] | None = None, timeout: float | None = None, **_):
        """subprocess.run(argv, capture_output=True, text=True, ...) for argv = [python, script, *args]."""
        request = {"argv": argv[1:], "env": dict(os.environ if env is None else env), "timeout": timeout}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        reply = self.server.stdout.readline()
        if not reply:
            raise RuntimeError(f"the fork server exited with {self.server.wait()}")
        done = json.loads(reply)
        if done["returncode"] == -signal.SIGALRM and timeout:
            raise subprocess.TimeoutExpired(argv, timeout, done["stdout"], done["stderr"])
        return subprocess.CompletedProcess(argv, done["returncode"], done["stdout"], done["stderr"])

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait()


def child(request: dict, out: int, err: int) -> int:
    """What `python SCRIPT ARGS` would do, from here; its exit status."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((devnull, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
    if request["timeout"]:
        signal.alarm(int(request["timeout"]))  # its default action ends the process, as a timeout would
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # read TMPDIR again
    sys.argv = request["argv"]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python SCRIPT` sets it
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve() -> None:
    for module in sys.argv[1:]:
        __import__(module)
    while line := sys.stdin.readline():
        request = json.loads(line)
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                os._exit(child(request, out.fileno(), err.fileno()))
            returncode = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            out.seek(0)
            err.seek(0)
            reply = {"returncode": returncode, "stdout": out.read(), "stderr": err.read()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
