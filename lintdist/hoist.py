"""Splitting a main-process guard so that chosen calls run on every rank, and what may run there safely.

``hoist`` rewrites ``if <main process>: ...`` so that the calls it is given (collectives) leave the guard with the
statements that set up their arguments, while every other statement stays under a copy of the guard, in its place:
the main process runs what it ran before, in the same order. ``NoHoist`` says why a block cannot be split.
``is_pure`` and ``helper_repeatable`` say what may run on every rank without changing the job; ``logs_on_main``
recognises a log call that writes on the main process only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.collectives import collective_kind, is_barrier
from lintdist.edits import replace_nodes
from lintdist.facts import MAIN_FLAGS, RANK_GETTERS, RANK_NAMES, barrier_unsafe
from lintdist.main_process import main_conjuncts, outermost_main_guard, under_main_guard

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# Calls that read nothing per rank and write nothing: they may run on every rank (argument set-up, conditions).
PURE_FUNCTIONS = frozenset(
    {f"os.path.{name}" for name in ("join", "basename", "dirname", "splitext", "abspath", "expanduser")}
    | {"pathlib.Path", "pathlib.PurePath"}
)
PURE_BUILTINS = frozenset(
    {"str", "int", "float", "bool", "len", "isinstance", "min", "max", "abs", "round", "tuple", "list", "repr"}
)
PURE_METHODS = frozenset({"unwrap_model", "format", "join"})
LOG_METHODS = frozenset({"debug", "info", "warning", "warn"})
# Names whose value differs between ranks, or that make per-rank data: a condition or set-up that reads one is not
# hoisted.
PER_RANK_NAMES = (
    RANK_NAMES
    | RANK_GETTERS
    | MAIN_FLAGS
    | frozenset({"RANK", "LOCAL_RANK", "is_last_process", "local_main_process_first", "main_process_first", "device"})
)
PER_RANK_METHODS = frozenset({"item", "tolist", "cpu", "detach", "numpy", "mean", "sum", "compute", "backward"})
_ESCAPES = (cst.Return, cst.Break, cst.Continue)


@dataclass(frozen=True)
class Ordering:
    """How a call that leaves the guard is ordered against the rank-0 work that stays guarded before it."""

    barrier: bool = False  # it is a barrier: that work ends before any rank passes it
    writes: bool = False  # it writes on every rank (`save_state`): a barrier must come first
    owner: cst.BaseExpression | None = None  # the Accelerator that barrier is called on (None: none in sight)


class NoHoist(Exception):
    """Why the guarded block cannot be split (the message names it)."""


class _Hoist:
    """Rewrites ``if <main>: ...`` so that the collectives in it run on every rank.

    A statement of the guarded block that holds a collective either is the call itself (``accelerator.save_state(p)``
    or ``sd = accelerator.get_state_dict(m)``): it leaves the guard; or holds it as an argument
    (``m.save_pretrained(d, state_dict=accelerator.get_state_dict(m))``): the call is bound to a new name on every rank
    and the statement stays guarded; or is an ``if`` whose condition reads no rank: the ``if`` leaves the guard and its
    blocks are split the same way. The statements that set up the call's arguments (``save_path = ...``) leave with
    it; every other statement stays under a copy of the guard's test, in its place, so the main process runs the
    same statements in the same order as before. A call that writes on every rank (``save_state``) and follows
    rank-0 work that stays guarded (checkpoint rotation) gets a barrier just before it: without one the other ranks
    would create the new folder while the main process may still be listing the old ones to delete them."""

    def __init__(
        self,
        facts: PythonFacts,
        guard: cst.If,
        anchors: list[cst.CSTNode],
        inner: list[cst.If],
        orderings: dict[int, Ordering],
        bindable: Callable[[cst.Call], str | None],
    ) -> None:
        self.facts = facts
        self.guard = guard
        self.anchors = anchors
        self.orderings = orderings  # by anchor: how its call is ordered against the rank-0 work before it
        self.bindable = bindable
        self.copies: list[cst.If] = []  # the copies of the guard, around the statements that stay guarded
        self.ordered: dict[int, Ordering] = {}  # the lines that leave the guard whole, by their anchor's `Ordering`
        self.inner = list(inner)  # main-process guards inside ``guard``: their statements join its copies
        self.function = facts.enclosing_function(guard)
        self.scope = self.function if self.function is not None else facts.index.module
        self.bound: set[str] = set()  # names the statements leaving the guard bind
        self.taken: set[str] = set()
        self.header_used = False

    def fix(self) -> list[cst.BaseStatement]:
        guard, facts = self.guard, self.facts
        if guard.orelse is not None:
            raise NoHoist("the guard has an `else` branch")
        if not isinstance(guard.body, cst.IndentedBlock) or not isinstance(
            facts.parent(guard), (cst.IndentedBlock, cst.Module)
        ):
            raise NoHoist("the guard is not a plain `if` block")
        if any(line.comment is not None for line in guard.body.footer):
            raise NoHoist("a comment closes the guarded block")
        if facts.rank_guard(guard) is not None or under_main_guard(facts, guard):
            raise NoHoist("the guard sits inside another main-process guard")
        mains, rest = main_conjuncts(facts, guard.test)
        if not mains:
            self.test = guard.test
        else:
            # `if accelerator.is_main_process and step % k == 0:`: the step test wraps the split block
            for part in rest:
                self._check_uniform(part, "condition")
            self.test = _conjunction(mains)
        statements, needed = self._split(list(guard.body.body), set())
        statements, _ = self._barriers(statements, False)
        if rest:
            needed |= set().union(*(self._reads(part) for part in rest))
            header = cst.TrailingWhitespace() if self.header_used else guard.body.header
            self.header_used = True
            statements = [
                cst.If(
                    test=_conjunction(rest),
                    body=cst.IndentedBlock(body=statements, header=header),
                )
            ]
        if not self.header_used and guard.body.header.comment is not None:
            raise NoHoist("the guard's comment would have no place")
        self._check_available(needed)
        self._check_bound_names()
        first = statements[0]
        statements[0] = first.with_changes(leading_lines=(*guard.leading_lines, *first.leading_lines))
        return statements

    # -- splitting blocks ---------------------------------------------------------------------

    def _holds_anchor(self, node: cst.CSTNode) -> bool:
        return any(a is node or self.facts.is_within(a, node) for a in self.anchors)

    def _split(self, statements: list[cst.BaseStatement], needed: set[str]) -> tuple[list[cst.BaseStatement], set]:
        """The statements of one block, with the collectives out of the guard; ``needed``: the names the statements
        after this block read on every rank (in), and those this block's statements read on every rank (out)."""
        items: list[tuple[bool, cst.BaseStatement]] = []  # (on every rank, statement), in reverse
        for statement in reversed(self._unfold(statements)):
            if self._holds_anchor(statement):
                if isinstance(statement, cst.SimpleStatementLine):
                    shared, kept, needed = self._split_line(statement, needed)
                    if kept is not None:
                        items.append((False, kept))
                    items.extend((True, s) for s in reversed(shared))
                elif isinstance(statement, cst.If):
                    new, needed = self._split_if(statement, needed)
                    items.append((True, new))
                else:
                    raise NoHoist(f"the call sits in a `{_keyword(statement)}` block under the guard")
                continue
            bound = self._bound(statement)
            if bound & needed:
                needed = self._setup(statement, bound, needed)
                items.append((True, statement))
                continue
            if items and items[-1][0] and bound and self._movable(statement, bound):
                # a pure assignment just before the shared code leaves with it rather than split the guard
                needed = self._setup(statement, bound, needed)
                items.append((True, statement))
                continue
            self._check_stays(statement)
            items.append((False, statement))
        items.reverse()
        out: list[cst.BaseStatement] = []
        run: list[cst.BaseStatement] = []
        for shared, statement in items:
            if shared:
                if run:
                    out.append(self._guarded(run))
                    run = []
                out.append(statement)
            else:
                run.append(statement)
        if run:
            out.append(self._guarded(run))
        return out, needed

    def _unfold(self, statements: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """An inner main-process guard testing what the outer one tests is replaced by its statements: on the main
        process they run as before, and the ones that stay guarded go under a copy of the outer guard."""
        out: list[cst.BaseStatement] = []
        code = cst.Module([]).code_for_node
        for statement in statements:
            if not any(statement is guard for guard in self.inner):
                out.append(statement)
                continue
            if statement.orelse is not None or not isinstance(statement.body, cst.IndentedBlock):
                raise NoHoist("the inner main-process guard has an `else` branch")
            if statement.body.header.comment is not None or any(line.comment for line in statement.body.footer):
                raise NoHoist("a comment on the inner main-process guard would have no place")
            if code(statement.test) != code(self.test):
                raise NoHoist("the inner guard tests another process than the outer one")
            body = list(statement.body.body)
            body[0] = body[0].with_changes(leading_lines=(*statement.leading_lines, *body[0].leading_lines))
            out.extend(self._unfold(body))
        return out

    def _split_if(self, statement: cst.If, needed: set[str]) -> tuple[cst.If, set[str]]:
        self._check_uniform(statement.test, "condition")
        body, inner = self._split(list(_block(statement.body)), set(needed))
        orelse = statement.orelse
        other = set(needed)
        if isinstance(orelse, cst.If):
            orelse, other = self._split_if(orelse, set(needed))
        elif isinstance(orelse, cst.Else):
            else_body, other = self._split(list(_block(orelse.body)), set(needed))
            orelse = orelse.with_changes(body=orelse.body.with_changes(body=else_body))
        new = statement.with_changes(body=statement.body.with_changes(body=body), orelse=orelse)
        return new, inner | other | self._reads(statement.test)

    def _split_line(
        self, line: cst.SimpleStatementLine, needed: set[str]
    ) -> tuple[list[cst.SimpleStatementLine], cst.SimpleStatementLine | None, set[str]]:
        """A line with a collective: it leaves the guard, or its collectives are bound to names on every rank first."""
        if len(line.body) != 1:
            raise NoHoist("the call shares its line with other statements")
        small = line.body[0]
        anchors = [a for a in self.anchors if a is small or self.facts.is_within(a, small)]
        whole = (isinstance(small, cst.Expr) and small.value in anchors) or (
            isinstance(small, cst.Assign)
            and small.value in anchors
            and all(isinstance(t.target, cst.Name) for t in small.targets)
        )
        if whole:
            self._check_call(small.value if isinstance(small, (cst.Expr, cst.Assign)) else small)
            if id(small.value) in self.orderings:
                self.ordered[id(line)] = self.orderings[id(small.value)]
            bound = self._bound(line)
            self.bound |= bound
            return [line], None, (needed - bound) | self._reads(line)
        shared: list[cst.SimpleStatementLine] = []
        swaps: list[tuple[cst.CSTNode, cst.Name]] = []
        reads: set[str] = set()
        for anchor in anchors:
            if not isinstance(anchor, cst.Call) or self.bindable(anchor) is None:
                raise NoHoist("the call is part of a larger statement")
            self._check_extractable(anchor, small)
            self._check_call(anchor)
            name = self._new_name(anchor)
            self.bound.add(name)
            shared.append(
                cst.SimpleStatementLine(body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=anchor)])
            )
            swaps.append((anchor, cst.Name(name)))
            reads |= self._reads(anchor)
        # in one pass: `deep_replace` copies the line, so a second anchor would no longer be found in it
        kept = replace_nodes(line, swaps)
        if shared:
            shared[0] = shared[0].with_changes(leading_lines=line.leading_lines)
            kept = kept.with_changes(leading_lines=())
        return shared, kept, needed | reads

    def _guarded(self, run: list[cst.BaseStatement]) -> cst.If:
        """The statements of ``run`` under a copy of the guard (its comments stay in place)."""
        first = run[0]
        header = self.guard.body.header
        if self.header_used:
            header = cst.TrailingWhitespace()
        self.header_used = True
        copy = self.guard.with_changes(
            test=self.test.deep_clone(),
            body=self.guard.body.with_changes(
                header=header, body=[first.with_changes(leading_lines=()), *run[1:]], footer=()
            ),
            leading_lines=first.leading_lines,
        )
        self.copies.append(copy)
        return copy

    def _barriers(self, statements: list[cst.BaseStatement], after_work: bool) -> tuple[list, bool]:
        """``statements`` with a barrier before each line that writes on every rank and that rank-0 work (a copy of
        the guard) may precede on some path, ``after_work`` saying whether some did before them; and whether some
        may still precede what follows them."""
        out: list[cst.BaseStatement] = []
        for statement in statements:
            ordering = self.ordered.get(id(statement))
            if any(statement is copy for copy in self.copies):
                after_work = True
            elif isinstance(statement, cst.If):
                statement, after_work = self._if_barriers(statement, after_work)
            elif ordering is not None and ordering.barrier:
                after_work = False
            elif ordering is not None and ordering.writes and after_work:
                if ordering.owner is None:
                    raise NoHoist(
                        "rank-0 work comes before the call, and no Accelerator is in sight at the helper's call to "
                        "make the other ranks wait for it"
                    )
                wait = cst.Call(cst.Attribute(value=ordering.owner.deep_clone(), attr=cst.Name("wait_for_everyone")))
                out.append(cst.SimpleStatementLine(body=[cst.Expr(wait)], leading_lines=statement.leading_lines))
                statement = statement.with_changes(leading_lines=())
                after_work = False
            out.append(statement)
        return out, after_work

    def _if_barriers(self, statement: cst.If, after_work: bool) -> tuple[cst.If, bool]:
        body, after_body = self._barriers(list(statement.body.body), after_work)
        orelse, after_other = statement.orelse, after_work
        if isinstance(orelse, cst.If):
            orelse, after_other = self._if_barriers(orelse, after_work)
        elif isinstance(orelse, cst.Else):
            else_body, after_other = self._barriers(list(orelse.body.body), after_work)
            orelse = orelse.with_changes(body=orelse.body.with_changes(body=else_body))
        new = statement.with_changes(body=statement.body.with_changes(body=body), orelse=orelse)
        return new, after_body or after_other

    # -- checks -----------------------------------------------------------------------------

    def _setup(self, statement: cst.BaseStatement, bound: set[str], needed: set[str], dry: bool = False) -> set[str]:
        """A statement that sets up what the call reads: it must run on every rank, so it must be a plain
        assignment of a value every rank computes alike, with no side effect."""
        names = ", ".join(f"`{n}`" for n in sorted(bound & needed))
        if not (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], (cst.Assign, cst.AnnAssign))
            and statement.body[0].value is not None
            and all(isinstance(t.target, cst.Name) for t in getattr(statement.body[0], "targets", ()))
        ):
            raise NoHoist(f"{names}, which the call reads, is set by rank-0 code that cannot leave the guard")
        self._check_uniform(statement.body[0].value, f"set-up of {names}")
        if dry:
            return needed
        self.bound |= bound
        return (needed - bound) | self._reads(statement)

    def _movable(self, statement: cst.BaseStatement, bound: set[str]) -> bool:
        try:
            self._setup(statement, bound, set(), dry=True)
        except NoHoist:
            return False
        if self._read_outside(bound):
            return False
        return not self.facts.within(statement, cst.Call) or all(
            self._pure(c) for c in self.facts.within(statement, cst.Call)
        )

    def _check_stays(self, statement: cst.BaseStatement) -> None:
        """A statement that stays guarded must not leave the block early on the main process only."""
        for node in self.facts.within(statement, *_ESCAPES):
            if isinstance(node, cst.Return) or not any(
                isinstance(a, (cst.For, cst.While)) and self.facts.is_within(a, statement)
                for a in self.facts.ancestors(node)
            ):
                raise NoHoist("the rank-0 code under the guard can leave the block early (`return`/`break`)")

    def _check_call(self, call: cst.CSTNode) -> None:
        args = call.args if isinstance(call, cst.Call) else ()
        for arg in args:
            self._check_uniform(arg.value, "argument of the call")

    def _check_uniform(self, expr: cst.BaseExpression, what: str, depth: int = 0) -> None:
        """``expr`` has the same value on every rank as far as lintdist can tell: it reads no rank and no per-rank
        value, and calls nothing but pure helpers."""
        facts = self.facts
        for string in facts.within(expr, cst.SimpleString):
            if "RANK" in string.value:
                raise NoHoist(f"the {what} reads the rank")
        for call in facts.within(expr, cst.Call):
            if not self._pure(call):
                callee = get_full_name_for_node(call.func) or "a call"
                raise NoHoist(f"the {what} calls `{callee}()`, which may differ between ranks")
        for name in facts.within(expr, cst.Name):
            if name.value in PER_RANK_NAMES:
                raise NoHoist(f"the {what} reads the rank (`{name.value}`)")
        for name in self._read_names(expr):
            if depth >= 2:
                continue
            for binding in facts.bindings(name.value, expr):
                if self.facts.is_within(binding.statement, self.guard):
                    continue  # checked where it stands
                if any(facts.method_name(c) in PER_RANK_METHODS for c in facts.within(binding.value, cst.Call)):
                    raise NoHoist(f"the {what} reads `{name.value}`, a per-rank value")
                for inner in facts.within(binding.value, cst.Name):
                    if inner.value in PER_RANK_NAMES:
                        raise NoHoist(f"the {what} reads `{name.value}`, which derives from the rank")

    def _pure(self, call: cst.Call) -> bool:
        return is_pure(self.facts, call)

    def _check_extractable(self, call: cst.Call, small: cst.BaseSmallStatement) -> None:
        """``call`` can be evaluated before the rest of its statement: it is not inside a lambda, a comprehension or
        a conditional expression, and whatever the statement evaluates before it is pure."""
        facts = self.facts
        for ancestor in facts.ancestors(call):
            if ancestor is small:
                break
            if isinstance(
                ancestor,
                (
                    cst.Lambda,
                    cst.IfExp,
                    cst.BooleanOperation,
                    cst.ListComp,
                    cst.SetComp,
                    cst.DictComp,
                    cst.GeneratorExp,
                ),
            ):
                raise NoHoist("the call is evaluated conditionally inside its statement")
        order = facts.index.order(call)
        for other in facts.within(small, cst.Call):
            if facts.index.order(other) < order and not facts.is_within(call, other) and not self._pure(other):
                raise NoHoist("the statement calls other code before the collective")

    def _check_available(self, needed: set[str]) -> None:
        """What the moved statements read is set on every rank before the guard."""
        facts = self.facts
        for name in sorted(needed):
            for binding in facts.bindings(name, self.guard):
                if facts.is_within(binding.statement, self.guard):
                    continue
                if facts.rank_guard(binding.statement) is not None:
                    raise NoHoist(f"`{name}`, which the call reads, is set only on the main process")

    def _check_bound_names(self) -> None:
        """The names the moved statements bind are read nowhere else: on the other ranks they would now hold a
        value where they held none (or an older one)."""
        for name in self._read_outside(self.bound):
            raise NoHoist(f"`{name.value}`, set under the guard, is also read outside it")

    def _read_outside(self, names: set[str]) -> list[cst.Name]:
        facts = self.facts
        return [
            name
            for name in self._read_names(self.scope)
            if name.value in names and not facts.is_within(name, self.guard) and not self._set_before(name)
        ]

    def _set_before(self, name: cst.Name) -> bool:
        """An assignment of ``name`` runs before this read on every path: an earlier statement of a block that
        holds the read (``save_path = ...; save_progress(save_path)``), outside the guard."""
        facts = self.facts
        child: cst.CSTNode = name
        for ancestor in facts.ancestors(name):
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                for statement in ancestor.body:
                    if statement is child:
                        break
                    if (
                        isinstance(statement, cst.SimpleStatementLine)
                        and statement is not self.guard
                        and any(
                            isinstance(small, cst.Assign) and any(_is_name(t.target, name.value) for t in small.targets)
                            for small in statement.body
                        )
                    ):
                        return True
            if ancestor is self.scope:
                return False
            child = ancestor
        return False

    def _new_name(self, call: cst.Call) -> str:
        first = call.args[0].value if call.args else None
        while isinstance(first, cst.Call):  # `get_state_dict(accelerator.unwrap_model(model))`: name it after `model`
            first = first.args[0].value if first.args else None
        stem = get_full_name_for_node(first) if first is not None else None
        stem = stem.rsplit(".", 1)[-1] if stem else ""
        suffix = self.bindable(call)
        used = {n.value for n in self.facts.within(self.scope, cst.Name)} | self.taken
        for candidate in (f"{stem}_{suffix}" if stem else suffix, f"{stem}_{suffix}_all" if stem else f"{suffix}_all"):
            if candidate.isidentifier() and candidate not in used:
                self.taken.add(candidate)
                return candidate
        raise NoHoist("no free name for the collective's result")

    # -- names ------------------------------------------------------------------------------

    def _read_names(self, node: cst.CSTNode) -> list[cst.Name]:
        """The names ``node`` reads: not attribute names, keywords or assignment targets."""
        facts = self.facts
        skip: set[int] = set()
        for attribute in facts.within(node, cst.Attribute):
            skip.add(id(attribute.attr))
        for arg in facts.within(node, cst.Arg):
            if arg.keyword is not None:
                skip.add(id(arg.keyword))
        for target in facts.within(node, cst.AssignTarget):
            if isinstance(target.target, cst.Name):
                skip.add(id(target.target))
        return [n for n in facts.within(node, cst.Name) if id(n) not in skip]

    def _reads(self, node: cst.CSTNode) -> set[str]:
        return {n.value for n in self._read_names(node)}

    def _bound(self, statement: cst.CSTNode) -> set[str]:
        """The names a statement binds (assignments, loop and ``with`` targets, walrus), at any depth."""
        facts = self.facts
        names: set[str] = set()
        targets: list[cst.CSTNode] = []
        for node in facts.within(statement, cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.AsName):
            if isinstance(node, cst.AsName):
                targets.append(node.name)
            elif isinstance(node, cst.AssignTarget):
                targets.append(node.target)
            else:
                targets.append(node.target)
        for node in facts.within(statement, cst.NamedExpr):
            targets.append(node.target)
        for target in targets:
            names |= {n.value for n in facts.within(target, cst.Name)}
        return names


