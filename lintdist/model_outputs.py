"""What a script reads of a model call's output: its own loss (``.loss``, ``["loss"]``, ``[0]``) or only other
fields (``.logits``), followed through the name the output is assigned to in the call's function."""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from lintdist.loop import is_loss_field

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts
    from lintdist.loop import TrainingLoop

# Fields of a transformers model output that are not the loss.
OTHER_OUTPUT_FIELDS = frozenset(
    {"logits", "hidden_states", "attentions", "past_key_values", "last_hidden_state", "aux_loss", "router_logits"}
)


def reads_model_loss(facts: PythonFacts, call: cst.Call) -> bool:
    """The model's own loss is used: ``.loss``, ``["loss"]``/``[0]``, or an output that goes somewhere lintdist
    cannot see; False when every read of the output takes another field (``.logits``)."""
    parent = facts.parent(call)
    if isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is call:
        return reads_loss_field(parent)
    if not (
        isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name)
    ):
        return True
    target = parent.targets[0].target
    function = facts.enclosing_function(call)
    names = facts.within(function, cst.Name) if function is not None else facts.index.nodes(cst.Name)
    for name in names:
        if name.value != target.value or name is target:
            continue
        if function is None and facts.enclosing_function(name) is not None:
            continue
        read = facts.parent(name)
        if isinstance(read, (cst.Attribute, cst.Subscript)) and read.value is name:
            if reads_loss_field(read):
                return True
            continue
        if isinstance(read, cst.AssignTarget):
            continue  # rebound
        return True
    return False


def reads_loss_field(read: cst.Attribute | cst.Subscript) -> bool:
    """An attribute or subscript of a model output that may be its loss: not one of ``OTHER_OUTPUT_FIELDS``, and
    not an element other than the first."""
    if isinstance(read, cst.Attribute):
        return read.attr.value not in OTHER_OUTPUT_FIELDS
    if len(read.slice) != 1 or not isinstance(read.slice[0].slice, cst.Index):
        return True
    key = read.slice[0].slice.value
    if isinstance(key, cst.SimpleString):
        return key.evaluated_value not in OTHER_OUTPUT_FIELDS
    return not (isinstance(key, cst.Integer) and key.value != "0")


def loss_read_in(facts: PythonFacts, loop: TrainingLoop, call: cst.Call, scope: cst.CSTNode) -> bool:
    """``scope`` reads the ``.loss`` (or ``["loss"]``) of the call's output: inline, or through the name last bound
    to it."""
    return any(
        is_loss_field(node) and (node.value is call or loop.model_call(node) is call)
        for node in facts.within(scope, cst.Attribute, cst.Subscript)
    )
