"""What a value computed in a loop over batches holds: which names the loop derives from its batch, whether a tensor
keeps one row per sample of the batch (predictions, labels, generated ids) or is a 0-d value (a mean loss, a batch
accuracy), whether a reshape or a mask mixed its first dimension, whether it comes from ``generate``, and whether
its rows are cut afterwards (``preds[: len(dataset) - seen]``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of

if TYPE_CHECKING:
    from lintdist.facts import Binding, PythonFacts

# Reductions that leave a 0-d tensor when called with no dimension.
REDUCTIONS = frozenset({"mean", "sum", "item", "max", "min", "norm", "std", "var", "numel", "prod", "all", "any"})
# Calls that make a per-batch scalar per-sample by copying it (`loss.repeat(bs)`): not a per-sample tensor.
COPIES = frozenset({"repeat", "expand", "repeat_interleave", "expand_as"})
# Calls that mix the batch dimension with others.
RESHAPES = frozenset({"view", "reshape", "flatten", "ravel", "transpose", "permute", "t", "masked_select", "nonzero"})
# Loss functions (`F.cross_entropy`, `criterion`, `loss_fn`): a mean over the batch unless `reduction="none"`.
LOSS_WORDS = ("loss", "criterion", "entropy", "mse", "nll", "l1", "kl_div")
SCALAR_FACTORIES = frozenset({"torch.tensor", "torch.as_tensor", "torch.scalar_tensor"})
MAX_DEPTH = 4
PLAIN, RESHAPED = "plain", "reshaped"


def batch_derived(facts: PythonFacts, loop: cst.For) -> set[str]:
    """The names (and attribute chains) that hold the loop's batch or something computed from it in its body
    (model outputs, predictions), in the order of the body."""
    derived = {n.value for n in facts.within(loop.target, cst.Name)}
    for statement in facts.within(loop.body, cst.Assign, cst.AnnAssign, cst.AugAssign):
        if statement.value is None or not mentions(facts, statement.value, derived):
            continue
        targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
        for target in targets:
            derived |= {
                key for n in facts.within(target, cst.Name, cst.Attribute) if (key := get_full_name_for_node(n))
            }
    return derived


def mentions(facts: PythonFacts, expr: cst.CSTNode, names: set[str]) -> bool:
    """Whether ``expr`` reads one of ``names`` (full names of names and attribute chains)."""
    return any(get_full_name_for_node(n) in names for n in facts.within(expr, cst.Name, cst.Attribute))


def last_binding_in(facts: PythonFacts, name: str, body: cst.CSTNode, before: cst.CSTNode) -> Binding | None:
    """The last plain assignment of ``name`` inside ``body`` that comes before ``before``."""
    found = None
    order = facts.index.order
    for binding in facts.bindings(name, before):
        if (
            binding.index is None
            and facts.is_within(binding.statement, body)
            and order(binding.statement) < order(before)
        ):
            found = binding
    return found


def per_sample_rows(
    facts: PythonFacts, value: cst.BaseExpression, loop: cst.For, derived: set[str], at: cst.CSTNode, depth: int = 0
) -> str | None:
    """How ``value``, computed from the batch of ``loop`` (``derived``: see ``batch_derived``), holds one row per
    sample: "plain", or "reshaped" when a reshape or a mask in the loop mixed its first dimension; None for a 0-d
    value, a loss, a copied scalar (``loss.repeat(bs)``), a value not made from the batch, or what cannot be told.
    Tuples, lists and dicts answer for all their elements."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(value, (cst.Tuple, cst.List, cst.Dict)):
        dict_ = isinstance(value, cst.Dict)
        elements = [e.value for e in value.elements if not dict_ or isinstance(e, cst.DictElement)]
        kinds = [per_sample_rows(facts, e, loop, derived, at, depth + 1) for e in elements]
        if not kinds or None in kinds:
            return None
        return RESHAPED if RESHAPED in kinds else PLAIN
    if _scalar(facts, value):
        return None
    reshaped = False
    node: cst.BaseExpression = value
    # walk down the method chain: `logits.argmax(-1).view(-1)`, `outputs.logits[:, 0]`
    while True:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            method = node.func.attr.value
            if method == "pad_across_processes" and node.args:
                node = node.args[0].value
                continue
            if not mentions(facts, node.func.value, derived):
                break  # `torch.argmax(x)`, `F.cross_entropy(...)`: a function, not a method of the value
            if method in COPIES:
                return None
            reshaped = reshaped or method in RESHAPES
            node = node.func.value
        elif isinstance(node, cst.Subscript):
            reshaped = reshaped or _mask(node)
            node = node.value
        elif isinstance(node, cst.Attribute) and node.attr.value == "loss":
            return None
        else:
            break
    if isinstance(node, cst.Name) and node.value not in {n.value for n in facts.within(loop.target, cst.Name)}:
        if "loss" in node.value.lower():
            return None  # a loss is a mean over the batch unless it was copied per sample
        binding = last_binding_in(facts, node.value, loop.body, at)
        if binding is not None:
            inner = per_sample_rows(facts, binding.value, loop, derived, binding.statement, depth + 1)
            if inner is None:
                return None
            reshaped = reshaped or inner == RESHAPED
    elif isinstance(node, cst.Call):
        callee = (get_full_name_for_node(node.func) or "").rsplit(".", 1)[-1].lower()
        reduction = argument_of(node, "reduction", None)
        per_sample_loss = isinstance(reduction, cst.SimpleString) and reduction.evaluated_value == "none"
        if any(word in callee for word in LOSS_WORDS) and not per_sample_loss:
            return None  # a loss function's mean over the batch
        if not mentions(facts, node, derived):
            return None  # a value not made from the batch: keep silent
    return RESHAPED if reshaped else PLAIN