def is_pure(facts: PythonFacts, call: cst.Call) -> bool:
    """A call with no side effect whose value is the same on every rank given the same arguments."""
    if (
        isinstance(call.func, cst.Name)
        and call.func.value in PURE_BUILTINS
        and not facts.bindings(call.func.value, call)
    ):
        return True
    if facts.qualified_names(call.func) & PURE_FUNCTIONS:
        return True
    method = facts.method_name(call)
    if method == "unwrap_model":
        return True
    if method in PURE_METHODS and isinstance(call.func, cst.Attribute):
        return isinstance(call.func.value, (cst.SimpleString, cst.ConcatenatedString))
    return False


def _block(body: cst.BaseSuite) -> tuple[cst.BaseStatement, ...]:
    if not isinstance(body, cst.IndentedBlock):
        raise NoHoist("a one-line `if` holds the call")
    return tuple(body.body)


def _keyword(statement: cst.CSTNode) -> str:
    return {cst.For: "for", cst.While: "while", cst.With: "with", cst.Try: "try"}.get(type(statement), "compound")


def _conjunction(parts: list[cst.BaseExpression]) -> cst.BaseExpression:
    code = cst.Module([]).code_for_node
    try:
        return cst.parse_expression(" and ".join(code(p) for p in parts))
    except cst.ParserSyntaxError as error:
        raise NoHoist("the guard's condition cannot be split") from error


