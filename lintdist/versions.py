"""The versions a project declares for the libraries the rules know, and whether a version range is possible.

Read from the nearest folder (upward from a checked file) that holds a manifest: pyproject ``dependencies``
and optional groups, ``requirements*.txt`` (with ``-r`` includes), ``setup.cfg``/``setup.py``
``install_requires``, ``environment.yml`` (conda and pip entries) and ``uv.lock``/``poetry.lock`` (exact
pins, which win). ``[tool.lintdist] target-versions = { transformers = ">=4.46,<5" }`` overrides all of
them. A rule asks ``allows(package, ">=1.6")`` and gets True, False, or None (nothing declared: unknown, so
the rule keeps the behaviour of the versions the catalog was checked on).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

PACKAGES = frozenset({"torch", "accelerate", "transformers", "deepspeed", "lightning", "peft", "datasets"})
# Other names of the same distributions (conda's `pytorch`, the old `pytorch-lightning` with the same numbering).
ALIASES = {"pytorch": "torch", "pytorch-lightning": "lightning"}
MANIFESTS = ("pyproject.toml", "setup.cfg", "setup.py", "environment.yml", "environment.yaml", "uv.lock", "poetry.lock")
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;#]*)")
CONDA = re.compile(r"^\s*(?:[\w-]+::)?([A-Za-z0-9][A-Za-z0-9._-]*)\s*(=?=|>=|<=|>|<|!=)?\s*([^\s=#]*)")


@dataclass(frozen=True)
class Versions:
    """Each known package's declared specifier (``">=1.6,<2"``) and the file that declared it."""

    declared: dict[str, tuple[str, str]] = field(default_factory=dict)

    def allows(self, package: str, specifier: str) -> bool | None:
        """Whether some version the project allows for ``package`` also satisfies ``specifier``; None when the
        project declares nothing for it (or nothing lintdist can read)."""
        declared = self.declared.get(package)
        if declared is None:
            return None
        simple = _simple_meet(f"{declared[0]},{specifier}")
        if simple is not None:  # plain bounds on release numbers: no need to load `packaging`
            return simple
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            ours, theirs = SpecifierSet(declared[0]), SpecifierSet(specifier)
        except InvalidSpecifier:
            return None
        return any(
            ours.contains(v, prereleases=True) and theirs.contains(v, prereleases=True) for v in _probes(ours, theirs)
        )

    def fingerprint(self) -> tuple:
        return tuple(sorted(self.declared.items()))


SIMPLE_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*v?(\d+(?:\.\d+)*)\s*$")


def _simple_meet(specifiers: str) -> bool | None:
    """Whether some version meets every clause of a comma-separated specifier made of plain bounds on release
    numbers (``>=1.6,<2,!=1.7``); None for anything else (wildcards, ``~=``, local or pre-release labels).
    Versions are dense (between two there is always a third: ``1.6 < 1.6.0.1 < 1.7``), so the bounds decide."""
    clauses = []
    for text in filter(str.strip, specifiers.split(",")):
        match = SIMPLE_CLAUSE.match(text)
        if match is None:
            return None
        release = tuple(int(part) for part in match[2].split("."))
        while len(release) > 1 and release[-1] == 0:  # PEP 440: 1.6 == 1.6.0
            release = release[:-1]
        clauses.append((match[1], release))
    if not clauses:
        return None
    points = [release for op, release in clauses if op == "=="]
    if points:
        return any(all(_holds(op, point, bound) for op, bound in clauses) for point in points)
    lows = [((0,), True)] + [(bound, op == ">=") for op, bound in clauses if op in (">=", ">")]  # none below 0
    highs = [(bound, op == "<=") for op, bound in clauses if op in ("<=", "<")]
    low = max(lows, key=lambda item: (item[0], not item[1]), default=None)
    high = min(highs, key=lambda item: (item[0], item[1]), default=None)
    if high is None or low[0] < high[0]:
        return True
    if low[0] > high[0] or not (low[1] and high[1]):
        return False
    return all(_holds(op, low[0], bound) for op, bound in clauses)  # one point left: `!=` may exclude it


def _holds(op: str, version: tuple[int, ...], bound: tuple[int, ...]) -> bool:
    return {
        ">=": version >= bound,
        "<=": version <= bound,
        ">": version > bound,
        "<": version < bound,
        "==": version == bound,
        "!=": version != bound,
    }[op]


def _probes(*sets) -> list:
    """Versions that decide whether two specifier sets meet: every bound, and one just above and below it."""
    from packaging.version import InvalidVersion, Version

    probes = [Version("0"), Version("99999")]
    for specifiers in sets:
        for spec in specifiers:
            text = spec.version.removesuffix(".*")
            try:
                bound = Version(text)
            except InvalidVersion:
                continue
            release = bound.release
            above = ".".join(map(str, (*release[:-1], release[-1] + 1))) if release else "0"
            probes += [bound, Version(f"{text}.1") if not bound.is_prerelease else bound, Version(above)]
            if spec.version.endswith(".*"):
                probes.append(Version(f"{text}.99999"))
            lower = [*release]
            for i in range(len(lower) - 1, -1, -1):
                if lower[i] > 0:
                    lower[i] -= 1
                    probes.append(Version(".".join(map(str, [*lower[: i + 1], 99999]))))
                    break
    return probes


def project_versions(path: Path) -> Versions:
    """The versions declared by the project that holds ``path`` (the nearest folder upward with a manifest)."""
    home = _manifest_folder(path.resolve().parent if path.is_file() or path.suffix else path.resolve())
    return _read_folder(home, _stamp(home)) if home is not None else Versions()


