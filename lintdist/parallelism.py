"""Parallelism in force for a script: the ``cp``/``sp`` sizes of accelerate's ``ParallelismConfig`` (in code, in an
accelerate config's ``parallelism_config:`` section, or as launch flags), the configs an ``Accelerator`` is given,
and which ``with`` items open a context-parallel region.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from lintdist.blocks import literal_binding
from lintdist.edits import replace_nodes, with_last_item
from lintdist.facts import ACCELERATOR_CLASSES, PythonFacts, argument_of, string_key
from lintdist.launch import LaunchSettings, parallelism_exported
from lintdist.loop import integer_literal

PARALLELISM_CONFIGS = frozenset(
    {
        "accelerate.ParallelismConfig",
        "accelerate.utils.ParallelismConfig",
        "accelerate.parallelism_config.ParallelismConfig",
    }
)
# `ParallelismConfig(dp_replicate_size, dp_shard_size, tp_size, cp_size, cp_backend, sp_size, sp_backend, ...)`
SIZE_POSITIONS = {"cp": 3, "sp": 5}
# torch's own context manager, which `Accelerator.maybe_context_parallel` calls with the "cp" sub-mesh.
TORCH_CONTEXT_PARALLEL = frozenset(
    {
        "torch.distributed.tensor.experimental.context_parallel",
        "torch.distributed.tensor.experimental._attention.context_parallel",
        "torch.distributed.tensor.experimental._context_parallel._attention.context_parallel",
    }
)


@dataclass(frozen=True)
class Size:
    """A parallelism size in force for a script: ``value`` None when an expression decides it."""

    value: int | None
    where: str  # for messages: "`ParallelismConfig(cp_size=4)` at line 12", "config.yaml:9"


def parallelism_size(
    facts: PythonFacts, settings: LaunchSettings | None, span_line, dim: str, configs: list[cst.Call] | None = None
) -> Size | None:
    """The ``cp`` or ``sp`` size of ``ParallelismConfig`` calls (``configs``, by default all of the file's), or of
    the launch (the ``parallelism_config_<dim>_size`` setting, which ``ParallelismConfig`` reads from the
    environment when its keyword is not given, and from which ``Accelerator()`` builds one when the launch says
    ``use_parallelism_config``). A literal above 1 in any call wins; None when nothing says anything.
    ``span_line(node)`` gives a node's line."""
    launched = launch_size(settings, dim)
    found: list[Size] = []
    if configs is None:
        configs = [call for call in facts.calls if facts.callee_is(call, PARALLELISM_CONFIGS)]
    for call in configs:
        line = span_line(call)
        value = argument_of(call, f"{dim}_size", SIZE_POSITIONS[dim])
        if value is None or (isinstance(value, cst.Name) and value.value == "None"):
            if launched is not None:
                found.append(launched)
            else:
                where = f"`ParallelismConfig` at line {line} reads `PARALLELISM_CONFIG_{dim.upper()}_SIZE`"
                found.append(Size(1, where))  # the launcher exports nothing: accelerate's default
            continue
        number = integer_literal(value, facts, call)
        code = facts.index.module.code_for_node(value)
        found.append(Size(number, f"`ParallelismConfig({dim}_size={code})` at line {line}"))
    if not found:
        return launched
    on = [size for size in found if size.value is not None and size.value > 1]
    if on:
        return on[0]
    unknown = [size for size in found if size.value is None]
    return unknown[0] if unknown else found[0]


def accelerator_configs(facts: PythonFacts, accelerator: cst.BaseExpression, at: cst.CSTNode) -> list[cst.Call] | None:
    """The ``ParallelismConfig(...)`` calls the ``Accelerator`` held by ``accelerator`` is given (an empty list
    for one given none); None when the ``Accelerator`` or its ``parallelism_config=`` cannot be followed."""
    made = [
        o.node
        for o in facts.origins(accelerator, at)
        if isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, ACCELERATOR_CLASSES)
    ]
    if not made:
        return None
    found: list[cst.Call] = []
    for call in made:
        value = argument_of(call, "parallelism_config", None)
        if value is None or (isinstance(value, cst.Name) and value.value == "None"):
            continue
        origins = facts.origins(value, call)
        configs = [
            o.node
            for o in origins
            if isinstance(o.node, cst.Call) and o.index is None and facts.callee_is(o.node, PARALLELISM_CONFIGS)
        ]
        if len(configs) != len(origins):
            return None  # a config made elsewhere, or sometimes None: the file's calls decide
        found.extend(configs)
    return found


def launch_size(settings: LaunchSettings | None, dim: str) -> Size | None:
    """``parallelism_config_<dim>_size`` from an accelerate config (``parallelism_config:`` section) or a launch
    flag. A flag counts only with ``--use_parallelism_config`` or a config section beside it: otherwise
    ``accelerate launch`` exports no ``PARALLELISM_CONFIG_*`` variable (``prepare_*_env``)."""
    if settings is None:
        return None
    name = f"parallelism_config_{dim}_size"
    setting = settings.get(name)
    if setting is None or (setting.spelling in {"flag", "yaml"} and not parallelism_exported(settings)):
        return None
    try:
        value = int(str(setting.value).strip())
    except ValueError:
        return Size(None, f"{_basename(setting.path)}:{setting.line}")
    written = f"--{name} {value}" if setting.spelling == "flag" else f"{name}: {value}"
    return Size(value, f"`{written}` at {_basename(setting.path)}:{setting.line}")


