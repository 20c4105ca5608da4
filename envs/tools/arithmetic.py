"""Safe evaluation of arithmetic expressions (numbers, + - * /, parentheses) without ``eval``."""

from __future__ import annotations

import ast
import math
from fractions import Fraction

MAX_CHARS = 200
MAX_NODES = 100
MAX_MAGNITUDE = Fraction(10) ** 100  # beyond this a value (or its reciprocal) is refused, not computed on


class ArithmeticError_(ValueError):
    """An expression that is not plain arithmetic, or cannot be evaluated."""


def evaluate(expression: str) -> tuple[Fraction, list[Fraction]]:
    """Exact value of ``expression`` and the numbers it uses, in order of appearance."""
    if not isinstance(expression, str) or not expression.strip():
        raise ArithmeticError_("the expression is empty")
    if len(expression) > MAX_CHARS:
        raise ArithmeticError_(f"the expression is longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ArithmeticError_(f"{expression!r} is not a valid arithmetic expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ArithmeticError_("the expression is too long")
    numbers: list[Fraction] = []
    return _eval(tree.body, numbers), numbers


def _in_range(value: Fraction) -> Fraction:
    if value and (abs(value) > MAX_MAGNITUDE or abs(value) < 1 / MAX_MAGNITUDE):
        raise ArithmeticError_("a number or result is out of range")
    return value


def _eval(node: ast.AST, numbers: list[Fraction]) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ArithmeticError_("a number is out of range")
        if isinstance(node.value, int) and node.value.bit_length() > 400:
            raise ArithmeticError_("a number is out of range")
        value = _in_range(Fraction(node.value))
        numbers.append(value)
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand, numbers)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _eval(node.left, numbers), _eval(node.right, numbers)
        if isinstance(node.op, ast.Add):
            return _in_range(left + right)
        if isinstance(node.op, ast.Sub):
            return _in_range(left - right)
        if isinstance(node.op, ast.Mult):
            return _in_range(left * right)
        if right == 0:
            raise ArithmeticError_("division by zero")
        return _in_range(left / right)
    raise ArithmeticError_("only numbers, + - * / and parentheses are allowed")


def format_number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{float(value):.6g}"
