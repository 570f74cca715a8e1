"""Score lintdist on the real-world set: files from public bug reports and fix PRs (benchmarks/realworld.tsv).

The set holds references, not code: each row names a repository, a commit, a path, a rule, and either the line
where that rule should report (``bug``) or ``clean`` (the file is right for that rule, so any finding of the rule
in it is a false alarm), and in ``also`` the other modules of that commit the case needs (a guard in ``main.py``,
a DDP wrap in another file). The files live outside the project, in a folder laid out as
``<owner>+<name>/<commit>/<path>``. ``--mirror`` writes them there from git snapshots of the repositories (the
search tool's ``fetch`` puts one at ``<mirror>/<owner>+<name>/repo``), with the ``__init__.py`` of every package
folder above them, as a checkout has them.

    python benchmarks/realworld.py --files /tmp/realworld/files [--mirror /work/.mirror] [--lintdist PATH]
    python benchmarks/realworld.py --set benchmarks/realworld.tsv --set benchmarks/realworld_snippets.tsv \
        --files /tmp/realworld/files --snippets /tmp/realworld/snippets

A snippet set (``realworld_snippets*.tsv``, columns ``id report block kind rule line expect sha256 evidence``)
holds code as users posted it in a thread: one code block, unedited, named by the report's address and the
block's place in the thread. The blocks themselves are kept outside the project, as ``<snippets>/<id>.<kind>``,
and the row's sha256 says that the stored block is the one that was labelled. Each block is checked alone, as a
project of one file, as a user who pastes it into a file would check it: a Python block cut from inside a function
(every line indented alike) is dedented first, as an editor does on paste; nothing else is changed. Several
``--set`` options are scored together, as one set.

Each commit folder is checked once, as a project, with every rule on (``--select ALL``). A ``bug`` row is found
when a finding of its rule in its file starts within ``TOLERANCE`` lines of the row's line (or spans it). A false
alarm is a finding of a rule in a file the set marks ``clean`` for that rule. Findings of a rule at other lines
of a file marked ``bug`` for it are listed, not scored: the set does not say whether they are right.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TOLERANCE = 3
COLUMNS = ("repo", "commit", "path", "rule", "line", "expect", "report", "evidence", "also")
SNIPPET_COLUMNS = ("id", "report", "block", "kind", "rule", "line", "expect", "sha256", "evidence")
SNIPPET_KINDS = ("py", "yaml", "sh", "md")
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

    @property
    def name(self) -> str:
        return f"{self.repo}@{self.commit[:10]} {self.path}"


@dataclass(frozen=True)
class Snippet:
    """One code block as posted in a public thread; checked alone, as the only file of its own project."""

    id: str
    report: str
    block: str
    kind: str
    rule: str
    line: int
    expect: str
    sha256: str
    evidence: str

    @property
    def path(self) -> str:
        return f"{self.id}.{self.kind}"

    @property
    def folder(self) -> str:
        return f"snippets/{self.id}"

    @property
    def name(self) -> str:
        return f"snippet {self.path}"


@dataclass(frozen=True)
class Finding:
    path: str
    code: str
    line: int
    end_line: int


def read_cases(path: Path = DEFAULT_SET) -> list[Case | Snippet]:
    """The rows of a set of files or of snippets (a header line, then one case a line); raises ValueError on a
    malformed row."""
    cases: list[Case | Snippet] = []
    with path.open(newline="", encoding="utf-8") as stream:
        rows = csv.reader(stream, delimiter="\t")
        header = next(rows)
        if tuple(header) == SNIPPET_COLUMNS:
            return _read_snippets(path, rows)
        if tuple(header) != COLUMNS:
            raise ValueError(f"{path}: the header must be {' '.join(COLUMNS)} (or {' '.join(SNIPPET_COLUMNS)})")
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


def _read_snippets(path: Path, rows) -> list[Case | Snippet]:
    snippets: list[Case | Snippet] = []
    for number, row in enumerate(rows, start=2):
        if len(row) != len(SNIPPET_COLUMNS):
            raise ValueError(f"{path}:{number}: {len(row)} columns, expected {len(SNIPPET_COLUMNS)}")
        snippet = Snippet(*row[:5], int(row[5]), *row[6:])  # type: ignore[arg-type]
        if (
            not re.fullmatch(r"[\w.-]+", snippet.id)
            or snippet.kind not in SNIPPET_KINDS
            or not re.fullmatch(r"[0-9a-f]{64}", snippet.sha256)
            or snippet.expect not in ("bug", "clean")
            or (snippet.expect == "bug") != (snippet.line > 0)
        ):
            raise ValueError(
                f"{path}:{number}: an id of word characters, a kind in {', '.join(SNIPPET_KINDS)}, a sha256 of 64 "
                "hex digits, and a line > 0 exactly for a bug"
            )
        snippets.append(snippet)
    return snippets


def place_snippets(cases: list[Case | Snippet], snippets: Path, files: Path) -> list[str]:
    """Copy each snippet block from ``snippets`` into a folder of its own under ``files``; returns the blocks that
    are missing or whose text is not the one labelled (another sha256)."""
    problems = []
    for case in cases:
        if not isinstance(case, Snippet):
            continue
        source = snippets / case.path
        if not source.is_file():
            problems.append(f"{case.path}: not under {snippets}")
            continue
        data = source.read_bytes()
        if hashlib.sha256(data).hexdigest() != case.sha256:
            problems.append(f"{case.path}: its text is not the labelled one (sha256 differs)")
            continue
        if case.kind == "py":
            data = textwrap.dedent(data.decode("utf-8")).encode("utf-8")
        target = files / case.folder / case.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return problems


def matches(case: Case | Snippet, finding: Finding) -> bool:
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


def score(cases: list[Case | Snippet], findings: dict[str, list[Finding]]) -> tuple[dict[str, RuleScore], list[str]]:
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
        lines.append(f"{case.rule} {case.expect:5} {case.name}:{case.line}  {verdict}")
    return dict(scores), lines


def materialize(cases: list[Case | Snippet], files: Path, mirror: Path) -> list[str]:
    """Write each case's files, and the ``__init__.py`` of the package folders above them, from the git snapshots
    under ``mirror``; returns what could not be had."""
    missing = []
    wanted: dict[tuple[str, str], set[str]] = defaultdict(set)
    for case in cases:
        if isinstance(case, Snippet):
            continue
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
    parser.add_argument(
        "--set", type=Path, action="append", help="the cases, repeatable (default: realworld.tsv beside this)"
    )
    parser.add_argument("--snippets", type=Path, help="folder of <id>.<kind> snippet blocks, for snippet sets")
    parser.add_argument("--mirror", type=Path, help="write missing files from <mirror>/<owner>+<name>/repo git dirs")
    parser.add_argument("--lintdist", default=shutil.which("lintdist") or "lintdist", help="the lintdist to score")
    parser.add_argument("--json", type=Path, help="also write the per-rule scores and per-case lines here")
    args = parser.parse_args(argv)
    cases = [case for path in (args.set or [DEFAULT_SET]) for case in read_cases(path)]
    if any(isinstance(case, Snippet) for case in cases):
        if args.snippets is None:
            parser.error("a snippet set needs --snippets DIR")
        problems = place_snippets(cases, args.snippets, args.files)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            return 2
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