def generated(facts: PythonFacts, value: cst.BaseExpression, loop: cst.For) -> bool:
    """Whether ``value`` is (a method chain on) the output of a ``generate`` call, directly or through a name
    assigned in ``loop``."""
    node = value
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value != "generate":
        node = node.func.value
    if isinstance(node, cst.Name):
        binding = last_binding_in(facts, node.value, loop.body, value)
        node = binding.value if binding is not None else node
    return isinstance(node, cst.Call) and facts.method_name(node) == "generate"


def rows_cut(facts: PythonFacts, call: cst.Call, body: cst.CSTNode) -> bool:
    """Whether the rows of ``call``'s result are cut at an upper bound: ``call(...)[:n]`` itself, or a name it is
    assigned to sliced so later in ``body`` (``preds = gather(p)`` ... ``preds[: len(dataset) - seen]``)."""
    parent = facts.parent(call)
    if isinstance(parent, cst.Subscript) and first_rows_cut(parent):
        return True
    statement = next((a for a in facts.ancestors(call) if isinstance(a, (cst.Assign, cst.AnnAssign))), None)
    if statement is None:
        return False
    targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
    names = {n.value for target in targets for n in facts.within(target, cst.Name)}
    return any(
        isinstance(subscript.value, cst.Name)
        and subscript.value.value in names
        and first_rows_cut(subscript)
        and facts.index.order(subscript) > facts.index.order(call)
        for subscript in facts.within(body, cst.Subscript)
    )


def first_rows_cut(subscript: cst.Subscript) -> bool:
    """``x[:n]``, ``x[:n, ...]``: the first dimension is cut at an upper bound."""
    if not subscript.slice:
        return False
    first = subscript.slice[0].slice
    return isinstance(first, cst.Slice) and first.upper is not None and first.lower is None


def _scalar(facts: PythonFacts, value: cst.BaseExpression) -> bool:
    """A 0-d value: a reduction with no dimension (``x.mean()``), a scalar tensor (``torch.tensor(3.0)``), a
    number."""
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in REDUCTIONS:
            return not [a for a in value.args if a.keyword is None or a.keyword.value in {"dim", "axis"}]
        if facts.qualified_names(value.func) & SCALAR_FACTORIES:
            return bool(value.args) and not isinstance(value.args[0].value, (cst.List, cst.Tuple, cst.ListComp))
    return isinstance(value, (cst.Integer, cst.Float))


def _mask(subscript: cst.Subscript) -> bool:
    """A boolean mask on the first dimension (``x[mask]``, ``x[labels != -100]``): rows no longer per sample."""
    if len(subscript.slice) != 1 or not isinstance(subscript.slice[0].slice, cst.Index):
        return False
    value = subscript.slice[0].slice.value
    if isinstance(value, (cst.Comparison, cst.UnaryOperation)):
        return True
    return "mask" in (get_full_name_for_node(value) or "").lower()


# Methods that add a batch's results to a container kept across the loop (`preds.append(p)`, `preds.extend(p)`).
ACCUMULATORS = frozenset({"append", "extend", "add_", "update"})


def accumulated_in(facts: PythonFacts, value: cst.BaseExpression, loop: cst.For, at: cst.CSTNode) -> bool:
    """Whether ``value`` (read at ``at``, after ``loop``) holds what the loop accumulated from its batches: it
    reads a name the loop's body adds batch results to (``correct += (pred == y).sum()``, ``preds.append(p)``),
    directly or through the last assignment of a name between the loop and ``at``
    (``stats = torch.tensor([correct, total])``)."""
    derived = batch_derived(facts, loop)
    grown = set()
    for statement in facts.within(loop.body, cst.AugAssign):
        if mentions(facts, statement.value, derived):
            grown |= {key for n in facts.within(statement.target, cst.Name, cst.Attribute) if (key := full(n))}
    for call in facts.within(loop.body, cst.Call):
        func = call.func
        accumulates = isinstance(func, cst.Attribute) and func.attr.value in ACCUMULATORS
        if accumulates and mentions(facts, call, derived) and (key := full(func.value)) is not None:
            grown.add(key)
    if not grown:
        return False
    if mentions(facts, value, grown):
        return True
    order = facts.index.order
    for name in facts.within(value, cst.Name):
        binding = last_binding_in(facts, name.value, facts.enclosing_function(at) or facts.index.module, at)
        if binding is not None and order(binding.statement) > order(loop) and mentions(facts, binding.value, grown):
            return True
    return False


def full(node: cst.CSTNode) -> str | None:
    """The dotted name of a name or attribute chain (``self.preds``), None for anything else."""
    return get_full_name_for_node(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
