"""`CalculatorTool`: arithmetic on numbers (+ - * / // % **, parentheses, unary signs), read
as a Python expression tree and evaluated without ``eval``."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

from jrl.agent.tools.base import BaseTool, ToolResponse

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
# Exponents above this are refused (10 ** 10 ** 9 would take the process down).
MAX_EXPONENT = 1000

SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression, e.g. (12 + 7) * 3.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression"}},
            "required": ["expression"],
        },
    },
}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic `expression`; ValueError for anything else."""

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ValueError(f"exponent {right} is above {MAX_EXPONENT}")
            return _BINARY[type(node.op)](left, right)
        raise ValueError(f"not arithmetic: {ast.unparse(node)!r}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"cannot parse {expression!r}: {err.msg}") from None
    return value(tree.body)


def format_number(number: int | float) -> str:
    """`number` as the model should read it: integral values without a trailing ``.0``."""
    if isinstance(number, float) and number.is_integer() and abs(number) < 2**53:
        return str(int(number))
    return repr(number)


class CalculatorTool(BaseTool):
    """Answers an expression with its value, or with the reason it cannot."""

    def get_openai_tool_schema(self) -> dict[str, Any]:
        return SCHEMA

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        try:
            text = format_number(evaluate(str(parameters.get("expression", ""))))
        except (ValueError, ZeroDivisionError, OverflowError) as err:
            text = f"error: {err}"
        return ToolResponse(text=text), 0.0, {}
