"""Whether the other ranks wait for the main process between two places of a script.

The places a call runs from (``guarded_places``: the call, then the calls of its function, each with whether a rank
guard stands on the way), what waits for every rank (``synchronises``: a barrier of any spelling, a collective of
Python objects, a helper that calls one), whether such a wait runs between two places (``barrier_between``), the
first pair of places where main-only work is followed by code of every rank with no wait (``unwaited``), and how the
script spells a barrier a fix adds (``barrier_spelling``). The answers come from the facts' indexes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# Calls no rank leaves before every rank has reached them: barriers by any receiver, and collectives of Python
# objects (they pickle on the host and wait for the data; a tensor collective under NCCL returns at once).
SYNCHRONISING = frozenset(
    {"barrier", "monitored_barrier", "wait_for_everyone", "rendezvous"}
    | {"all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list"}
)
# The text one of which a module holds if a function of it can reach a barrier.
BARRIER_MARKERS = tuple(sorted(SYNCHRONISING))
# Helpers named for a barrier (detectron2's `comm.synchronize()`, `utils.barrier_all()`), trusted where their body
# is out of sight; a device's `synchronize` waits for its own kernels only.
SYNCHRONISE_NAMES = frozenset({"synchronize", "sync_processes", "barrier_all", "wait_all_ranks"})
DEVICE_SYNCHRONISE = frozenset({f"torch.{device}.synchronize" for device in ("cuda", "xpu", "mps", "npu", "mlu")})
Place = tuple[cst.CSTNode, bool]


def guarded_places(facts: PythonFacts, node: cst.CSTNode, depth: int, *, unguarded_only: bool = False) -> list[Place]:
    """The places ``node`` runs from: itself, then the calls of its function in this file (up to ``depth`` levels),
    each with whether a rank guard stands on the way; with ``unguarded_only``, none behind a guard."""
    places: list[Place] = []
    pending = [(node, False, 0)]
    seen: set[int] = set()
    while pending:
        current, guarded, level = pending.pop()
        guarded = guarded or facts.rank_guard(current) is not None
        if unguarded_only and guarded:
            continue
        places.append((current, guarded))
        function = facts.enclosing_function(current)
        if function is None or level >= depth or id(function) in seen:
            continue
        seen.add(id(function))
        pending.extend((site, guarded, level + 1) for site in facts.call_sites(function))
    return places


def synchronises(facts: PythonFacts, call: cst.Call, *, opaque: frozenset[str] = frozenset()) -> bool:
    """``call`` waits for every rank: a barrier or a collective of Python objects on any receiver, a function of this
    file or of another project module (unless its name is one of ``opaque``) that calls one, or a helper named for a
    barrier whose body is out of sight (not ``torch.cuda.synchronize()``)."""
    name = facts.method_name(call)
    if name in SYNCHRONISING:
        return True
    for function in facts.local_functions(call):
        if any(facts.method_name(inner) in SYNCHRONISING for inner in facts.reachable_calls(function)):
            return True
    if name not in opaque and facts.project is not None and facts.imported_root(call.func):
        for qualified in facts.qualified_names(call.func):
            definition = facts.project.definition(qualified, BARRIER_MARKERS)
            if definition is not None and isinstance(definition[1], cst.FunctionDef):
                other, function = definition
                if any(other.method_name(inner) in SYNCHRONISING for inner in other.reachable_calls(function)):
                    return True
    return name in SYNCHRONISE_NAMES and not facts.callee_is(call, DEVICE_SYNCHRONISE)


def barrier_between(
    facts: PythonFacts, first: cst.CSTNode, second: cst.CSTNode, *, opaque: frozenset[str] = frozenset()
) -> bool:
    """A call that ``synchronises`` stands in the source between the end of ``first`` and ``second``, or ``second``
    runs inside a ``with <accelerator>.main_process_first():`` entered after ``first`` (the other processes enter
    it only once the main process has left it)."""
    start, stop = facts.index.end(first), facts.index.order(second)
    if any(
        start <= facts.index.order(call) < stop and synchronises(facts, call, opaque=opaque) for call in facts.calls
    ):
        return True
    for ancestor in facts.ancestors(second):
        if (
            isinstance(ancestor, cst.With)
            and facts.index.order(ancestor) >= start
            and any(
                isinstance(item.item, cst.Call) and facts.method_name(item.item) == "main_process_first"
                for item in ancestor.items
            )
        ):
            return True
    return False


def never_together(facts: PythonFacts, first: cst.CSTNode, second: cst.CSTNode) -> bool:
    """The two never run in one job: they sit in different branches of an ``if`` that is not a rank test (the
    branches of ``if rank == 0: ... else: ...`` run at the same time, on different ranks), or of a ``try``, or in
    different code blocks of a documentation page (a guide's "save" and "load to resume" are two runs)."""
    if facts.block_of is not None and facts.block_of(first) != facts.block_of(second):
        return True
    for ancestor in facts.ancestors(first):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(ancestor, cst.If) and ancestor.orelse is not None:
            here = facts.is_within(first, ancestor.body)
            if facts.is_within(second, ancestor.orelse if here else ancestor.body):
                return not facts.rank_dependent(ancestor.test)
        elif isinstance(ancestor, cst.Try) and facts.is_within(second, ancestor) and facts.exclusive(first, second):
            return True
    return False


def unwaited(
    facts: PythonFacts,
    first_places: list[Place],
    main_only: bool,
    second_places: list[Place],
    *,
    opaque: frozenset[str] = frozenset(),
) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """The first (place of the first, place of the second) where the first runs on the main process only (behind a
    guard, or ``main_only``), comes before the second in one function, and nothing waits for every rank between."""
    for first, guarded in first_places:
        if not (guarded or main_only):
            continue
        scope = facts.enclosing_function(first)
        for second, _ in second_places:
            if facts.enclosing_function(second) is not scope:
                continue
            if facts.index.order(second) <= facts.index.end(first) or never_together(facts, first, second):
                continue
            if not barrier_between(facts, first, second, opaque=opaque):
                return first, second
    return None


def barrier_spelling(facts: PythonFacts, at: cst.CSTNode) -> tuple[str, tuple[tuple[str, str | None], ...], str]:
    """A barrier as this script would spell it where ``at`` is (its Accelerator's ``wait_for_everyone()``, accelerate's
    ``PartialState``, its ``torch.distributed`` alias), the imports it needs, and its text for a message."""
    accelerator = facts.accelerator_at(at)
    if accelerator is not None:
        text = f"{accelerator}.wait_for_everyone()"
        return text, (), text
    if facts.imports("accelerate"):
        return "PartialState().wait_for_everyone()", (("accelerate", "PartialState"),), "wait_for_everyone()"
    module = facts.distributed_at(at)
    if module is None:
        return "torch.distributed.barrier()", (("torch.distributed", None),), "torch.distributed.barrier()"
    return f"{module}.barrier()", (), f"{module}.barrier()"
