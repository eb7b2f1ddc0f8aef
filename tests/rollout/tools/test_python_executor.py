import asyncio
import signal
import time

from hybridflow.rollout.tools.python_executor import PythonExecutorTool


def _run(code, **config):
    return asyncio.run(PythonExecutorTool(config).execute("i", {"code": code}))


def test_prints_come_back_and_the_working_directory_is_fresh():
    result = _run("import os\nprint(6 * 7)\nprint(sorted(os.listdir('.')))")
    assert result.text.splitlines() == ["42", "['main.py', 'runner.py']"]
    assert result.metrics["exit_code"] == 0


def test_wall_time_limit_stops_the_code():
    # Sleeping takes no CPU time, so only the wall-clock limit can stop it, whatever the machine's load: a
    # broken limit lets the code end normally after 60 s, without the message.
    started = time.monotonic()
    result = _run("import time\ntime.sleep(60)", timeout=1)
    assert "did not finish within 1 s" in result.text
    assert "exit_code" not in result.metrics  # killed by the tool, not exited
    assert time.monotonic() - started >= 1


def test_cpu_time_limit_stops_a_busy_loop():
    # One CPU-second takes a few wall seconds on a loaded machine, far below the 60 s wall limit.
    result = _run("while True:\n    pass", timeout=60, cpu_seconds=1)
    assert "did not finish within 60 s" in result.text
    assert result.metrics["exit_code"] in (-signal.SIGXCPU, -signal.SIGKILL)


def test_memory_limit_and_errors_come_back_as_text():
    result = _run("x = bytearray(1024 * 1024 * 1024)", memory_mb=256)
    assert "MemoryError" in result.text and "exit code 1" in result.text


def test_no_network_says_so_and_networking_modules_still_import():
    result = _run("import socket\nsocket.create_connection(('127.0.0.1', 9))")
    assert "PermissionError: network access is disabled in the python tool" in result.text
    assert result.metrics["network_isolation"] in ("namespace", "socket_patch")
    result = _run("import ssl, asyncio, urllib.request\nprint(asyncio.run(asyncio.sleep(0, 'ok')))")
    assert result.text.strip() == "ok", result.text
    result = _run("import urllib.request\nurllib.request.urlopen('http://example.com')")
    assert "network access is disabled in the python tool" in result.text


def test_writes_outside_the_working_folder_are_refused(tmp_path):
    outside = tmp_path / "outside.txt"
    code = f"open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())\nopen({str(outside)!r}, 'w')"
    result = _run(code)
    assert result.text.startswith("ok") and "can write only inside its working folder" in result.text
    assert not outside.exists()
    result = _run(f"import os\nos.remove({str(tmp_path)!r})")
    assert "can change files only inside its working folder" in result.text
    assert "JSON" in _run("import json\nprint(open(json.__file__).read()[:100])").text  # reading is fine


def test_no_process_outlives_the_call(tmp_path):
    marker = tmp_path / "daemon.txt"
    for code in (
        "import subprocess\nsubprocess.Popen(['sleep', '100'], start_new_session=True)",
        f"import os\nif os.fork() == 0:\n    os.setsid()\n    open({str(marker)!r}, 'w')",
        "import ctypes\nctypes.CDLL(None).fork()",
    ):
        result = _run(code)
        assert "the python tool cannot start, signal or load native code" in result.text, result.text
    assert not marker.exists()


def test_long_output_is_cut():
    result = _run("print('x' * 10000)", max_output_chars=100)
    assert len(result.text) < 200 and "cut at 100 characters" in result.text
