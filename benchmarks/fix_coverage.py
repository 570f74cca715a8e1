"""Findings and findings with a fix, per rule, of the default rules on folders of public code.

    python benchmarks/fix_coverage.py /work/corpus/huggingface+accelerate /work/corpus/huggingface+peft ...

Runs `lintdist check --output-format json` once over the folders (nothing is written) and prints a
Markdown table. A finding counts as fixed when it carries a fix, safe or unsafe.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "lintdist", "check", "--no-cache", "--exit-zero", "--output-format", "json"]
    completed = subprocess.run([*command, *args.folders], capture_output=True, text=True, check=True)
    counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    files = set()
    for finding in json.loads(completed.stdout):
        counts[finding["code"]][0] += 1
        counts[finding["code"]][1] += finding["fix"] is not None
        files.add(finding["filename"])
    print("| Rule | Findings | With a fix |\n|---|---|---|")
    for code, (found, fixed) in sorted(counts.items()):
        print(f"| {code} | {found} | {fixed} |")
    found = sum(c[0] for c in counts.values())
    fixed = sum(c[1] for c in counts.values())
    print(f"| all | {found} | {fixed} ({fixed / max(found, 1):.0%}) |")
    print(f"\n{len(files)} files with findings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