def _is_name(node: cst.CSTNode, value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def hoist(
    facts: PythonFacts,
    guard: cst.If,
    anchors: list[cst.CSTNode],
    inner: list[cst.If] = (),
    orderings: dict[int, Ordering] | None = None,
    bindable: Callable[[cst.Call], str | None] = lambda call: None,
) -> list[cst.BaseStatement]:
    """The statements that replace ``guard`` once the ``anchors`` (calls, or the statements holding them) run on
    every rank; raises ``NoHoist`` with the reason when that cannot be done safely. ``inner``: main-process guards
    inside ``guard`` whose statements join its copies; ``orderings``: by anchor, how its call is ordered against
    the rank-0 work before it; ``bindable``: for a call nested in a larger statement, the stem of the name it is
    bound to first (``"state_dict"``), None when it may not be."""
    return _Hoist(facts, guard, anchors, inner, orderings or {}, bindable).fix()


def helper_repeatable(facts: PythonFacts, site: cst.CSTNode, allowed: Callable[[cst.Call], bool]) -> str:
    """Why the local function called at ``site`` may not run on every rank, or "" when it may: its body only sets
    names from pure values, makes calls ``allowed`` accepts (with pure arguments), and returns nothing."""
    functions = facts.local_functions(site) if isinstance(site, cst.Call) else []
    if len(functions) != 1:
        return "the collective sits in a helper called through another helper"
    body = functions[0].body
    if not isinstance(body, cst.IndentedBlock) or functions[0].asynchronous is not None:
        return "the collective sits in a helper that cannot be read"
    for statement in body.body:
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return "the collective sits in a helper that also does other work"
        small = statement.body[0]
        if isinstance(small, cst.Pass) or (isinstance(small, cst.Return) and small.value is None):
            continue
        if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
            continue  # docstring
        if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
            inner = small.value
            if allowed(inner) and all(is_pure(facts, c) for c in facts.within(inner, cst.Call) if c is not inner):
                continue
        if (
            isinstance(small, cst.Assign)
            and all(isinstance(t.target, cst.Name) for t in small.targets)
            and all(is_pure(facts, c) for c in facts.within(small.value, cst.Call))
        ):
            continue
        return "the collective sits in a helper that also writes files"
    return ""


def logs_on_main(facts: PythonFacts, call: cst.Call) -> bool:
    """``logger.info(...)`` (accelerate's logger logs on the main process only by default) or
    ``accelerator.print(...)`` (the main process prints)."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return False
    if func.attr.value == "print":
        return facts.accelerator_like(func.value, call)
    return (
        func.attr.value in LOG_METHODS
        and isinstance(func.value, cst.Name)
        and func.value.value in {"logger", "logging", "log", "LOGGER"}
    )


# -- splitting a guard around collectives -------------------------------------------------------------------

# Collectives that return a value, so that a call nested in a larger statement can be bound to a name first.
VALUE_COLLECTIVES = frozenset({"get_state_dict", "gather", "gather_for_metrics", "reduce", "pad_across_processes"})
# Accelerator methods that create the target folder and write files on every rank (`random_states_<i>.pkl`, the
# shards): rank-0 work before them (checkpoint rotation) must end before the other ranks start them.
FOLDER_WRITERS = frozenset({"save_state", "save_model"})


def binding_stem(facts: PythonFacts, call: cst.Call) -> str | None:
    """The stem of the name a value-returning collective nested in a larger statement is bound to first
    (``state_dict`` for ``get_state_dict``, else ``gathered``); None for a collective whose value is not kept."""
    method = facts.method_name(call)
    if method not in VALUE_COLLECTIVES:
        return None
    return "state_dict" if method == "get_state_dict" else "gathered"


def collective_ordering(facts: PythonFacts, call: cst.Call, via: cst.Call | None, guard: cst.CSTNode) -> Ordering:
    """How the collective ``call`` (reached through the helper call ``via``, if any) is ordered against the rank-0
    work before it once it leaves ``guard``: a barrier orders that work itself; ``save_state`` and ``save_model``
    create the folder and write files on every rank, so they need a barrier first, called on the Accelerator as the
    code at the guard spells it; the other collectives write nothing on the other ranks."""
    if is_barrier(facts, call):
        return Ordering(barrier=True)
    if facts.method_name(call) not in FOLDER_WRITERS or not isinstance(call.func, cst.Attribute):
        return Ordering()
    if via is None:
        return Ordering(writes=True, owner=call.func.value)
    # an Accelerator as the code at the call names it: an argument of the helper, or the guard's own
    # (`if accelerator.is_main_process:`), both in scope there
    test = guard.test if isinstance(guard, cst.If) else None
    tested = [a.value for a in facts.within(test, cst.Attribute) if a.attr.value in MAIN_FLAGS] if test else []
    owners = [arg.value for arg in via.args] + tested
    return Ordering(writes=True, owner=next((o for o in owners if facts.accelerator_like(o, via)), None))


def split_guard(
    facts: PythonFacts, guard: cst.CSTNode, anchors: list[cst.CSTNode], orderings: dict[int, Ordering]
) -> tuple[cst.If, list[cst.BaseStatement]]:
    """The outermost main-process ``if`` around ``guard`` and the statements that replace it so that the
    collectives ``anchors`` (or the local helper calls that reach them) run on every rank; raises ``NoHoist`` with
    the reason where that is not safe: a helper that does more than collectives and logging, an early ``return`` or
    a decorator for a guard, a block ``hoist`` cannot split, or a guard that not every rank reaches."""
    def allowed(inner: cst.Call) -> bool:
        return collective_kind(facts, inner) is not None or logs_on_main(facts, inner)

    for site in anchors:
        if not (isinstance(site, cst.Call) and collective_kind(facts, site) is not None):
            why_not = helper_repeatable(facts, site, allowed)
            if why_not:
                raise NoHoist(why_not)
    if not isinstance(guard, cst.If):
        raise NoHoist("the guard is an early `return` or a decorator")
    outer, inner = outermost_main_guard(facts, guard)
    statements = hoist(facts, outer, anchors, inner, orderings, lambda call: binding_stem(facts, call))
    reach = facts.all_ranks_reach(outer)
    if reach.value is not True:
        raise NoHoist(barrier_unsafe(reach))
    return outer, statements
