"""LD308 ulysses-group-from-mesh: the sequence-parallel group read from accelerate's device mesh, which has none."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of, string_key
from lintdist.literals import is_name
from lintdist.loop import is_loss_field, string_literal
from lintdist.model import Applicability, Fix, Severity
from lintdist.parallelism import mesh_accelerator, parallelism_size
from lintdist.rule import Invalid, Rule, Valid

RUNTIME_IMPORT = ("lintdist.runtime", "sequence_parallel_group")
# Device-mesh methods that take the dimension's name (`mesh.get_group("sp")`, `mesh.size(mesh_dim="sp")`).
MESH_METHODS = {"get_group": "mesh_dim", "get_local_rank": "mesh_dim", "size": "mesh_dim", "get_coordinate": None}
# A condition that decides by what the mesh holds or by the SP backend: the code under it is a fallback.
GUARD_WORDS = re.compile(r"device_mesh|sp_backend|deepspeed|mesh_dim_names", re.IGNORECASE)
MAX_GUARD_DEPTH = 20


class UlyssesGroupFromMesh(Rule):
    """
    ## What it does
    Reports `accelerator.torch_device_mesh["sp"]` (also through
    `accelerator.state.device_mesh`, a name or attribute bound to the mesh,
    or `mesh.get_group("sp")`), the way accelerate's sequence-parallelism
    guide and its `sp-alst.py` example fetch the sequence-parallel group to
    aggregate the loss.

    ## Why is this bad?
    In accelerate 1.15 the only sequence-parallel backend is DeepSpeed
    Ulysses (`sp_backend="deepspeed"`, checked in `ParallelismConfig`). With
    `sp_size > 1`, `ParallelismConfig.build_device_mesh` returns **None**
    ("DeepSpeed handles its own SP groups"), so `accelerator.torch_device_mesh`
    is None and the subscript raises `TypeError`; with `sp_size == 1` the mesh
    has no "sp" dimension (`KeyError`). DeepSpeed creates the group in
    `accelerator.prepare` (`UlyssesSPAttentionHF.register_with_transformers`)
    and keeps it in `deepspeed.utils.groups`, which is where transformers'
    `deepspeed_sp_compute_loss` reads it. When the script reads `.loss` from
    the model's output, the message adds a second problem: DeepSpeed's SP data
    loader (`UlyssesSPDataLoaderAdapter`) pops `labels` from every batch and
    adds `shift_labels`, and a transformers model computes a loss only when
    `labels` is not None, so `model(**batch).loss` is None.
    `deepspeed_sp_compute_loss` sets `inputs["labels"] = inputs["shift_labels"]`
    first (the loss then uses `shift_labels` as given); accelerate's own
    test computes it with `model.loss_function(logits=..., labels=None,
    shift_labels=...)`. Code under a condition about the mesh or the SP
    backend (`if accelerator.torch_device_mesh is not None:`), or in a `try`
    with a handler, is a fallback and is not reported.

    ## Example
    ```python
    accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=4))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    sp_group = accelerator.torch_device_mesh["sp"].get_group()
    ```

    ## Use instead
    ```python
    from lintdist.runtime import sequence_parallel_group

    accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=4))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    sp_group = sequence_parallel_group(accelerator)
    ```

    ## Fix safety
    Safe: the fix replaces the expression that yields the group
    (`accelerator.torch_device_mesh["sp"].get_group()`, `mesh.get_group("sp")`)
    with `sequence_parallel_group(accelerator)` from `lintdist.runtime` and
    adds the import. That helper returns DeepSpeed's SP group, as transformers
    does, and falls back to the mesh's "sp" dimension when a mesh has one, so
    it gives the same group wherever the old expression worked. It must run
    after `accelerator.prepare(model, ...)`, which creates DeepSpeed's group;
    before that it raises ValueError ("no sequence-parallel group"). It is offered
    only where the accelerator expression is in scope at the reported line.
    Other uses of the mesh's "sp" dimension (`mesh["sp"].size()`,
    `get_local_rank`) are reported without a fix; use
    `torch.distributed.get_world_size(sequence_parallel_group(accelerator))`.

    ## References
    - accelerate `parallelism_config.py::ParallelismConfig.build_device_mesh` and `__post_init__`
    - accelerate `Accelerator._prepare_deepspeed` (Ulysses registration, `UlyssesSPDataLoaderAdapter`)
    - transformers `integrations/deepspeed.py::deepspeed_sp_compute_loss`
    - DeepSpeed `runtime/sequence_parallel/ulysses_sp.py::UlyssesSPDataLoaderAdapter.refill`
    - accelerate `examples/alst_ulysses_sequence_parallelism/sp-alst.py`, `docs/source/concept_guides/sequence_parallelism.md`
    """

    code = "LD308"
    name = "ulysses-group-from-mesh"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("device_mesh",)
    also_triggers = (("accelerat", "Accelerat"),)  # the accelerator's mesh, not any device mesh

    VALID = (
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig
from lintdist.runtime import sequence_parallel_group

accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_size=4))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
sp_group = sequence_parallel_group(accelerator)
"""
        ),
        Valid(
            """\
def sp_group(accelerator, pc):
    if pc.sp_backend == "deepspeed" and pc.sp_size > 1:
        from deepspeed.utils import groups

        return groups._get_sequence_parallel_group()
    elif accelerator.torch_device_mesh is not None:
        return accelerator.torch_device_mesh["sp"].get_group()
    raise ValueError("no SP group")
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig

accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=4))
tp_group = accelerator.torch_device_mesh["tp"].get_group()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator, ParallelismConfig

accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=4))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
sp_group = accelerator.torch_device_mesh["sp"].get_group()
""",
            lines=(5,),
            fixed="""\
from accelerate import Accelerator, ParallelismConfig
from lintdist.runtime import sequence_parallel_group

accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=4))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
sp_group = sequence_parallel_group(accelerator)
""",
        ),
        Invalid(
            """\
import torch


class UlyssesTrainer:
    def __init__(self, accelerator, model):
        self.accelerator = accelerator
        self.model = model
        self.mesh = self.accelerator.torch_device_mesh

    def step(self, batch):
        loss = self.model(**batch).loss
        losses = torch.distributed.nn.functional.all_gather(loss, group=self.mesh.get_group("sp"))
        return sum(losses) / len(losses)
""",
            lines=(12,),
            fixed="""\
import torch
from lintdist.runtime import sequence_parallel_group


class UlyssesTrainer:
    def __init__(self, accelerator, model):
        self.accelerator = accelerator
        self.model = model
        self.mesh = self.accelerator.torch_device_mesh

    def step(self, batch):
        loss = self.model(**batch).loss
        losses = torch.distributed.nn.functional.all_gather(loss, group=sequence_parallel_group(self.accelerator))
        return sum(losses) / len(losses)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
sp_world_size = accelerator.torch_device_mesh["sp"].size()
""",
            lines=(4,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        reported: set[int] = set()
        for node in facts.index.nodes(cst.Subscript):
            if not self._names_sp(node):
                continue
            accelerator = mesh_accelerator(self.facts, node.value, node)
            if accelerator is None or self._guarded(node, node.value):
                continue
            parent = facts.parent(node)
            grand = facts.parent(parent)
            method = parent.attr.value if isinstance(parent, cst.Attribute) else None
            # `<mesh>["sp"].get_group()` yields the group
            yields = method == "get_group" and isinstance(grand, cst.Call) and grand.func is parent and not grand.args
            target = grand if yields else node
            reported.add(id(target))
            self._report(target, accelerator, yields_group=target is not node)
        for call in facts.calls:
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value in MESH_METHODS) or id(call) in reported:
                continue
            keyword = MESH_METHODS[func.attr.value]
            dim = argument_of(call, keyword, 0) if keyword else None
            if dim is None or string_literal(dim, facts, call) != "sp":
                continue
            accelerator = mesh_accelerator(facts, func.value, call)
            if accelerator is None or self._guarded(call, func.value):
                continue
            self._report(call, accelerator, yields_group=func.attr.value == "get_group")

    def _names_sp(self, node: cst.Subscript) -> bool:
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return False
        return string_literal(node.slice[0].slice.value, self.facts, node) == "sp"

    def _guarded(self, node: cst.CSTNode, mesh: cst.BaseExpression) -> bool:
        """Under a condition about the mesh or the SP backend, or in a ``try`` with a handler."""
        facts = self.facts
        code = facts.index.module.code_for_node
        mesh_text = code(mesh)
        child = node
        for depth, ancestor in enumerate(facts.ancestors(node)):
            if depth > MAX_GUARD_DEPTH or isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                break
            if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) and child is not ancestor.test:
                test = code(ancestor.test)
                if GUARD_WORDS.search(test) or mesh_text in test:
                    return True
            if isinstance(ancestor, cst.Try) and child is ancestor.body and ancestor.handlers:
                return True
            child = ancestor
        return False

    # -- reporting -----------------------------------------------------------------------------------

    def _report(self, node: cst.CSTNode, found: tuple[cst.BaseExpression, cst.CSTNode], yields_group: bool) -> None:
        facts = self.facts
        accelerator, written = found
        code = facts.index.module.code_for_node
        size = parallelism_size(facts, self.context.settings, lambda n: self.context.span(n).line, "sp")
        accelerator, written = self._in_scope(accelerator, written, node)
        accelerator_text = code(accelerator)
        if size is not None and size.value is not None and size.value > 1:
            why = (
                f"with sequence parallelism on ({size.where}) accelerate 1.15 runs DeepSpeed Ulysses, its only SP "
                "backend, and `build_device_mesh` returns None for it, so `torch_device_mesh` is None and this raises"
            )
        else:
            why = (
                "accelerate 1.15's device mesh never has an 'sp' dimension (with `sp_size > 1` it runs DeepSpeed "
                "Ulysses, its only SP backend, and `torch_device_mesh` is None), so this raises"
            )
        use = f"`sequence_parallel_group({accelerator_text})` from `lintdist.runtime`"
        if not yields_group:
            use += " (its rank and size: `torch.distributed.get_rank(group)`, `get_world_size(group)`)"
        message = f"`{code(node)}`: {why}; DeepSpeed keeps the SP group in `deepspeed.utils.groups`: use {use}"
        if self._loss_without_labels():
            message += (
                "; also, DeepSpeed's SP data loader pops `labels` and adds `shift_labels`, so `.loss` of "
                '`model(**batch)` is None: set `batch["labels"] = batch["shift_labels"]` before the call (the loss '
                "then uses `shift_labels`), as transformers' `deepspeed_sp_compute_loss` does, or compute it with "
                "`model.loss_function(logits=..., labels=None, shift_labels=...)`"
            )
        fix = None
        if yields_group and written is not None:
            replacement = cst.Call(func=cst.Name("sequence_parallel_group"), args=[cst.Arg(accelerator.deep_clone())])
            fix = Fix(
                Applicability.SAFE,
                f"Replace it with `sequence_parallel_group({accelerator_text})`",
                replacements=((node, replacement),),
                imports=(RUNTIME_IMPORT,),
            )
        self.report(node, message, fix=fix)

    def _in_scope(
        self, accelerator: cst.BaseExpression, written: cst.CSTNode, at: cst.CSTNode
    ) -> tuple[cst.BaseExpression, cst.CSTNode | None]:
        """The accelerator expression to write at ``at`` (``self.accelerator`` for ``accelerator`` of an
        ``__init__`` that stored it there), with where it was found; None for the place when no expression
        means the same accelerator at ``at``."""
        facts = self.facts
        if written is at or facts.is_within(written, at):
            return accelerator, written
        name = get_full_name_for_node(accelerator)
        if not name:
            return accelerator, None
        where = facts.enclosing_function(written)
        here = facts.enclosing_function(at)
        if name.split(".", 1)[0] in {"self", "cls"}:
            same = (
                where is not None and here is not None and facts.enclosing_class(where) is facts.enclosing_class(here)
            )
            return accelerator, written if same else None
        if where is here:
            return accelerator, written
        if where is None:  # a module-level accelerator: not shadowed where it is used
            shadowed = any(b.function is not None for b in facts.bindings(name, at)) or facts.parameter(name, at)
            return accelerator, None if shadowed else written
        stored = self._stored_on_self(name, where)
        if stored is not None and here is not None and facts.enclosing_class(here) is facts.enclosing_class(where):
            return stored, written
        return accelerator, None

    def _stored_on_self(self, name: str, function: cst.FunctionDef) -> cst.BaseExpression | None:
        """``self.accelerator`` when ``function`` (a method) runs ``self.accelerator = <name>``."""
        facts = self.facts
        stores = (s for s in facts.within(function, cst.Assign) if is_name(s.value, name))
        targets = (t.target for s in stores for t in s.targets)
        return next((t for t in targets if isinstance(t, cst.Attribute) and is_name(t.value, "self")), None)

    def _loss_without_labels(self) -> bool:
        """The script reads ``.loss`` of a model call given ``**batch`` and no ``labels=``, and never puts
        ``"labels"`` back into that batch."""
        facts = self.facts
        loop = self.loop
        for node in facts.index.nodes(cst.Attribute, cst.Subscript):
            if not is_loss_field(node):
                continue
            call = node.value if isinstance(node.value, cst.Call) else loop.model_call(node)
            if call is None:
                continue
            batch = next((a.value for a in call.args if a.star == "**"), None)
            if batch is None or any(a.keyword is not None and a.keyword.value == "labels" for a in call.args):
                continue
            key = get_full_name_for_node(batch)
            scope = facts.enclosing_function(call) or facts.index.module
            if any(
                string_key(s) == "labels" and get_full_name_for_node(s.value) == key
                for statement in facts.within(scope, cst.Assign)
                for target in statement.targets
                if isinstance(s := target.target, cst.Subscript)
            ):
                continue
            return True
        return False
