"""A Python executor tool: runs the model's code in a fresh subprocess and returns what it printed.

What is enforced, per call:
- wall time: ``timeout`` seconds (default 5), then the whole process group is killed;
- CPU time: ``RLIMIT_CPU`` of ``cpu_seconds`` (default = timeout, rounded up);
- memory: ``RLIMIT_AS`` of ``memory_mb`` (default 512) and files written: ``RLIMIT_FSIZE`` of 16 MiB;
- network: the process runs in a new network namespace (``unshare -n``, only a loopback that is down) where the
  system allows it; in every case ``socket`` is replaced by a function that raises before the code runs
  (``network_isolation`` in the result metrics says which applied);
- files: an empty temporary working directory, removed afterwards; ``python -I`` ignores user site-packages
  and ``PYTHON*`` variables, and the environment holds only PATH, HOME (the temp dir) and thread settings.
The limits are set by the runner script inside the child (no ``preexec_fn``, which is unsafe with threads).
This is a guard against runaway or careless code, not a security boundary against hostile code.
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
import resource, runpy, socket, sys
resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize}))
def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the python tool")
socket.socket = socket.create_connection = socket.socketpair = socket.getaddrinfo = _no_network
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
    description = "Run Python 3 code and return what it prints (stdout and stderr). No network access."
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
            *command, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
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