@lru_cache(maxsize=1024)
def _manifest_folder(folder: Path) -> Path | None:
    """The nearest folder from ``folder`` upward that holds a manifest, not above the repository's root."""
    if any((folder / name).is_file() for name in MANIFESTS) or any(folder.glob("requirements*.txt")):
        return folder
    if (folder / ".git").exists() or folder.parent == folder:
        return None
    return _manifest_folder(folder.parent)


def _stamp(folder: Path) -> tuple:
    """The manifests' modification times, so that an edited requirements file is read again."""
    files = [folder / name for name in MANIFESTS] + sorted(folder.glob("requirements*.txt"))
    return tuple((p.name, p.stat().st_mtime_ns) for p in files if p.is_file())


@lru_cache(maxsize=64)
def _read_folder(folder: Path, stamp: tuple) -> Versions:
    declared: dict[str, tuple[str, str]] = {}

    def add(name: str, spec: str, where: Path) -> None:
        name = ALIASES.get(name.lower().replace("_", "-"), name.lower().replace("_", "-"))
        spec = spec.strip()
        if name not in PACKAGES or not spec:
            return
        if name in declared:  # said twice (two files, or an alias): both must hold
            spec, where_name = f"{declared[name][0]},{spec}", ", ".join(dict.fromkeys([declared[name][1], where.name]))
        else:
            where_name = where.name
        declared[name] = (spec, where_name)

    for requirements in sorted(folder.glob("requirements*.txt")):
        for line in _requirement_lines(requirements, set()):
            if m := REQUIREMENT.match(line):
                add(m[1], m[2], requirements)
    pyproject = _toml(folder / "pyproject.toml")
    project = pyproject.get("project", {})
    groups = [project.get("dependencies", []), *project.get("optional-dependencies", {}).values()]
    for line in (item for group in groups if isinstance(group, list) for item in group if isinstance(item, str)):
        if m := REQUIREMENT.match(line):
            add(m[1], m[2], folder / "pyproject.toml")
    for line in _setup_requirements(folder):
        if m := REQUIREMENT.match(line):
            add(m[1], m[2], folder / ("setup.cfg" if (folder / "setup.cfg").is_file() else "setup.py"))
    for name in ("environment.yml", "environment.yaml"):
        for line, conda in _environment_lines(folder / name):
            if conda and (m := CONDA.match(line)) and m[3]:
                operator = "==" if m[2] in {None, "=", "=="} else m[2]
                version = m[3] + (".*" if operator == "==" and m[2] != "==" and "*" not in m[3] else "")
                add(m[1], f"{operator}{version}".replace("*.*", "*"), folder / name)
            elif not conda and (m := REQUIREMENT.match(line)):
                add(m[1], m[2], folder / name)
    for name in ("uv.lock", "poetry.lock"):
        for package in _toml(folder / name).get("package", []):
            if isinstance(package, dict) and isinstance(package.get("version"), str):
                declared.pop(ALIASES.get(str(package.get("name")), str(package.get("name"))), None)
                add(str(package.get("name", "")), f"=={package['version']}", folder / name)
    targets = pyproject.get("tool", {}).get("lintdist", {}).get("target-versions", {})
    lintdist_toml = _toml(folder / "lintdist.toml").get("target-versions", {})
    for source, table in ((folder / "pyproject.toml", targets), (folder / "lintdist.toml", lintdist_toml)):
        for name, spec in table.items() if isinstance(table, dict) else ():
            declared.pop(name, None)
            add(name, str(spec), source)
    return Versions(declared)


def _requirement_lines(path: Path, seen: set[Path]) -> list[str]:
    """The requirement lines of a requirements file, ``-r other.txt`` includes followed once each."""
    if path in seen or not path.is_file():
        return []
    seen.add(path)
    lines = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            lines += _requirement_lines(path.parent / line.split(None, 1)[1].strip(), seen)
        elif line and not line.startswith(("-", "#")) and "://" not in line:
            lines.append(line)
    return lines


def _setup_requirements(folder: Path) -> list[str]:
    config = folder / "setup.cfg"
    if config.is_file():
        import configparser  # only a project with setup.cfg pays for it

        parser = configparser.ConfigParser()
        try:
            parser.read(config, encoding="utf-8")
            text = parser.get("options", "install_requires", fallback="")
        except configparser.Error:
            text = ""
        if text.strip():
            return [line.strip() for line in text.splitlines() if line.strip()]
    setup = folder / "setup.py"
    if not setup.is_file():
        return []
    try:
        tree = ast.parse(setup.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return []
    lists = {  # module-level `REQUIRES = [...]`
        target.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            value = lists.get(node.value.id) if isinstance(node.value, ast.Name) else node.value
            if isinstance(value, ast.List):
                return [e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _environment_lines(path: Path) -> list[tuple[str, bool]]:
    """(entry, is a conda entry) for each dependency of a conda environment file."""
    if not path.is_file():
        return []
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="safe").load(path.read_text(encoding="utf-8", errors="replace"))
    except YAMLError:
        return []
    result = []
    for entry in (data or {}).get("dependencies", []) if isinstance(data, dict) else []:
        if isinstance(entry, str):
            result.append((entry, True))
        elif isinstance(entry, dict):
            result += [(line, False) for line in entry.get("pip", []) if isinstance(line, str)]
    return result


def _toml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    try:
        return tomllib.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        return {}
