"""`PythonSandboxTool`: runs the model's Python code in a fresh subprocess with CPU-time,
memory and wall-clock limits, and answers with what it printed."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import sys
import tempfile
from typing import Any

from jrl.agent.tools.base import BaseTool, ToolResponse

SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run Python code and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code"}},
            "required": ["code"],
        },
    },
}
DEFAULTS = {"cpu_seconds": 5, "memory_megabytes": 512, "wall_seconds": 10.0}


def run_python(code: str, cpu_seconds: int, memory_megabytes: int, wall_seconds: float) -> str:
    """stdout (and stderr after it) of `code` run by ``python -I`` in an empty temporary folder,
    killed past `wall_seconds`, its CPU time and address space capped (``RLIMIT_CPU``,
    ``RLIMIT_AS``)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        size = memory_megabytes * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    with tempfile.TemporaryDirectory(prefix="jrl-sandbox-") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", code],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=wall_seconds,
                preexec_fn=limit,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return f"error: the code ran past {wall_seconds} s and was stopped"
    out = done.stdout + (f"\n{done.stderr}" if done.stderr else "")
    if done.returncode < 0:
        out += f"\nerror: the code was killed by signal {-done.returncode} (a CPU or memory limit)"
    return out.strip()


class PythonSandboxTool(BaseTool):
    """Tool config: ``cpu_seconds``, ``memory_megabytes``, ``wall_seconds`` (`DEFAULTS`)."""

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return SCHEMA

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        limits = {key: self.config.get(key, value) for key, value in DEFAULTS.items()}
        code = str(parameters.get("code", ""))
        text = await asyncio.to_thread(run_python, code, **limits)
        return ToolResponse(text=text), 0.0, {}
