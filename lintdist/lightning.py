"""Lightning in a script: which classes are LightningModules.

Rules about Lightning ask these of the facts (``PythonFacts.lightning_module_of`` and ``is_lightning_module``) instead of keeping their own lists of where Lightning's classes
live. The answers come from the facts' indexes (no walk of their own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts

# Where `LightningModule` can be imported from (`lightning`, the 1.x `pytorch_lightning`, their submodules).
LIGHTNING_MODULES = frozenset(
    f"{home}.LightningModule"
    for home in (
        "lightning",
        "lightning.pytorch",
        "lightning.pytorch.core",
        "lightning.pytorch.core.module",
        "pytorch_lightning",
        "pytorch_lightning.core",
        "pytorch_lightning.core.module",
        "pytorch_lightning.core.lightning",
    )
)


def is_lightning_module(facts: PythonFacts, cls: cst.ClassDef) -> bool:
    """``cls`` derives from Lightning's ``LightningModule``, directly or through classes of this file."""
    return facts.derives_from(cls, LIGHTNING_MODULES.__contains__)


def lightning_module_of(facts: PythonFacts, node: cst.CSTNode) -> cst.ClassDef | None:
    """The LightningModule whose method ``node`` is in (a function nested in the method too); None elsewhere."""
    function = facts.enclosing_function(node)
    cls = facts.enclosing_class(function) if function is not None else None
    return cls if cls is not None and is_lightning_module(facts, cls) else None
