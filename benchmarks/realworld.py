"""Score lintdist on the real-world set: files from public bug reports and fix PRs (benchmarks/realworld.tsv).

The set holds references, not code: each row names a repository, a commit, a path, a rule, and either the line
where that rule should report (``bug``) or ``clean`` (the file is right for that rule, so any finding of the rule
in it is a false alarm), and in ``also`` the other modules of that commit the case needs (a guard in ``main.py``,
a DDP wrap in another file). The files live outside the project, in a folder laid out as
``<owner>+<name>/<commit>/<path>``. ``--mirror`` writes them there from git snapshots of the repositories (the
search tool's ``fetch`` puts one at ``<mirror>/<owner>+<name>/repo``), with the ``__init__.py`` of every package
folder above them, as a checkout has them.

    python benchmarks/realworld.py --files /tmp/realworld/files [--mirror /work/.mirror] [--lintdist PATH]

Each commit folder is checked once, as a project, with every rule on (``--select ALL``). A ``bug`` row is found
when a finding of its rule in its file starts within ``TOLERANCE`` lines of the row's line (or spans it). A false
alarm is a finding of a rule in a file the set marks ``clean`` for that rule. Findings of a rule at other lines
of a file marked ``bug`` for it are listed, not scored: the set does not say whether they are right.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TOLERANCE = 3
COLUMNS = ("repo", "commit", "path", "rule", "line", "expect", "report", "evidence", "also")
DEFAULT_SET = Path(__file__).with_name("realworld.tsv")


@dataclass(frozen=True)
class Case:
    repo: str
    commit: str
    path: str
    rule: str
    line: int
    expect: str
    report: str
    evidence: str
    also: tuple[str, ...] = ()

    @property
    def folder(self) -> str:
        return f"{self.repo.replace('/', '+')}/{self.commit}"


@dataclass(frozen=True)
class Finding:
    path: str
    code: str
    line: int
    end_line: int


def read_cases(path: Path = DEFAULT_SET) -> list[Case]:
    """The rows of the set (a header line, then one case a line); raises ValueError on a malformed row."""
    cases = []
    with path.open(newline="", encoding="utf-8") as stream:
        rows = csv.reader(stream, delimiter="\t")
        header = next(rows)
        if tuple(header) != COLUMNS:
            raise ValueError(f"{path}: the header must be {' '.join(COLUMNS)}")
        for number, row in enumerate(rows, start=2):
            if len(row) != len(COLUMNS):
                raise ValueError(f"{path}:{number}: {len(row)} columns, expected {len(COLUMNS)}")
            case = Case(*row[:4], int(row[4]), *row[5:8], tuple(row[8].split()))  # type: ignore[arg-type]
            if (
                len(case.commit) != 40
                or case.expect not in ("bug", "clean")
                or (case.expect == "bug") != (case.line > 0)
            ):
                raise ValueError(f"{path}:{number}: a commit of 40 hex digits, and a line > 0 exactly for a bug")
            cases.append(case)
    return cases


def matches(case: Case, finding: Finding) -> bool:
    if finding.code != case.rule or finding.path != case.path:
        return False
    return abs(finding.line - case.line) <= TOLERANCE or finding.line <= case.line <= finding.end_line


@dataclass
class RuleScore:
    found: int = 0
    missed: int = 0
    false_alarms: int = 0

    @property
    def recall(self) -> float | None:
        total = self.found + self.missed
        return self.found / total if total else None

    @property
    def precision(self) -> float | None:
        total = self.found + self.false_alarms
        return self.found / total if total else None


def score(cases: list[Case], findings: dict[str, list[Finding]]) -> tuple[dict[str, RuleScore], list[str]]:
    """Per-rule scores and one line per case (found / missed / false alarm / clean), from the findings of each
    commit folder."""
    scores: dict[str, RuleScore] = defaultdict(RuleScore)
    lines = []
    for case in cases:
        here = [f for f in findings.get(case.folder, []) if f.path == case.path and f.code == case.rule]
        rule = scores[case.rule]
        if case.expect == "bug":
            hit = any(matches(case, f) for f in here)
            rule.found += hit
            rule.missed += not hit
            others = sorted({f.line for f in here if not matches(case, f)})
            extra = f" (also at {', '.join(map(str, others))}, not scored)" if others else ""
            verdict = ("found" if hit else "MISSED") + extra
        else:
            rule.false_alarms += len(here)
            verdict = "clean" if not here else f"FALSE ALARM at {', '.join(str(f.line) for f in here)}"
        lines.append(f"{case.rule} {case.expect:5} {case.repo}@{case.commit[:10]} {case.path}:{case.line}  {verdict}")
    return dict(scores), lines


def materialize(cases: list[Case], files: Path, mirror: Path) -> list[str]:
    """Write each case's files, and the ``__init__.py`` of the package folders above them, from the git snapshots
    under ``mirror``; returns what could not be had."""
    missing = []
    wanted: dict[tuple[str, str], set[str]] = defaultdict(set)
    for case in cases:
        for path in (case.path, *case.also):
            wanted[(case.repo, case.commit)].add(path)
            parts = Path(path).parts[:-1]
            wanted[(case.repo, case.commit)].update(
                str(Path(*parts[:i], "__init__.py")) for i in range(1, len(parts) + 1)
            )
    for (repo, commit), paths in sorted(wanted.items()):
        git_dir = mirror / repo.replace("/", "+") / "repo"
        for path in sorted(paths):
            target = files / repo.replace("/", "+") / commit / path
            if target.is_file():
                continue
            shown = subprocess.run(
                ["git", "--git-dir", str(git_dir), "show", f"{commit}:{path}"], capture_output=True, check=False
            )
            if shown.returncode != 0:
                if not path.endswith("__init__.py"):  # a folder that is no package has none
                    missing.append(f"{repo}@{commit[:10]}:{path}")
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(shown.stdout)
    return missing


def run_lintdist(executable: str, folder: Path) -> list[Finding]:
    """Every finding of every rule in ``folder``, checked from inside it as one project."""
    result = subprocess.run(
        [executable, "check", "--no-cache", "--select", "ALL", "--output-format", "json", "."],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode not in (0, 1):
        print(
            f"lintdist failed on {folder} (exit {result.returncode}): {result.stderr.strip()[-400:]}", file=sys.stderr
        )
    try:
        raw = json.loads(result.stdout or "[]")
    except json.JSONDecodeError:
        print(f"no JSON from lintdist on {folder}: {result.stdout[:200]!r}", file=sys.stderr)
        return []
    return [Finding(item["filename"].removeprefix("./"), item["code"], item["line"], item["end_line"]) for item in raw]


def table(scores: dict[str, RuleScore]) -> str:
    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}"

    rows = [
        "| Rule | Bug cases | Found | Clean cases' false alarms | Recall | Precision |",
        "|---|---|---|---|---|---|",
    ]
    total = RuleScore()
    for code in sorted(scores):
        s = scores[code]
        rows.append(
            f"| {code} | {s.found + s.missed} | {s.found} | {s.false_alarms} | {share(s.recall)} | {share(s.precision)} |"
        )
        total.found += s.found
        total.missed += s.missed
        total.false_alarms += s.false_alarms
    rows.append(
        f"| all | {total.found + total.missed} | {total.found} | {total.false_alarms} | {share(total.recall)} | "
        f"{share(total.precision)} |"
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=Path, required=True, help="folder of <owner>+<name>/<commit>/<path> files")
    parser.add_argument("--set", type=Path, default=DEFAULT_SET, help="the cases (default: realworld.tsv beside this)")
    parser.add_argument("--mirror", type=Path, help="write missing files from <mirror>/<owner>+<name>/repo git dirs")
    parser.add_argument("--lintdist", default=shutil.which("lintdist") or "lintdist", help="the lintdist to score")
    parser.add_argument("--json", type=Path, help="also write the per-rule scores and per-case lines here")
    args = parser.parse_args(argv)
    cases = read_cases(args.set)
    if args.mirror is not None:
        for name in materialize(cases, args.files, args.mirror):
            print(f"not in the mirror: {name}", file=sys.stderr)
    missing = sorted({c.folder + "/" + c.path for c in cases if not (args.files / c.folder / c.path).is_file()})
    if missing:
        print(f"{len(missing)} file(s) of the set are not under {args.files}, fetch them first:", file=sys.stderr)
        for name in missing:
            print(f"  {name}", file=sys.stderr)
        return 2
    findings = {
        folder: run_lintdist(args.lintdist, args.files / folder) for folder in sorted({c.folder for c in cases})
    }
    scores, lines = score(cases, findings)
    print("\n".join(lines))
    print()
    print(table(scores))
    if args.json:
        payload = {
            "scores": {code: vars(s) for code, s in scores.items()},
            "cases": lines,
        }
        args.json.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
