"""Where one file's check goes: parse, the walk, names, rules, positions (medians of 11 runs).

    python benchmarks/profile_file.py FILE

Runs every rule whose triggers the file contains, as `--select ALL` would, and prints each phase
as a ratio to the file's libcst parse in the same run. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import libcst as cst

from lintdist import engine
from lintdist.context import FileContext
from lintdist.facts import PythonFacts
from lintdist.model import Span
from lintdist.names import NameResolver
from lintdist.positions import Positions
from lintdist.registry import all_rules
from lintdist.syntax import SyntaxIndex

PHASES = (
    "libcst parse",
    "the one walk",
    "names of every callee",
    "facts and rules",
    "positions of findings",
    "whole check_text",
)


def main() -> None:
    path = Path(sys.argv[1])
    text = path.read_text(encoding="utf-8")
    rules = [rule for rule in all_rules() if "python" in rule.kinds and rule.wanted(text, "python")]
    times: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(11):
        start = time.perf_counter()
        module = cst.parse_module(text)
        parsed = time.perf_counter()
        index = SyntaxIndex(module)
        walked = time.perf_counter()
        names = NameResolver(index)
        for call in index.nodes(cst.Call):
            names.qualified_names(call.func)
        named = time.perf_counter()
        context = FileContext(path=path, display_name=str(path), text=text, kind="python", module=module, index=index)
        context.names = NameResolver(index)
        context.facts = PythonFacts(index, context.names)
        reported: list[cst.CSTNode] = []
        # positions are timed on their own: rules get a free span here, the findings are placed after
        context.span = lambda node, found=reported: found.append(node) or Span(1, 1, 1, 1)
        for rule in rules:
            rule(context).finish()
        checked = time.perf_counter()
        positions = Positions(module, text, index.parent)
        for node in reported:
            positions.range(node)
        placed = time.perf_counter()
        engine.check_text(text, path=path, display=str(path), kind="python", rules=rules)
        whole = time.perf_counter()
        steps = (parsed - start, walked - parsed, named - walked, checked - named, placed - checked, whole - placed)
        for phase, seconds in zip(PHASES, steps):
            times[phase].append(seconds)
    parse = statistics.median(times["libcst parse"])
    print(f"{path.name}: {len(text.splitlines())} lines; rules triggered: {', '.join(r.code for r in rules)}")
    for phase, values in times.items():
        median = statistics.median(values)
        print(f"  {phase:24} {median * 1000:8.1f} ms  {median / parse:5.2f}x parse")


if __name__ == "__main__":
    main()
