"""Arithmetic word problems with their answers, made here (no data set is copied from elsewhere).

For tests and small CPU runs of the dataset-backed envs (``roll_math``, ``math:*``, ...), which read
JSONL records with a question field and an answer field:

    python -m envs.problem_sets --out /tmp/arith.jsonl --count 200 --question_key prompt --answer_key solution
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ("Ada", "Bruno", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivo", "Juno")
THINGS = ("apples", "marbles", "stamps", "pencils", "shells", "coins", "stickers", "books")


def problem(rng: random.Random) -> tuple[str, int]:
    """One word problem and its integer answer."""
    who, other = rng.sample(NAMES, 2)
    thing = rng.choice(THINGS)
    a, b, c = rng.randint(2, 40), rng.randint(2, 20), rng.randint(2, 9)
    kind = rng.randrange(4)
    if kind == 0:
        return f"{who} has {a} {thing} and {other} gives {who} {b} more. How many {thing} does {who} have now?", a + b
    if kind == 1:
        a = a + b
        return f"{who} had {a} {thing} and gave {b} of them to {other}. How many {thing} are left?", a - b
    if kind == 2:
        return f"{who} fills {c} boxes with {b} {thing} each. How many {thing} is that in all?", b * c
    return (f"{who} has {a} {thing}, buys {c} packs of {b} more, then gives {other} {a // 2}. "
            f"How many {thing} does {who} keep?", a + b * c - a // 2)


def problems(count: int, seed: int = 0, question_key: str = "problem", answer_key: str = "answer") -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        text, answer = problem(rng)
        out.append({question_key: text, answer_key: str(answer)})
    return out


def write_jsonl(path: str | Path, rows: list[dict[str, str]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--question_key", default="problem")
    parser.add_argument("--answer_key", default="answer")
    args = parser.parse_args(argv)
    path = write_jsonl(args.out, problems(args.count, args.seed, args.question_key, args.answer_key))
    print(f"wrote {args.count} problems to {path}")


if __name__ == "__main__":
    main()