def _basename(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def context_parallel_call(facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode) -> cst.Call | None:
    """The context-parallel call a ``with`` item (at ``at``) is: ``accelerator.maybe_context_parallel(...)``, torch's
    ``context_parallel(mesh, ...)``, or a name bound to either; None otherwise."""
    candidates = [expr]
    if isinstance(expr, (cst.Name, cst.Attribute)):
        candidates = [o.node for o in facts.origins(expr, at) if o.index is None]
    for node in candidates:
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "maybe_context_parallel":
            if facts.accelerator_like(func.value, node):
                return node
        elif facts.callee_is(node, TORCH_CONTEXT_PARALLEL):
            return node
    return None


def mesh_accelerator(
    facts: PythonFacts, expr: cst.BaseExpression, at: cst.CSTNode
) -> tuple[cst.BaseExpression, cst.CSTNode] | None:
    """(the accelerator expression, where it is written) when ``expr`` is accelerate's device mesh:
    ``acc.torch_device_mesh``, ``acc.state.device_mesh``, or a name or attribute bound to one of them; else None."""
    direct = _mesh_owner(facts, expr, at)
    if direct is not None:
        return direct, expr
    if isinstance(expr, (cst.Name, cst.Attribute)):
        for origin in facts.origins(expr, at):
            node = origin.node
            owner = _mesh_owner(facts, node, node) if origin.index is None else None
            if owner is not None:
                return owner, node
    return None


def _mesh_owner(facts: PythonFacts, expr: cst.CSTNode, at: cst.CSTNode) -> cst.BaseExpression | None:
    if not isinstance(expr, cst.Attribute):
        return None
    if expr.attr.value == "torch_device_mesh" and facts.accelerator_like(expr.value, at):
        return expr.value
    state = expr.value
    if expr.attr.value == "device_mesh" and isinstance(state, cst.Attribute) and state.attr.value == "state":
        return state.value if facts.accelerator_like(state.value, at) else None
    return None


# Tensor, context, sequence or pipeline parallelism named in a script: ranks that share a batch.
MODEL_PARALLEL_WORDS = ("ParallelismConfig", "parallelism_config", "SequenceParallel", "tp_size", "cp_size", "sp_size")


def model_parallel(text: str, settings: LaunchSettings | None) -> bool:
    """The script's text names tensor, context or sequence parallelism, or its launch settings configure it
    (``parallelism_config_*``, ``tp_*``, ``cp_*``, ``sp_*``): some ranks share a batch."""
    if any(word in text for word in MODEL_PARALLEL_WORDS):
        return True
    return settings is not None and any(
        name.startswith(("parallelism_config", "tp_", "cp_", "sp_")) for name in settings.values
    )


def sequence_dim_like(buffers: cst.List, dims: cst.List, tensor: str, code) -> cst.BaseExpression | None:
    """The sequence dimension to shard ``tensor`` (its source text) on, from the ``buffers`` and ``buffer_seq_dims``
    lists of a context-parallel call: its own, else the input ids', else the one every buffer shares; ``code(node)``
    gives a node's source text."""
    texts = [code(e.value) for e in buffers.elements]
    if tensor in texts:
        return dims.elements[texts.index(tensor)].value
    for index, element in enumerate(buffers.elements):
        if string_key(element.value) == "input_ids" or texts[index] in {"input_ids", "inputs"}:
            return dims.elements[index].value
    values = {code(e.value) for e in dims.elements}
    return dims.elements[0].value if len(values) == 1 else None


@dataclass(frozen=True)
class BufferLists:
    """The literal lists a context-parallel call shards by, each with the statement that binds it before the
    ``with`` block (None when written in the call), and its ``no_restore_buffers`` set literal, if any."""

    buffers: cst.List
    buffers_line: cst.SimpleStatementLine | None
    dims: cst.List
    dims_line: cst.SimpleStatementLine | None
    keep: cst.Set | None

    def adding(self, tensor: cst.BaseExpression, dim: cst.BaseExpression) -> list[tuple[cst.CSTNode, cst.CSTNode]]:
        """The replacements that shard ``tensor`` too, on ``dim``: appended to ``buffers``, ``buffer_seq_dims`` and
        ``no_restore_buffers`` (the lists in the call, or the statements that bind them)."""
        replacements = []
        if self.keep is not None:
            replacements.append((self.keep, with_last_item(self.keep, cst.Element(tensor.deep_clone()))))
        for literal, line, added in ((self.buffers, self.buffers_line, tensor), (self.dims, self.dims_line, dim)):
            new = with_last_item(literal, cst.Element(added.deep_clone()))
            replacements.append((literal, new) if line is None else (line, replace_nodes(line, [(literal, new)])))
        return replacements


def buffer_lists(facts: PythonFacts, context: cst.Call, block: cst.With) -> BufferLists | None:
    """The literal ``buffers`` and ``buffer_seq_dims`` lists (of one length, nothing starred) of the context-parallel
    call ``block`` opens, written in the ``with`` (not made before it); None when they are not literals."""
    accelerate = not facts.callee_is(context, TORCH_CONTEXT_PARALLEL)
    buffers = argument_of(context, "buffers", 0 if accelerate else None)
    dims = argument_of(context, "buffer_seq_dims", 1 if accelerate else None)
    keep = argument_of(context, "no_restore_buffers", 2 if accelerate else None)
    if buffers is None or dims is None or not facts.is_within(context, block):
        return None
    buffers_list, buffers_line = literal_binding(facts, buffers, block, cst.List)
    dims_list, dims_line = literal_binding(facts, dims, block, cst.List)
    if buffers_list is None or dims_list is None or buffers_line is not None and buffers_line is dims_line:
        return None
    if len(buffers_list.elements) != len(dims_list.elements) or any(
        isinstance(e, cst.StarredElement) for e in (*buffers_list.elements, *dims_list.elements)
    ):
        return None
    return BufferLists(buffers_list, buffers_line, dims_list, dims_line, keep if isinstance(keep, cst.Set) else None)
