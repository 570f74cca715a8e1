"""Where a node runs in the control flow: the statement that holds it, whether it runs whenever a block does,
the loop two nodes share, and the chains of calls through which a helper's code runs in its callers.

Questions of one module, answered from the facts' parents and call-site index (no walk of their own). A
helper's chain is followed up to ``depth`` levels of callers in this module.
"""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ITERATION_WRAPPERS, PythonFacts

SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def statement_of(facts: PythonFacts, node: cst.CSTNode) -> cst.BaseStatement | None:
    """The statement line (or compound statement) holding ``node``."""
    return next((a for a in facts.ancestors(node) if isinstance(a, cst.BaseStatement)), None)


def runs_whenever(facts: PythonFacts, node: cst.CSTNode, body: cst.BaseSuite) -> bool:
    """Whether ``node`` runs whenever ``body`` runs: only ``with`` blocks between them, and no ``return`` or
    ``raise`` in ``body`` before it."""
    current = statement_of(facts, node)
    while current is not None:
        parent = facts.parent(current)
        if parent is body:
            break
        if not isinstance(parent, cst.IndentedBlock) or not isinstance(facts.parent(parent), cst.With):
            return False
        current = facts.parent(parent)
    else:
        return False
    order = facts.index.order
    return not any(order(exit_) < order(node) for exit_ in facts.within(body, cst.Return, cst.Raise))


def common_loop(facts: PythonFacts, node: cst.CSTNode, other: cst.CSTNode) -> cst.For | cst.While | None:
    """The innermost loop of ``node``'s function whose body holds both nodes."""
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, SCOPES):
            return None
        if (
            isinstance(ancestor, (cst.For, cst.While))
            and facts.is_within(node, ancestor.body)
            and facts.is_within(other, ancestor.body)
        ):
            return ancestor
    return None


def caller_chains(facts: PythonFacts, node: cst.CSTNode, depth: int) -> list[tuple[cst.CSTNode, tuple[cst.Call, ...]]]:
    """Where ``node`` runs, as (anchor, calls): ``node`` itself with no calls, then each call of its function
    (and of theirs, up to ``depth`` levels) with the calls from that anchor down to ``node``'s function."""
    result: list[tuple[cst.CSTNode, tuple[cst.Call, ...]]] = [(node, ())]
    pending = result
    for _ in range(depth):
        following = []
        for current, calls in pending:
            function = facts.enclosing_function(current)
            if function is not None:
                following.extend((site, (site, *calls)) for site in facts.call_sites(function))
        result = [*result, *following]
        pending = following
    return result


def called_in_loop(facts: PythonFacts, function: cst.FunctionDef | None, depth: int) -> bool:
    """Whether this module calls ``function`` from a loop, directly or through up to ``depth`` more levels of
    callers (a ``train_step`` called once per batch)."""
    pending, seen = [function], set()
    for _ in range(depth + 1):
        following = []
        for current in pending:
            if current is None or id(current) in seen:
                continue
            seen.add(id(current))
            for call in facts.call_sites(current):
                if facts.enclosing_loop(call) is not None:
                    return True
                following.append(facts.enclosing_function(call))
        pending = following
    return False


def loop_iterable(loop: cst.CSTNode | None) -> cst.BaseExpression | None:
    """What a ``for`` loop iterates, inside ``enumerate(...)``, ``tqdm(...)`` and ``iter(...)`` written as plain
    names; None for a ``while`` loop or a wrapper given no argument."""
    if not isinstance(loop, cst.For):
        return None
    iterator = loop.iter
    while isinstance(iterator, cst.Call) and get_full_name_for_node(iterator.func) in ITERATION_WRAPPERS - {"trange"}:
        if not iterator.args:
            return None
        iterator = iterator.args[0].value
    return iterator


def _guards(facts: PythonFacts, node: cst.CSTNode) -> list[tuple[str, bool, cst.If]]:
    """(test, wanted truth, the ``if``) for each ``if`` whose body or ``else`` holds ``node`` and whose test is a
    plain name or attribute chain, or ``not`` of one; the innermost first, up to ``node``'s scope."""
    found = []
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, SCOPES):
            break
        if not isinstance(ancestor, cst.If):
            continue
        test, truth = ancestor.test, True
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, truth = test.expression, False
        key = get_full_name_for_node(test) if isinstance(test, (cst.Name, cst.Attribute)) else None
        if key is None:
            continue
        if facts.is_within(node, ancestor.body):
            found.append((key, truth, ancestor))
        elif ancestor.orelse is not None and facts.is_within(node, ancestor.orelse):
            found.append((key, not truth, ancestor))
    return found


def never_together(facts: PythonFacts, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """Whether ``a`` and ``b`` never both run in one pass through their function: they sit in different branches
    of one ``if``/``else``, or under ``if flag:`` and ``if not flag:`` on the same name (or attribute chain) that
    their function does not assign anywhere."""
    if facts.exclusive(a, b):
        return True
    function = facts.enclosing_function(a)
    if function is not facts.enclosing_function(b):
        return False
    for key, truth, _ in _guards(facts, a):
        for other_key, other_truth, _ in _guards(facts, b):
            if (
                key == other_key
                and truth != other_truth
                and not any(binding.function is function for binding in facts.bindings(key, a))
            ):
                return True
    return False


def runs_only_if(facts: PythonFacts, node: cst.CSTNode, keys: set[str]) -> bool:
    """Whether ``node`` runs only when one of ``keys`` (names or attribute chains) is true: it sits in the body of
    an ``if`` testing one of them, alone or as one operand of ``and``, within its scope."""
    for ancestor in facts.ancestors(node):
        if isinstance(ancestor, SCOPES):
            return False
        if not isinstance(ancestor, cst.If) or not facts.is_within(node, ancestor.body):
            continue
        test = ancestor.test
        operands = [test]
        while operands and isinstance(operands[0], cst.BooleanOperation) and isinstance(operands[0].operator, cst.And):
            operands = [operands[0].left, operands[0].right, *operands[1:]]
        if any(get_full_name_for_node(o) in keys for o in operands if isinstance(o, (cst.Name, cst.Attribute))):
            return True
    return False
