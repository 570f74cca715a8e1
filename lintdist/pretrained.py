"""What object a ``save_pretrained``/``from_pretrained`` receiver is: a model of transformers, a PEFT model, or
something that is no model (a tokenizer, processor, config or feature extractor).

Known by the call that made it (``AutoTokenizer.from_pretrained``, ``get_peft_model``), through
``accelerator.unwrap_model(...)``, and failing that by the receiver's own name (``tokenizer``, ``peft_model``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst
from libcst.helpers import get_full_name_for_node

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

PEFT_MAKERS = frozenset(
    {
        "peft.get_peft_model",
        "peft.mapping.get_peft_model",
        "peft.mapping_func.get_peft_model",
        "peft.PeftModel.from_pretrained",
        "peft.PeftModelForCausalLM.from_pretrained",
        "peft.peft_model.PeftModel.from_pretrained",
    }
)
# Parts of a class name (or, failing an origin, of a variable's name) that say it is not a model.
NON_MODEL_PARTS = ("tokenizer", "processor", "config", "featureextractor", "feature_extractor")


def pretrained_kind(facts: PythonFacts, receiver: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> str | None:
    """ "other" (a tokenizer, processor, config), "peft", "model" (a transformers model), or None when nothing says
    (a model of another library, an unknown object)."""
    if isinstance(receiver, cst.Call) and facts.method_name(receiver) == "unwrap_model" and receiver.args:
        return pretrained_kind(facts, receiver.args[0].value, at, depth + 1)
    found = None
    for origin in facts.origins(receiver, at):
        node = origin.node
        if not isinstance(node, cst.Call):
            continue
        if facts.method_name(node) == "unwrap_model" and node.args and depth < 2:
            found = found or pretrained_kind(facts, node.args[0].value, node, depth + 1)
            continue
        names = facts.qualified_names(node.func)
        if names & PEFT_MAKERS:
            return "peft"
        lowered = " ".join(names).lower().replace("_", "")
        if any(part.replace("_", "") in lowered for part in NON_MODEL_PARTS):
            found = found or "other"
        elif any(n.startswith("transformers.") for n in names):
            found = found or "model"
    if found:
        return found
    last = get_full_name_for_node(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None
    last = (last or "").rsplit(".", 1)[-1].lower()
    if any(part in last for part in NON_MODEL_PARTS):
        return "other"
    return "peft" if "peft" in last else None
