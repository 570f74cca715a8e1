"""Which values a use can receive, and which uses a value built in one place reaches."""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.mutation import unpacked

Position = Callable[[cst.CSTNode], object]  # a node's (line, column), or any value that orders them alike


def never_received(facts: PythonFacts, value: cst.CSTNode, user: cst.CSTNode, position: Position) -> bool:
    """``value``, built in the function that runs ``user``, cannot be what ``user`` receives: it sits in the other
    branch of an ``if`` (a raw-DDP branch beside an accelerate one), or after ``user`` outside any loop."""
    if facts.enclosing_function(value) is not facts.enclosing_function(user) or facts.is_within(value, user):
        return False
    user_path: dict[int, cst.CSTNode] = {}  # ancestor of user -> its child on the way to user
    child: cst.CSTNode = user
    for ancestor in facts.ancestors(user):
        user_path[id(ancestor)] = child
        child = ancestor
    child = value
    for common in facts.ancestors(value):
        if id(common) in user_path:
            break
        child = common
    else:
        return False
    if isinstance(common, cst.If) and {id(child), id(user_path[id(common)])} == {id(common.body), id(common.orelse)}:
        return True
    if position(value) <= position(user):
        return False
    for node in (common, *facts.ancestors(common)):  # a loop around both runs the later line first next time
        if isinstance(node, (cst.FunctionDef, cst.Lambda)):
            break
        if isinstance(node, (cst.For, cst.While)):
            return False
    return True


def only_consumer(
    facts: PythonFacts, value: cst.Call, consumer: cst.Call, line_of: Callable[[cst.CSTNode], int]
) -> bool:
    """The value built by ``value`` reaches nothing but ``consumer``: it is an argument of it, or it is bound to a name
    that only ``consumer`` reads, and later only after the statement of ``consumer`` rebinds the name to its result;
    other functions may read their own variables of that name, not this one."""
    if any(arg.value is value for arg in consumer.args):
        return True
    statement = facts.parent(value)
    if not (
        isinstance(statement, cst.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0].target, cst.Name)
    ):
        return False
    bound = statement.targets[0].target
    function = facts.enclosing_function(statement)
    if facts.enclosing_function(consumer) is not function:
        return False
    consumer_statement = facts.parent(consumer)
    rebinds = isinstance(consumer_statement, cst.Assign) and any(
        isinstance(part, cst.Name) and part.value == bound.value
        for target in consumer_statement.targets
        for part in unpacked(target.target)
    )
    consumer_line = line_of(consumer)
    for use in facts.index.nodes(cst.Name):
        if use.value != bound.value or use is bound or not facts.is_variable(use):
            continue
        if facts.is_within(use, consumer_statement if rebinds else consumer):
            continue
        user = facts.enclosing_function(use)
        if user is function:
            # the same variable: fine only once the consumer's statement has replaced it
            safe = rebinds and line_of(use) > consumer_line
        elif function is None or (user is not None and facts.is_within(user, function)):
            # a function reading the module-level value, or a closure reading the local one
            safe = _local_to(facts, use, user)
        else:
            safe = True  # another function's own variable of the same name
        if not safe:
            return False
    return True


def _local_to(facts: PythonFacts, use: cst.Name, function: cst.FunctionDef | None) -> bool:
    """``use`` reads a parameter or a local variable of its own function."""
    if function is None:
        return False
    if facts.parameter(use.value, use) is not None:
        return True
    return any(binding.function is function for binding in facts.bindings(use.value, use))


def receiving_calls(
    facts: PythonFacts, value: cst.Call, classes: frozenset[str], keyword: str
) -> list[tuple[cst.Call, cst.Arg]]:
    """The calls of ``classes`` whose keyword argument ``keyword`` can hold what ``value`` builds (directly or
    through names), each with that argument: the ``Accelerator(...)`` a ``ParallelismConfig(...)`` reaches."""
    found = []
    for call in facts.calls:
        if not facts.callee_is(call, classes):
            continue
        given = next((a for a in call.args if a.keyword is not None and a.keyword.value == keyword), None)
        if given is not None and any(o.node is value and o.index is None for o in facts.origins(given.value, call)):
            found.append((call, given))
    return found
