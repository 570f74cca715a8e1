"""Count the rules' logic lines, the figure issue 28 sets targets on (at most 7,000 in all, none above 350).

    python benchmarks/rule_lines.py [ROOT]

A rule module's logic is its code lines without the module, class and function docstrings, the VALID and INVALID
examples, blank lines and comment lines. On commit 7fc0cc8 this gives 13,610 lines, LD405 1,023, LD401 740 and
LD503 644: the figures the issue quotes.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def logic_lines(path: Path) -> int:
    source = path.read_text(encoding="utf-8")
    skipped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, DOCUMENTED) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                skipped.update(range(first.lineno, first.end_lineno + 1))
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id in ("VALID", "INVALID") for target in node.targets
        ):
            skipped.update(range(node.lineno, node.end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if number not in skipped and line.strip() and not line.strip().startswith("#")
    )


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    counts = {path.name: logic_lines(path) for path in sorted((root / "rules").glob("ld*.py"))}
    over = {name: n for name, n in counts.items() if n > 350}
    print(f"rule logic: {sum(counts.values())} lines in {len(counts)} rules; {len(over)} above 350")
    for name, n in sorted(over.items(), key=lambda item: -item[1]):
        print(f"  {n:5}  {name}")


if __name__ == "__main__":
    main()
