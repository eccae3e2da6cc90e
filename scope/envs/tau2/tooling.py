"""What every tau2 tool is made of: the ``Tool`` declaration (name, kind, JSON schema, function), the
``ToolError`` a refused call raises, the schema checker that makes arguments canonical, and the two
generic tools (calculate, transfer_to_human_agents)."""
from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from typing import Any, Callable



class ToolError(ValueError):
    pass


@dataclass
class Tool:
    name: str
    kind: str  # read | write | generic
    description: str
    params: dict[str, Any]  # JSON schema "properties"
    required: list[str]
    fn: Callable[..., Any]

    def schema(self) -> dict[str, Any]:
        """The JSON schema shown to the agent (without scope's own checking hints)."""
        def shown(x):
            if isinstance(x, dict):
                return {k: shown(v) for k, v in x.items() if k != "whole"}
            return [shown(v) for v in x] if isinstance(x, list) else x

        return {"name": self.name, "description": self.description,
                "parameters": {"type": "object", "properties": shown(self.params), "required": self.required}}


S = {"type": "string"}
LS = {"type": "array", "items": {"type": "string"}}


MAX_EXPRESSION = 10_000
MAX_POWER_DIGITS = 400  # a power whose result would have more digits than this is refused


def _safe_eval(node: ast.AST) -> float | int:
    """Numbers, + - * / ** and parentheses, evaluated as Python would, but bounded: a power that would
    take long to compute (``9**9**9``) is refused before it is computed."""
    if isinstance(node, ast.Expression):
        return _safe_eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        v = _safe_eval(node.operand)
        return v if isinstance(node.op, ast.UAdd) else -v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
        x, y = _safe_eval(node.left), _safe_eval(node.right)
        if isinstance(node.op, ast.Pow):
            if isinstance(y, int) and abs(x) > 1 and y * math.log10(abs(x)) > MAX_POWER_DIGITS:
                raise OverflowError("result too large")
            return x ** y
        if isinstance(node.op, ast.Mult) and isinstance(x, int) and isinstance(y, int) and \
                x.bit_length() + y.bit_length() > 4 * MAX_POWER_DIGITS:
            raise OverflowError("result too large")
        return {ast.Add: lambda: x + y, ast.Sub: lambda: x - y, ast.Mult: lambda: x * y,
                ast.Div: lambda: x / y}[type(node.op)]()
    raise SyntaxError("invalid syntax")


def calculate_tool(db, expression: str) -> str:
    """tau2's calculator (digits, + - * / . parentheses and spaces; ``**`` is two of its characters), its
    result rounded to 2 places; refused in bounded time where the expression is too long or too large."""
    if not all(c in "0123456789+-*/(). " for c in expression):
        raise ToolError("Invalid characters in expression")
    if len(expression) > MAX_EXPRESSION:
        raise ToolError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        value = _safe_eval(ast.parse(expression.strip(), mode="eval"))
        return str(round(float(value), 2))
    except (SyntaxError, ArithmeticError, ValueError, RecursionError, MemoryError) as e:
        raise ToolError(str(e) or type(e).__name__) from None


def transfer_tool(db, summary: str) -> str:
    return "Transfer successful"


def round2(x: float) -> float:
    return round(x, 2)


def _typename(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def check_value(v: Any, schema: dict[str, Any], where: str) -> Any:
    """``v`` checked against a tool's JSON schema and made canonical, as tau2's typed tools make it
    (an integral float is an int, a certificate amount a float, unknown keys of an object dropped).
    Stricter than pydantic's lax mode where a wrong value would otherwise be written: null, a bool or a
    numeric string where a number belongs, and a negative amount or count, are errors."""
    t = schema.get("type")
    if t == "string":
        if not isinstance(v, str):
            raise ToolError(f"{where}: expected a string, got {_typename(v)}")
    elif t in ("integer", "number"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise ToolError(f"{where}: expected a number, got {_typename(v)} {v!r}"[:200])
        if t == "integer":
            if isinstance(v, float) and (schema.get("whole") or not v.is_integer()):
                raise ToolError(f"{where}: expected a whole number, got {v!r}")
            v = int(v)
        else:
            v = float(v)
        if "minimum" in schema and v < schema["minimum"]:
            raise ToolError(f"{where}: must be at least {schema['minimum']}, got {v!r}")
    elif t == "array":
        if not isinstance(v, list):
            raise ToolError(f"{where}: expected a list, got {_typename(v)}")
        v = [check_value(x, schema.get("items", {}), f"{where}[{i}]") for i, x in enumerate(v)]
    elif t == "object":
        if not isinstance(v, dict):
            raise ToolError(f"{where}: expected an object, got {_typename(v)}")
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", []) if k not in v]
        if missing:
            raise ToolError(f"{where}: missing fields {missing}")
        v = {k: check_value(x, props[k], f"{where}.{k}") for k, x in v.items() if k in props}
    if "enum" in schema and v not in schema["enum"]:
        raise ToolError(f"{where}: must be one of {schema['enum']}, got {v!r}"[:200])
    return v
