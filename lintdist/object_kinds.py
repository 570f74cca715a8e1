"""What goes into an ``Accelerator.prepare`` call: a model (a ``torch.nn.Module``), an optimizer, or something
else (a loader, a scheduler), known by the name it is bound to or by where it was built."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import DATALOADER_CLASSES, argument_of
from lintdist.loop import TrainingLoop

MAX_DEPTH = 4
LOADER_HINTS = ("loader", "dataloader")
LOADER_NAMES = frozenset({"dl", "train_dl", "eval_dl", "val_dl"})
# Names that say a value is a model, as written in training scripts (`model`, `ref_model`, `unet`...).
MODEL_NAMES = frozenset(
    {
        "model",
        "net",
        "network",
        "unet",
        "vae",
        "text_encoder",
        "transformer",
        "generator",
        "discriminator",
        "teacher",
        "student",
        "backbone",
        "critic",
    }
)
NOT_MODEL_SUFFIXES = ("_name", "_path", "_id", "_args", "_config", "_cfg", "_kwargs", "_type", "_dir", "_file")
# Calls that hand back the model they are given.
SAME_MODEL_METHODS = frozenset({"to", "cuda", "cpu", "train", "eval", "float", "half", "bfloat16", "requires_grad_"})
MODEL_FACTORIES = frozenset(
    {"torch.compile", "timm.create_model", "peft.get_peft_model", "peft.mapping.get_peft_model", "torchvision.models"}
)
# `torch.nn` names that are not modules.
NOT_MODULES = ("torch.nn.functional.", "torch.nn.utils.", "torch.nn.init.", "torch.nn.Parameter", "torch.nn.parameter.")
OPTIMIZER_FACTORIES = ("torch.optim.", "bitsandbytes.optim.", "transformers.optimization.", "apex.optimizers.")


class ObjectKinds:
    """The kind of the values a training loop's code passes around, each answer kept for the file."""

    def __init__(self, loop: TrainingLoop) -> None:
        self.loop = loop
        self.facts = loop.facts
        self._kinds: dict[int, str | None] = {}

    def kind(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> str | None:
        """ "model", "optimizer" or "other" (a loader, a scheduler...) for what ``expr`` holds at ``at``; None when
        lintdist cannot tell. Names decide first (``optimizer``, ``train_loader``, ``model``), then where the value
        was built (through ``prepare``, ``.to(...)`` and the like)."""
        key = id(expr)
        if key not in self._kinds:
            self._kinds[key] = None  # a value whose origin leads back to itself stays unknown
            self._kinds[key] = self._find_kind(expr, at, depth)
        return self._kinds[key]

    def _find_kind(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        name = (get_full_name_for_node(expr) or "").rsplit(".", 1)[-1].lower()
        if any(hint in name for hint in LOADER_HINTS) or name in LOADER_NAMES:
            return "other"
        if _model_name(name):
            return "model"
        role = self.loop.role(expr, at)
        if role == "optimizer":
            return "optimizer"
        if role == "scheduler":
            return "other"
        return self._kind_by_origin(expr, at, depth)

    def _kind_by_origin(self, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> str | None:
        if depth > MAX_DEPTH:
            return None
        facts = self.facts
        kinds: set[str | None] = set()
        for origin in facts.origins(expr, at):
            if len(kinds) > 1 or None in kinds:
                return None
            node = origin.node
            if not isinstance(node, cst.Call):
                kinds.add(None)
                continue
            if origin.index is not None:
                if self.loop.is_accelerate_prepare(node):  # `model, opt = accelerator.prepare(model, opt)`
                    argument = argument_of(node, "", origin.index)
                    kinds.add(self.kind(argument, node, depth + 1) if argument is not None else None)
                else:
                    kinds.add(None)
                continue
            kinds.add(self._call_kind(node, depth))
        return kinds.pop() if len(kinds) == 1 else None

    def _call_kind(self, call: cst.Call, depth: int) -> str | None:
        facts = self.facts
        if self.loop.is_accelerate_prepare(call):
            argument = argument_of(call, "", 0)
            return self.kind(argument, call, depth + 1) if argument is not None and len(call.args) == 1 else None
        method = facts.method_name(call)
        if isinstance(call.func, cst.Attribute) and method in SAME_MODEL_METHODS:
            return self.kind(call.func.value, call, depth + 1)
        if facts.is_instance_of(call, DATALOADER_CLASSES):
            return "other"
        names = facts.qualified_names(call.func) | {get_full_name_for_node(call.func) or ""}
        for qualified in names:
            if qualified.startswith(OPTIMIZER_FACTORIES) and "lr_scheduler" not in qualified:
                return "optimizer" if _class_like(qualified.rsplit(".", 1)[-1]) else None
            if qualified in MODEL_FACTORIES or qualified.startswith("torchvision.models."):
                return "model"
            parts = qualified.split(".")
            if parts[-1] in {"from_pretrained", "from_config"} and len(parts) > 1:
                parts = parts[:-1]
            last = parts[-1]
            if qualified.startswith("torch.nn.") and _class_like(last) and not qualified.startswith(NOT_MODULES):
                return "model"
            if parts[0] in {"transformers", "diffusers", "peft"} and _class_like(last) and _model_class(last):
                return "model"
        for cls in facts.classes:
            if cls.name.value == get_full_name_for_node(call.func) and facts.derives_from(
                cls,
                lambda n: n in {"torch.nn.Module", "torch.nn.modules.module.Module"} or n.startswith("transformers."),
            ):
                return "model"
        return None


def _model_name(name: str) -> bool:
    if name.endswith(NOT_MODEL_SUFFIXES) or name.startswith(("num_", "n_")):
        return False
    return name in MODEL_NAMES or name.endswith(("model", "_net")) or name.startswith("model_")


def _model_class(name: str) -> bool:
    """A transformers/diffusers/peft model class: `LlamaForCausalLM`, `AutoModel`, `UNet2DConditionModel`."""
    return "Model" in name or "For" in name[1:] or name.startswith(("UNet", "Autoencoder"))


def _class_like(name: str) -> bool:
    return name[:1].isupper() and any(c.islower() for c in name)
