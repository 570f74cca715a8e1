"""Checks lintdist's name resolver against libcst's QualifiedNameProvider: fixtures, rule examples, public scripts.

The resolver is meant to give libcst's answer for every node. ``DELIBERATE_DIFFERENCES`` lists where it knowingly
does not; the differential tests below hold it to libcst everywhere else, first on the nodes the rules really ask
about (recorded while the rules run), then on every name and attribute of each file.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import libcst as cst
import pytest
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider, ScopeProvider

from lintdist.conventions import CONVENTIONAL_NAMES
from lintdist.engine import check_text
from lintdist.names import NameResolver
from lintdist.registry import all_rules
from lintdist.syntax import SyntaxIndex


@dataclass(frozen=True)
class Difference:
    code: str
    node: str  # the source text of the Name or Attribute compared
    occurrence: int  # which node with that text (0 = first, -1 = last)
    libcst: frozenset[str]
    lintdist: frozenset[str]
    why: str


# The differential tests below excuse none of these: a file that hits one fails there, for a person to look at.
DELIBERATE_DIFFERENCES = [
    Difference(
        "match command:\n    case [head, *rest]:\n        head.upper()\n",
        "head.upper",
        -1,
        libcst=frozenset(),
        lintdist=frozenset({"head.upper"}),
        why="libcst's scope visitor has no case for match patterns, so a capture reads as an unbound name; "
        "lintdist binds ``case`` captures (MatchAs, MatchStar) like assignments, so a capture named like an import "
        "shadows it as it does at run time.",
    ),
    Difference(
        "def outer():\n    total = 0\n    def middle():\n        def inner():\n            nonlocal total\n"
        "            total += 1\n        return inner\n    return total\n",
        "total",
        2,
        libcst=frozenset({"outer.<locals>.middle.<locals>.total"}),
        lintdist=frozenset({"outer.<locals>.total"}),
        why="libcst sends a ``nonlocal`` name to the directly enclosing function even where that function does not "
        "bind it; Python, and lintdist, use the nearest enclosing function that does.",
    ),
    Difference(
        "def first[T](items: list[T]) -> T:\n    return items[0]\n",
        "T",
        -1,
        libcst=frozenset({"T"}),
        lintdist=frozenset(),
        why="lintdist does not model PEP 695 annotation scopes (Python 3.12 syntax): type parameters bind nothing, "
        "so reading one resolves to nothing. They are type variables, which no rule asks about.",
    ),
    Difference(
        "type Batch = dict[str, int]\nbatch: Batch\n",
        "Batch",
        -1,
        libcst=frozenset({"Batch"}),
        lintdist=frozenset(),
        why="the same for a PEP 695 ``type`` alias: its name is not bound, so a later read resolves to nothing.",
    ),
]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RULES = all_rules()


def _libcst_names(answers, node: cst.CSTNode) -> frozenset[str]:
    value = answers[node]
    return frozenset(q.name for q in (value() if callable(value) else value))


def _oracle(wrapper: MetadataWrapper, node: cst.CSTNode) -> frozenset[str]:
    """libcst's answer, but for one rule libcst does not have: a conventional name nothing in the file binds
    (``dist.barrier()`` in a snippet without imports) takes its conventional meaning, so that snippets, notebook
    cells and documentation code resolve. libcst answers nothing there. "Nothing binds" is decided here from
    libcst's own scopes (every assignment visible from the node's scope, later ones included), plus the two
    things that make a name bound in ways neither tracks: a star import, a ``global``/``nonlocal`` declaration."""
    theirs = _libcst_names(wrapper.resolve(QualifiedNameProvider), node)
    full_name = get_full_name_for_node(node)
    scope = wrapper.resolve(ScopeProvider).get(node)
    if theirs or full_name is None or scope is None:
        return theirs
    root, dot, rest = full_name.partition(".")
    if root not in CONVENTIONAL_NAMES or scope[root]:
        return theirs
    module = wrapper.module
    declared = {item.name.value for statement in _all(module, cst.Global, cst.Nonlocal) for item in statement.names}
    star = any(isinstance(statement.names, cst.ImportStar) for statement in _all(module, cst.ImportFrom))
    if root in declared or star:
        return theirs
    return frozenset({f"{CONVENTIONAL_NAMES[root]}{dot}{rest}"})


def _all(module: cst.Module, *types: type) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, types):
                found.append(node)
            return True

    module.visit(Collect())
    return found


def _nodes_with_code(index: SyntaxIndex, code: str) -> list[cst.CSTNode]:
    module = index.module
    return [node for node in index.nodes(cst.Name, cst.Attribute) if module.code_for_node(node) == code]


def _both(code: str) -> tuple[SyntaxIndex, NameResolver, MetadataWrapper]:
    module = cst.parse_module(code)
    index = SyntaxIndex(module)
    return index, NameResolver(index), MetadataWrapper(module, unsafe_skip_copy=True)


# -- the files ---------------------------------------------------------------------------------


def _public_scripts() -> list[Path]:
    spec = importlib.util.find_spec("accelerate")
    if spec is None or spec.origin is None:
        return []
    root = Path(spec.origin).parent
    return [
        *sorted((root / "test_utils" / "scripts").rglob("*.py")),
        *sorted((root / "commands").glob("*.py")),
        root / "accelerator.py",
        root / "data_loader.py",
        root / "utils" / "megatron_lm.py",
    ]


def _parses(code: str) -> bool:
    try:
        cst.parse_module(code)
    except cst.ParserSyntaxError:
        return False
    return True


@cache
def _files() -> dict[str, tuple[Path, str]]:
    """Display name -> (path, text) for every file the differential tests run on."""
    files = {
        f"fixtures/{path.relative_to(FIXTURES)}": (path, path.read_text(encoding="utf-8"))
        for path in sorted(FIXTURES.rglob("*.py"))
    }
    for rule in RULES:
        for kind in ("VALID", "INVALID"):
            for number, example in enumerate(getattr(rule, kind)):
                if example.filename.endswith(".py") and _parses(example.code):  # LD001's examples are syntax errors
                    files[f"{rule.code}-{kind.lower()}-{number}"] = (Path(example.filename), example.code)
    for path in _public_scripts():
        files[f"accelerate/{path.as_posix().rsplit('/accelerate/', 1)[-1]}"] = (path, path.read_text(encoding="utf-8"))
    return files


@dataclass(frozen=True)
class Comparison:
    asked: int  # nodes the rules asked about
    asked_mismatches: list[str]
    compared: int  # every Name and Attribute
    mismatches: list[str]


@cache
def _compare(display: str) -> Comparison:
    """Run every rule on one file, recording the nodes they ask about; compare those, then every name, with libcst."""
    path, text = _files()[display]
    asked: list[tuple[NameResolver, cst.CSTNode]] = []
    real = NameResolver.qualified_names

    def recording(self: NameResolver, node: cst.CSTNode) -> frozenset[str]:
        asked.append((self, node))
        return real(self, node)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(NameResolver, "qualified_names", recording)
        check_text(text, path=path, display=display, kind="python", rules=list(RULES), explicit=True)

    resolvers = list({id(resolver): resolver for resolver, _ in asked}.values())
    if not resolvers:  # no rule asked (their trigger words are absent): resolve the file afresh
        resolvers = [NameResolver(SyntaxIndex(cst.parse_module(text)))]
    oracles = {id(r): MetadataWrapper(r.index.module, unsafe_skip_copy=True) for r in resolvers}
    answers = {key: wrapper.resolve(QualifiedNameProvider) for key, wrapper in oracles.items()}

    def mismatch(resolver: NameResolver, node: cst.CSTNode) -> str | None:
        if node not in answers[id(resolver)]:
            return f"{type(node).__name__} not in the module: {cst.Module([]).code_for_node(node)!r}"
        ours, theirs = resolver.qualified_names(node), _oracle(oracles[id(resolver)], node)
        if ours == theirs:
            return None
        start = oracles[id(resolver)].resolve(PositionProvider)[node].start
        source = resolver.index.module.code_for_node(node)
        return f"{display}:{start.line}:{start.column + 1} {source!r}: libcst {sorted(theirs)}, lintdist {sorted(ours)}"

    asked_mismatches = [m for m in (mismatch(r, n) for r, n in asked) if m]
    every = [(r, n) for r in resolvers for n in r.index.nodes(cst.Name, cst.Attribute)]
    mismatches = [m for m in (mismatch(r, n) for r, n in every) if m]
    return Comparison(len(asked), asked_mismatches, len(every), mismatches)


# -- differential tests -------------------------------------------------------------------------


@pytest.mark.parametrize("display", list(_files()))
def test_names_rules_ask_about_match_libcst(display):
    assert _compare(display).asked_mismatches == []


@pytest.mark.parametrize("display", list(_files()))
def test_every_name_matches_libcst(display):
    assert _compare(display).mismatches == []


def test_rules_ask_about_names():
    """The differential test above is not vacuous: across the files, the rules ask about many names."""
    asked = sum(_compare(display).asked for display in _files())
    assert asked > 0, "no rule asked the resolver about any node"


@pytest.mark.parametrize(
    "difference", DELIBERATE_DIFFERENCES, ids=[d.code.split("\n", 1)[0] for d in DELIBERATE_DIFFERENCES]
)
def test_deliberate_differences_differ_as_stated(difference):
    index, resolver, wrapper = _both(difference.code)
    node = _nodes_with_code(index, difference.node)[difference.occurrence]
    assert _libcst_names(wrapper.resolve(QualifiedNameProvider), node) == difference.libcst
    assert resolver.qualified_names(node) == difference.lintdist
    assert difference.libcst != difference.lintdist


# -- tricky scoping, snippet by snippet ------------------------------------------------------------

# code, then for some node texts the expected answer of each node with that text, in source order.
SCOPING = {
    "dotted-import": ("import a.b.c\na.b.c.d()\n", {"a.b.c.d": [{"a.b.c.d"}]}),
    "import-as": (
        "import torch.distributed as dist\ndist.barrier()\n",
        {"dist.barrier": [{"torch.distributed.barrier"}]},
    ),
    "relative-import": (
        "from . import x\nfrom ..a import b as c\nx.y()\nc()\n",
        {"x.y": [{".x.y"}], "c": [set(), {"..a.b"}]},
    ),
    "import-in-function": (
        "def f():\n    import apex\n    apex.amp.scale_loss()\n\n\napex.amp.scale_loss()\n",
        {"apex.amp.scale_loss": [{"apex.amp.scale_loss"}, set()]},
    ),
    "try-import-alternatives": (
        "try:\n    from apex import amp\nexcept ImportError:\n    from torch.cuda import amp\namp.autocast()\n",
        {"amp.autocast": [{"apex.amp.autocast", "torch.cuda.amp.autocast"}], "ImportError": [{"builtins.ImportError"}]},
    ),
    "class-attribute-not-in-method": (
        "class C:\n    x = 1\n    y = x\n\n    def m(self):\n        return x\n",
        {"x": [{"C.x"}, {"C.x"}, set()]},
    ),
    "global": (
        "def setup():\n    global group\n    group = make()\n\n\ndef use():\n    group.barrier()\n",
        {"group": [set(), {"group"}, {"group"}]},
    ),
    "comprehension-shadows": (
        "x = 1\nys = [x for x in range(x)]\nx\n",
        {"x": [{"x"}, {"<comprehension>.x"}, {"<comprehension>.x"}, {"x"}, {"x"}]},
    ),
    "module-reassignment": ("from x import f\nf()\nf = g\nf()\n", {"f": [set(), {"x.f"}, {"f"}, {"f", "x.f"}]}),
    "defaults-and-decorators": (
        "class C:\n    size = 1\n    wrap = staticmethod\n\n    @wrap\n    def m(n=size):\n        return size\n",
        {"size": [{"C.size"}, {"C.size"}, set()], "wrap": [{"C.wrap"}, {"C.wrap"}]},
    ),
    "lambda-parameter": ("key = lambda item: item.size\n", {"item.size": [{"<locals>.item.size"}]}),
    "except-as": (
        "try:\n    run()\nexcept OSError as e:\n    print(e.errno)\n",
        {"e.errno": [{"e.errno"}], "OSError": [{"builtins.OSError"}]},
    ),
    "with-as": ("with open(p) as fh:\n    fh.read()\n", {"open": [{"builtins.open"}], "fh.read": [{"fh.read"}]}),
    "walrus": ("if (n := len(xs)) > 1:\n    print(n)\n", {"n": [{"n"}, {"n"}], "xs": [set()]}),
    "builtin-then-shadowed": ("int(x)\nint = float\nint(x)\n", {"int": [{"builtins.int"}, {"int"}, {"int"}]}),
    "nonlocal-bound-later": (
        "def a():\n    def b():\n        nonlocal v\n        v = 2\n\n    v = 1\n    return v\n",
        {"v": [set(), {"a.<locals>.v"}, {"a.<locals>.v"}, {"a.<locals>.v"}]},
    ),
}


@pytest.mark.parametrize(("code", "expected"), list(SCOPING.values()), ids=list(SCOPING))
def test_scoping_snippet(code, expected):
    index, resolver, wrapper = _both(code)
    for text, answers_in_order in expected.items():
        nodes = _nodes_with_code(index, text)
        assert [set(resolver.qualified_names(node)) for node in nodes] == answers_in_order, text
    for node in index.nodes(cst.Name, cst.Attribute):
        assert resolver.qualified_names(node) == _oracle(wrapper, node), index.module.code_for_node(node)


# -- conventional names: snippets without imports -------------------------------------------------

# code, the text of the node asked about, which of the nodes with that text, and lintdist's answer.
CONVENTIONAL = {
    "unbound-dist": ("if rank == 0:\n    dist.barrier()\n", "dist.barrier", 0, {"torch.distributed.barrier"}),
    "unbound-in-function": (
        "def sync():\n    dist.all_reduce(t)\n",
        "dist.all_reduce",
        0,
        {"torch.distributed.all_reduce"},
    ),
    "unbound-class": ("model = DDP(model)\n", "DDP", 0, {"torch.nn.parallel.DistributedDataParallel"}),
    "unbound-module-chain": ("y = F.relu(x)\n", "F.relu", 0, {"torch.nn.functional.relu"}),
    # the import is in another function: at module level (and in `g`) the name is still unbound
    "bound-only-elsewhere": (
        "def f():\n    import mylib as dist\n\n\ndef g():\n    dist.barrier()\n",
        "dist.barrier",
        0,
        {"torch.distributed.barrier"},
    ),
    "assigned": ("dist = make_group()\ndist.barrier()\n", "dist.barrier", 0, {"dist.barrier"}),
    "assigned-later-at-module-level": ("dist.barrier()\ndist = make_group()\n", "dist.barrier", 0, {"dist.barrier"}),
    "parameter": ("def f(dist):\n    dist.barrier()\n", "dist.barrier", 0, {"f.<locals>.dist.barrier"}),
    "import-of-something-else": ("import mylib as dist\ndist.barrier()\n", "dist.barrier", 0, {"mylib.barrier"}),
    "from-import-of-something-else": ("from mylib import F\nF.relu(x)\n", "F.relu", 0, {"mylib.F.relu"}),
    "later-local-binding": (
        "def f():\n    dist.barrier()\n    dist = make_group()\n",
        "dist.barrier",
        0,
        {"f.<locals>.dist.barrier"},
    ),
    "later-local-binding-bare-read": ("def f():\n    print(dist)\n    dist = 1\n", "dist", 0, set()),
    "enclosing-function-binds": (
        "def f(dist):\n    def g():\n        dist.barrier()\n",
        "dist.barrier",
        0,
        {"f.<locals>.dist.barrier"},
    ),
    "global-declaration": ("def f():\n    global dist\n    dist.barrier()\n", "dist.barrier", 0, set()),
    "star-import": ("from helpers import *\ndist.barrier()\n", "dist.barrier", 0, set()),
    "class-body-binding": ("class C:\n    F = loss_functions\n    F.relu\n", "F.relu", 0, {"C.F.relu"}),
    "not-conventional": ("accelerator.wait_for_everyone()\n", "accelerator.wait_for_everyone", 0, set()),
    "attribute-named-like-one": ("cfg.dist.barrier()\n", "cfg.dist.barrier", 0, set()),
}


@pytest.mark.parametrize(
    ("code", "text", "occurrence", "expected"), list(CONVENTIONAL.values()), ids=list(CONVENTIONAL)
)
def test_conventional_name(code, text, occurrence, expected):
    index, resolver, wrapper = _both(code)
    node = _nodes_with_code(index, text)[occurrence]
    assert resolver.qualified_names(node) == expected
    assert resolver.qualified_names(node) == _oracle(wrapper, node)  # libcst's answer, but for this one rule


def test_conventional_names_the_file_reads_unbound():
    code = "import torch\n\n\ndef f(nn):\n    return nn\n\n\ndist.barrier()\nDDP(torch.nn.Linear(1, 1))\n"
    _, resolver, _ = _both(code)
    assert resolver.unbound_conventional() == {"dist", "DDP"}


def test_conventional_names_stand_for_imports_in_the_facts():
    """Checks that ask "does the file import accelerate?" or "can this bare name be an imported function?" see the
    imports a snippet's conventional names stand for."""
    from lintdist.facts import PythonFacts

    index, resolver, _ = _both("accelerator = Accelerator()\nmodel = DDP(model)\n")
    facts = PythonFacts(index, resolver)
    assert facts.imports("accelerate") and facts.imports("torch.nn.parallel")
    assert {"Accelerator", "DDP"} <= facts.imported_names
    call = index.nodes(cst.Call)[1]
    assert facts.callee_is(call, frozenset({"torch.nn.parallel.DistributedDataParallel"}))
    bound, bound_resolver, _ = _both("from mylib import DDP\nmodel = DDP(model)\n")
    assert not PythonFacts(bound, bound_resolver).imports("torch")
