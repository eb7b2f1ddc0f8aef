"""A Python executor tool: runs the model's code in a fresh subprocess and returns what it printed.

What is enforced, per call:
- wall time: ``timeout`` seconds (default 5), then the whole process group is killed;
- CPU time: ``RLIMIT_CPU`` of ``cpu_seconds`` (default = timeout, rounded up);
- memory: ``RLIMIT_AS`` of ``memory_mb`` (default 512) and files written: ``RLIMIT_FSIZE`` of 16 MiB;
- network: the process runs in a new network namespace (``unshare -n``, only a loopback that is down) where the
  system allows it; in every case an audit hook (PEP 578) refuses any socket but a local (AF_UNIX) one, and
  connecting, binding and name lookups, with "network access is disabled in the python tool"
  (``network_isolation`` in the result metrics says which applied); ``ssl``, ``asyncio``, ``urllib`` import;
- files: an empty temporary working directory, removed afterwards; the audit hook refuses opening for writing,
  creating, removing or renaming anything outside it (reading the standard library is fine); ``python -I``
  ignores user site-packages and ``PYTHON*`` variables, and the environment holds only PATH, HOME (the temp dir)
  and thread settings;
- processes: the hook refuses starting processes (subprocess, fork, exec, spawn), new sessions, signals and
  loading native code with ctypes, so nothing the code does outlives the call; its own process group is
  killed at the end regardless.
The limits are set by the runner script inside the child (no ``preexec_fn``, which is unsafe with threads).
An audit-hook sandbox stops careless and runaway code, and code that uses Python's own APIs; it is not a
security boundary against hostile native code (a C extension already installed can still do anything).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any

from hybridflow.rollout.tools.base import BaseTool, ToolResult
from hybridflow.rollout.tools.registry import TOOLS

_RUNNER = """\
import os, resource, runpy, socket, sys
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
sys.dont_write_bytecode = True
ROOT = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
PATH_EVENTS = {{"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1, "os.truncate": 1,
               "os.utime": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2, "shutil.rmtree": 1}}
PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
                  "os.setsid", "os.kill", "os.killpg", "ctypes.dlopen", "ctypes.dlsym")
NETWORK_EVENTS = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                  "socket.gethostbyname", "socket.gethostbyaddr")
def inside(path):
    if isinstance(path, int):
        return True  # an open file descriptor: checked when it was opened
    return os.path.realpath(os.fsdecode(path)).startswith(ROOT + os.sep)
def sandbox(event, args):
    if event == "open":
        path, mode, flags = args
        writing = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & WRITE_FLAGS)
        if writing and path is not None and not inside(path):
            raise PermissionError(f"the python tool can write only inside its working folder, not {{path}}")
    elif event in PATH_EVENTS:
        for path in args[: PATH_EVENTS[event]]:
            if path is not None and not inside(path):
                raise PermissionError(f"the python tool can change files only inside its working folder, not {{path}}")
    elif event in PROCESS_EVENTS:
        raise PermissionError(f"the python tool cannot start, signal or load native code ({{event}} is disabled)")
    elif event in NETWORK_EVENTS or (event == "socket.__new__" and args[1] != socket.AF_UNIX):
        raise PermissionError("network access is disabled in the python tool")
sys.addaudithook(sandbox)
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
"""
_FILE_SIZE_LIMIT = 16 * 2**20


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether ``unshare -n`` works here (root, or unprivileged user namespaces allowed)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


@TOOLS.register("python", "code_interpreter")
class PythonExecutorTool(BaseTool):
    name = "python"
    description = (
        "Run Python 3 code and return what it prints (stdout and stderr). No network access, no subprocesses; "
        "files can be written only in the working folder."
    )
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The program to run; print the results."}},
        "required": ["code"],
    }

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        config = {"timeout": 5.0, **(config or {})}
        super().__init__(config, tool_schema)
        self.cpu_seconds = int(math.ceil(float(self.config.get("cpu_seconds", self.timeout))))
        self.memory_bytes = int(self.config.get("memory_mb", 512)) * 2**20
        self.max_output_chars = int(self.config.get("max_output_chars", 2048))
        self.python = str(self.config.get("python", sys.executable))

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult("Error: the python tool needs a string argument 'code'")
        with tempfile.TemporaryDirectory(prefix="hybridflow-python-") as workdir:
            return await self._run(code, workdir)

    async def _run(self, code: str, workdir: str) -> ToolResult:
        with open(os.path.join(workdir, "main.py"), "w") as handle:
            handle.write(code)
        runner = _RUNNER.format(memory=self.memory_bytes, cpu=self.cpu_seconds, fsize=_FILE_SIZE_LIMIT)
        with open(os.path.join(workdir, "runner.py"), "w") as handle:
            handle.write(runner)
        isolated = network_namespace_available()
        command = (["unshare", "-n"] if isolated else []) + [self.python, "-I", "runner.py"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": workdir, "OMP_NUM_THREADS": "1"}
        process = await asyncio.create_subprocess_exec(
            *command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        metrics = {"network_isolation": "namespace" if isolated else "socket_patch"}
        try:
            output, _ = await asyncio.wait_for(process.communicate(), timeout=self.timeout)
        except asyncio.TimeoutError:
            return ToolResult(self._out_of_time(), 0.0, metrics)
        finally:
            _kill_group(process)
            await process.wait()
        # RLIMIT_CPU ends a busy loop with SIGXCPU/SIGKILL, which can come before the wall timer on a busy machine.
        if process.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            return ToolResult(self._out_of_time(), 0.0, {**metrics, "exit_code": process.returncode})
        text = output.decode("utf-8", errors="replace")
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"\n... [output cut at {self.max_output_chars} characters]"
        if process.returncode != 0:
            text = f"{text}\n(exit code {process.returncode})".lstrip()
        return ToolResult(text, 0.0, {**metrics, "exit_code": process.returncode})

    def _out_of_time(self) -> str:
        return f"Error: the code did not finish within {self.timeout:g} s and was stopped"


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill the child and anything it started: it leads its own session, so its pid is their group id."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
