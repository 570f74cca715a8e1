"""Backward passes and forward calls along the paths of a block: the most that run on one path through it.

The branches of an ``if`` (or ``match``, or ``try`` handlers) are alternatives; a loop body counts once, and
records the loop; ``return``, ``raise``, ``break`` and ``continue`` end a path early (those paths count too);
a ``with torch.no_grad()`` block and a nested ``accumulate`` block count nothing; a backward inside a local
helper counts where the helper is called (up to ``MAX_HELPER_DEPTH`` levels, recursion counting nothing).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.gradients import context_callee, enters_no_grad, freezes, freezes_call, runs_in_step
from lintdist.syntax import children
from lintdist.wrappers import forward_of

EXITS = (cst.Return, cst.Raise, cst.Break, cst.Continue)
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
MAX_HELPER_DEPTH = 4


@dataclass(frozen=True)
class Tally:
    """Backward passes and forward calls of the counted models along one path."""

    backward: int = 0
    forward: int = 0

    def __add__(self, other: Tally) -> Tally:
        return Tally(self.backward + other.backward, self.forward + other.forward)

    def widest(self, other: Tally | None) -> Tally:
        if other is None:
            return self
        return Tally(max(self.backward, other.backward), max(self.forward, other.forward))


def _widest(a: Tally | None, b: Tally | None) -> Tally | None:
    return b if a is None else a.widest(b)


@dataclass(frozen=True)
class Paths:
    """The largest tallies of the paths through some code: those that reach its end, and those that leave early."""

    through: Tally | None = Tally()
    left: Tally | None = None

    def then(self, after: Paths) -> Paths:
        if self.through is None:
            return self
        through = None if after.through is None else self.through + after.through
        left = _widest(self.left, None if after.left is None else self.through + after.left)
        return Paths(through, left)

    def either(self, other: Paths) -> Paths:
        return Paths(_widest(self.through, other.through), _widest(self.left, other.left))

    @property
    def most(self) -> Tally:
        return _widest(self.through, self.left) or Tally()


@dataclass
class BlockWalk:
    """What one count over a block passed: the backward calls, the first loop (or comprehension) that runs a
    backward, and the calls or statements that freeze parameters."""

    backward_calls: list[cst.Call] = field(default_factory=list)
    loop: cst.CSTNode | None = None
    frozen: list[cst.CSTNode] = field(default_factory=list)


class PassCounter:
    """Counts the backward passes (also in the local helpers called) and the forward calls of ``models`` (their
    dotted names) along the paths of a block; ``walk`` collects what the count passed."""

    def __init__(self, loop, models: frozenset[str]) -> None:
        self.facts = loop.facts
        self.loop = loop
        self.models = models
        self.walk = BlockWalk()
        self._helpers: dict[int, Tally] = {}
        self._stack: list[int] = []

    # statements

    def suite(self, suite: cst.BaseSuite) -> Paths:
        if isinstance(suite, cst.SimpleStatementSuite):
            return self._smalls(suite.body)
        return self.statements(suite.body)

    def statements(self, statements) -> Paths:
        paths = Paths()
        for statement in statements:
            paths = paths.then(self.statement(statement))
        return paths

    def statement(self, node: cst.CSTNode) -> Paths:
        if isinstance(node, cst.SimpleStatementLine):
            return self._smalls(node.body)
        if isinstance(node, cst.If):
            alternative = Paths() if node.orelse is None else self.orelse(node.orelse)
            return Paths(self.expression(node.test)).then(self.suite(node.body).either(alternative))
        if isinstance(node, (cst.For, cst.While)):
            head = self.expression(node.iter if isinstance(node, cst.For) else node.test)
            body = self.suite(node.body)
            if body.most.backward and self.walk.loop is None:
                self.walk.loop = node
            # break and continue end an iteration, not the block
            paths = Paths(head).then(Paths(body.most))
            return paths.then(self.orelse(node.orelse)) if node.orelse is not None else paths
        if isinstance(node, (cst.Try, cst.TryStar)):
            body = self.suite(node.body)
            if node.orelse is not None:
                body = body.then(self.orelse(node.orelse))
            for handler in node.handlers:
                body = body.either(self.suite(handler.body))
            return body.then(self.suite(node.finalbody.body)) if node.finalbody is not None else body
        if isinstance(node, cst.With):
            if self._skipped(node):
                return Paths()
            head = sum((self.expression(item.item) for item in node.items), Tally())
            return Paths(head).then(self.suite(node.body))
        if isinstance(node, cst.Match):
            paths = None
            for case in node.cases:
                branch = self.suite(case.body)
                paths = branch if paths is None else paths.either(branch)
            return Paths(self.expression(node.subject)).then(paths or Paths())
        return Paths()  # function and class definitions do not run here

    def orelse(self, node: cst.CSTNode) -> Paths:
        return self.statement(node) if isinstance(node, cst.If) else self.suite(node.body)

    def _smalls(self, smalls) -> Paths:
        paths = Paths()
        for small in smalls:
            if freezes(small):
                self.walk.frozen.append(small)
            tally = self.expression(small)
            paths = paths.then(Paths(None, tally) if isinstance(small, EXITS) else Paths(tally))
        return paths

    def _skipped(self, node: cst.With) -> bool:
        """``torch.no_grad()``/``inference_mode()`` blocks count nothing; a nested ``accumulate`` is its own block."""
        return enters_no_grad(self.facts, node) or any(
            isinstance(target := context_callee(item), cst.Attribute) and target.attr.value == "accumulate"
            for item in node.items
        )

    # expressions

    def expression(self, node: cst.CSTNode | None) -> Tally:
        if node is None or isinstance(node, cst.Lambda):
            return Tally()
        if isinstance(node, cst.IfExp):
            return self.expression(node.test) + self.expression(node.body).widest(self.expression(node.orelse))
        total = Tally()
        for child in children(node):
            total = total + self.expression(child)
        if isinstance(node, COMPREHENSIONS) and total.backward and self.walk.loop is None:
            self.walk.loop = node
        if isinstance(node, cst.Call):
            total = total + self._call(node)
        return total

    def _call(self, call: cst.Call) -> Tally:
        facts = self.facts
        if self.loop.backward_site(call) is not None:
            self.walk.backward_calls.append(call)
            return Tally(backward=1)
        if freezes_call(facts, call):
            self.walk.frozen.append(call)
        if forward_of(call, self.models) is not None:
            return Tally(forward=1)
        helpers = facts.local_functions(call)
        if not helpers or len(self._stack) >= MAX_HELPER_DEPTH:
            return Tally()
        return Tally(backward=max(self.helper_backward(function) for function in helpers))

    def helper_backward(self, function: cst.FunctionDef) -> int:
        """The most backward passes on one path through a local function (recursion counts nothing)."""
        key = id(function)
        if key in self._stack:
            return 0
        if key not in self._helpers:
            self._stack.append(key)
            self._helpers[key] = self.suite(function.body).most
            self._stack.pop()
        return self._helpers[key].backward


def models_per_backward(counter: PassCounter, block: cst.With, span) -> list[set[str]]:
    """For each backward pass of ``block`` (also one inside a local helper called there), the counted models that
    run for it: called, or handed to a local helper, after the previous backward. The calls run in evaluation
    order, by where they end (``span(node)`` gives its position); calls in nested functions or under ``no_grad``
    do not run."""
    facts = counter.facts
    calls = sorted(
        (c for c in facts.calls_within(block.body) if runs_in_step(facts, c, block)),
        key=lambda c: (span(c).end_line, span(c).end_column),
    )
    segments: list[set[str]] = [set()]
    for call in calls:
        segments[-1] |= _models_run(facts, call, counter.models)
        if counter.loop.backward_site(call) is not None or any(
            counter.helper_backward(f) for f in facts.local_functions(call)
        ):
            segments.append(set())
    return segments[:-1]


def _models_run(facts, call: cst.Call, models: frozenset[str]) -> set[str]:
    name = forward_of(call, models)
    if name is not None:
        return {name}
    if not facts.local_functions(call):
        return set()
    return {name for arg in call.args if (name := get_full_name_for_node(arg.value)) in models}
