import pytest

from hybridflow.rollout.tools import TOOLS, BaseTool, ToolConfigError, load_tools
from hybridflow.rollout.tools.calculator import CalculatorTool
from hybridflow.rollout.tools.python_executor import PythonExecutorTool


def test_yaml_builds_tools_by_name_and_by_class(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n"
        "  - name: calculator\n"
        "    config: {timeout: 3}\n"
        "  - class_name: hybridflow.rollout.tools.python_executor.PythonExecutorTool\n"
        "    config: {timeout: 2, memory_mb: 128}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function: {name: run_code, description: runs code, parameters: {type: object}}\n"
    )
    tools = load_tools(path)
    assert sorted(tools) == ["calculator", "run_code"]
    assert isinstance(tools["calculator"], CalculatorTool) and tools["calculator"].timeout == 3
    assert isinstance(tools["run_code"], PythonExecutorTool) and tools["run_code"].memory_bytes == 128 * 2**20
    assert tools["run_code"].schema["function"]["description"] == "runs code"


def test_builtin_names():
    assert {"calculator", "python", "code_interpreter"} <= set(TOOLS.names())
    assert issubclass(TOOLS.get("code_interpreter"), BaseTool)


@pytest.mark.parametrize(
    "text, message",
    [
        ("tools: 3\n", "top-level 'tools:' list"),
        ("tools:\n  - {config: {}}\n", "exactly one of 'name'"),
        ("tools:\n  - name: abacus\n", "abacus"),
        ("tools:\n  - class_name: nowhere.Tool\n", "could not be imported"),
        ("tools:\n  - name: calculator\n  - name: calculator\n", "two tools are named 'calculator'"),
    ],
)
def test_bad_config_is_explained(tmp_path, text, message):
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    with pytest.raises((ToolConfigError, ValueError), match=message):
        load_tools(path)
