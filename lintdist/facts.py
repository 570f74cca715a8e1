"""The per-file model of a training script, built in the shared traversal and read by every rule.

Rules ask questions here ("where can this name's value come from?", "is this
call an Accelerator's prepare?", "which calls can run inside this loop?")
instead of re-deriving them. Everything here is read from the file's syntax index
(parents, source order, nodes by type: one walk) and its name resolver (aliases and
``from`` imports followed), never from a new walk of the module.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist import lightning, spelling
from lintdist.conventions import CONVENTIONAL_NAMES, implied_module
from lintdist.names import NameResolver
from lintdist.project import ProjectView, Site
from lintdist.syntax import SyntaxIndex, _walk_detached

FunctionNode = cst.FunctionDef | cst.Lambda
Loop = cst.For | cst.While

ACCELERATOR_CLASSES = frozenset({"accelerate.Accelerator", "accelerate.accelerator.Accelerator"})
PREPARE_METHODS = frozenset({"prepare", "prepare_data_loader", "setup_dataloaders"})
FABRIC_CLASSES = frozenset({"lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric"})
PREPARE_FUNCTIONS = frozenset({"accelerate.data_loader.prepare_data_loader"})
DATALOADER_CLASSES = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
SAMPLER_CLASSES = frozenset({"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"})
DDP_WRAPPERS = frozenset(
    {"torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
)
# Where Lightning's `Trainer` can be imported from (`lightning`, the 1.x `pytorch_lightning`, their submodules).
LIGHTNING_TRAINERS = frozenset(
    f"{home}.Trainer"
    for home in (
        "lightning",
        "lightning.pytorch",
        "lightning.pytorch.trainer",
        "lightning.pytorch.trainer.trainer",
        "pytorch_lightning",
        "pytorch_lightning.trainer",
        "pytorch_lightning.trainer.trainer",
    )
)
# Calls that make a program run on several processes, besides an Accelerator and a model wrapper.
DISTRIBUTED_CALLS = frozenset(
    {
        "torch.distributed.init_process_group",
        "torch.multiprocessing.spawn",
        "deepspeed.initialize",
        "lightning.Fabric",
        "lightning.fabric.Fabric",
    }
)
DDP_CLASSES = DDP_WRAPPERS | frozenset(
    {
        "torch.distributed.fsdp.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
        "torch.distributed.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard",
        "torch.distributed.fsdp._fully_shard.fully_shard",
    }
)
NO_GRAD_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad"})
ITERATION_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "trange"})
BACKWARD_METHODS = frozenset({"backward", "manual_backward"})
# Names of a process's rank, of flags true on the main process only, and of decorators that run a function there.
RANK_NAMES = frozenset(
    {"rank", "local_rank", "global_rank", "world_rank", "ddp_rank", "ddp_local_rank", "process_index"}
    | {"local_process_index", "gpu_id", "rank_id", "proc_rank"}
)
RANK_GETTERS = frozenset({"get_rank", "get_global_rank", "get_local_rank", "get_process_index"})
MAIN_FLAGS = frozenset(
    {"is_main_process", "is_local_main_process", "is_global_zero", "is_world_process_zero", "is_local_process_zero"}
    | {"is_master", "is_rank_zero", "is_rank_0", "master_process"}
)
# A project's own main-process flag, by its name (`is_global_main`, `is_main`, `is_master_node`, `main_process`): what
# its definition says when lintdist can see it, else what its name says. Not `main_rank` (a number) nor `master`.
MAIN_FLAG_LIKE = re.compile(
    r"_*is_(?:global_|local_|world_|node_)?(?:main|master|chief|rank_?(?:zero|0))"
    r"(?:_(?:process|proc|rank|node|worker|gpu|host))?"
    r"|_*(?:global_|local_)?(?:main|master)_(?:process|proc|worker)"
)
# The same flags as plain text, for rules' pre-filters: a file that tests one is written for several processes.
MAIN_FLAG_WORDS = (".is_main", ".is_master", ".is_global_main", ".is_local_main", ".is_chief", ".is_rank")
# A helper named for DDP (`init_distributed_data_parallel_model`, `wrap_ddp`): what it returns when its body is not
# in sight.
DDP_HELPER_NAME = re.compile(r"(?:^|_)(?:ddp|distributed_data_parallel)(?:_|$)", re.IGNORECASE)
# The number of processes, flags that say a job is distributed, and the calls that test for a process group.
WORLD_SIZE_NAMES = frozenset({"world_size", "ddp_world_size", "num_processes"})
DISTRIBUTED_FLAGS = frozenset({"distributed", "is_distributed", "ddp", "use_ddp", "multiprocessing_distributed"})
PROCESS_GROUP_TESTS = frozenset(
    {"torch.distributed.is_initialized", "torch.distributed.is_available"}
    | {"torch.distributed.distributed_c10d.is_initialized"}
)
MAIN_ONLY_DECORATORS = frozenset(
    {"on_main_process", "on_local_main_process", "on_process", "on_local_process", "rank_zero_only"}
)
MAX_DEPTH = 6
MAX_CALLER_DEPTH = 3
# How many module boundaries one question may cross (a parameter's argument, itself a parameter elsewhere...).
MAX_CROSSINGS = 3
_CROSSING = [0]
# What a value made in another module is, written so that the questions rules ask of origins answer the same.
STAND_INS = {
    "accelerator": "accelerate.Accelerator()",
    "ddp": "torch.nn.parallel.DistributedDataParallel(module)",
    "prepared": "accelerate.Accelerator().prepare(module)",
    "sampled": "torch.utils.data.DataLoader(dataset, sampler=torch.utils.data.DistributedSampler(dataset))",
    "loader": "torch.utils.data.DataLoader(dataset)",
    "maybe_sampled": (
        "torch.utils.data.DataLoader(dataset, sampler=torch.utils.data.DistributedSampler(dataset, shuffle=shuffle))"
    ),
}
# A module whose text holds none of these makes no value another module's questions look for (an Accelerator, a
# wrapped or prepared model, a loader), nor hands one on under the usual name: it is not parsed for them.
VALUE_MARKERS = (
    "Accelerator(",
    "PartialState(",
    "DataParallel(",
    "DDP(",
    "DataLoader(",
    "FSDP(",
    ".prepare(",
    "prepare_data_loader(",
    "setup_dataloaders(",
    "fully_shard(",
    "Sampler(",
    "accelerator",
    "is_main_process",
)
# Objects known by their API: (attributes one of which must be used, attributes used with it); with no
# required attribute, two of the others. One attribute alone identifies nothing, except on a name that is
# conventionally that object (``accelerator``, ``API_CONVENTIONAL_NAMES``): there one attribute of either set will do.
API_SIGNATURES = {
    "accelerator": (
        frozenset({"is_main_process", "is_local_main_process"}),
        frozenset(
            {
                "save_state",
                "wait_for_everyone",
                "prepare",
                "backward",
                "accumulate",
                "gather_for_metrics",
                "gradient_accumulation_steps",
                "clip_grad_norm_",
                "main_process_first",
                "num_processes",
                "process_index",
                "get_state_dict",
                "save_model",
                "load_state",
                "sync_gradients",
                "unwrap_model",
                "gather",
                "pad_across_processes",
                "print",
            }
        ),
    ),
    "ddp": (frozenset({"no_sync"}), frozenset({"module"})),
    "sampler": (frozenset({"set_epoch"}), frozenset({"num_replicas"})),
    # the engine `deepspeed.initialize` returns: `engine.backward(loss)`, `engine.step()`, `engine.module`
    "deepspeed_engine": (frozenset({"backward"}), frozenset({"step", "module"})),
}
API_NAMES = {
    "accelerator": "an Accelerator",
    "ddp": "a DDP-wrapped model",
    "sampler": "a distributed sampler",
    "deepspeed_engine": "a DeepSpeed engine",
}
API_CONVENTIONAL_NAMES = {"accelerator": "accelerator"}
# A name imported from one of these is what its import says, never identified by its API.
KNOWN_LIBRARIES = frozenset({"torch", "accelerate", "transformers", "lightning", "pytorch_lightning", "deepspeed"})


@dataclass(frozen=True)
class Reach:
    """Whether every rank reaches a statement (None: unknown), and where that was decided or why not. A place
    (``at``: the facts and node of a rank test) is put into words only when a message asks: a line number
    costs a printing pass over the statement."""

    value: bool | None
    reason: str = ""
    at: tuple[PythonFacts, cst.CSTNode] | None = None
    # the calls in other modules the answer was followed through (a helper's callers, theirs...), nearest first
    through: tuple[tuple[PythonFacts, cst.Call], ...] = ()

    @property
    def why(self) -> str:
        return self.at[0]._where(self.at[1]) if self.at is not None else self.reason

    @property
    def from_distributed_callers(self) -> list[tuple[PythonFacts, cst.Call]]:
        """The calls in other modules this answer was followed through whose module sets up processes
        (``main.py`` builds the DDP model and calls ``checkpoint.save(...)``): the node runs in their run."""
        return [(facts, call) for facts, call in self.through if facts.sets_up_processes()]


@dataclass(frozen=True)
class Binding:
    """``target = value`` (``index`` set when the target is one element of an unpacked tuple)."""

    key: str
    value: cst.BaseExpression
    statement: cst.CSTNode
    function: FunctionNode | None
    index: int | None = None


@dataclass(frozen=True)
class SamplerUse:
    """A loader built with a ``DistributedSampler`` (directly, or inside its batch sampler)."""

    sampler: cst.Call  # the DistributedSampler(...) call
    sampler_arg: cst.BaseExpression  # what the loader was given as its sampler
    loader: cst.Call
    shuffle: bool | None  # True, or None when ``shuffle=`` is an expression lintdist cannot evaluate
    # the sampler's class is chosen at run time (``cls = RandomSampler if ... else DistributedSampler``): the call
    # may build another sampler, one without ``set_epoch``
    chosen: bool = False


@dataclass(frozen=True)
class Origin:
    """Where a value can come from: a call, a parameter, or another expression."""

    node: cst.CSTNode
    index: int | None = None


class PythonFacts:
    """Built from the file's syntax index (one walk) and name resolver; derived facts are computed on first use."""

    # In a documentation page's program: the number of the code block a node starts in (the engine sets it).
    block_of: Callable[[cst.CSTNode], int] | None = None

    def __init__(self, index: SyntaxIndex, names: NameResolver) -> None:
        self.index = index
        self.names = names
        self._enclosing_function: dict[int, cst.FunctionDef | None] = {}
        self.calls: list[cst.Call] = index.nodes(cst.Call)
        self.loops: list[Loop] = index.nodes(cst.For, cst.While)
        self.classes: list[cst.ClassDef] = index.nodes(cst.ClassDef)
        self.functions: dict[str, list[cst.FunctionDef]] = defaultdict(list)
        for function in index.nodes(cst.FunctionDef):
            self.functions[function.name.value].append(function)
        self.returns: dict[cst.FunctionDef, list[cst.BaseExpression]] = defaultdict(list)
        for statement in index.nodes(cst.Return):
            function = self.enclosing_function(statement)
            if function is not None and statement.value is not None:
                self.returns[function].append(statement.value)
        self._bindings: dict[str, list[Binding]] = defaultdict(list)
        # `d[k] = v`: what a container is filled with (its name still holds the same container)
        self._stores: dict[str, list[Binding]] = defaultdict(list)
        for statement in index.nodes(cst.Assign, cst.AnnAssign):
            if isinstance(statement, cst.Assign):
                for target in statement.targets:
                    self._bind(target.target, statement.value, statement)
            elif statement.value is not None:
                self._bind(statement.target, statement.value, statement)
        self._memo: dict[str, object] = {}
        self._local_functions: dict[int, list[cst.FunctionDef]] = {}
        self._enclosing_class: dict[int, cst.ClassDef | None] = {}
        # The file's window on its project (set by the engine): questions that leave the file go there.
        self.project: ProjectView | None = None
        # Stand-ins for values made in another module (see ``_stand_in``): node id -> the local node they stand at.
        self.stand_ins: dict[int, cst.CSTNode] = {}
        self._stand_in_notes: dict[int, str] = {}

    @property
    def imported_modules(self) -> list[str]:
        """Modules the file imports from, anywhere in it (`import a.b` -> "a.b", `from a.b import c` -> "a.b"), and
        those of the conventional names it reads unbound (`dist.barrier()` alone -> "torch.distributed")."""
        if "imported_modules" not in self._memo:
            modules = []
            for statement in self.index.nodes(cst.Import, cst.ImportFrom):
                if isinstance(statement, cst.Import):
                    modules.extend(get_full_name_for_node(alias.name) or "" for alias in statement.names)
                elif statement.module is not None:
                    modules.append(get_full_name_for_node(statement.module) or "")
            modules.extend(implied_module(name) for name in sorted(self.names.unbound_conventional()))
            self._memo["imported_modules"] = modules
        return self._memo["imported_modules"]

    @property
    def imported_names(self) -> frozenset[str]:
        """The local names that imports bind anywhere in the file (``b`` of ``from a import b``, ``c`` of ``import a
        as c``), and the conventional names it reads unbound (``dist``, ``DDP``), which stand for imports: a call of
        any other bare name cannot reach an imported function."""
        if "imported_names" not in self._memo:
            names = set(self.names.unbound_conventional())
            for statement in self.index.nodes(cst.Import, cst.ImportFrom):
                if isinstance(statement.names, cst.ImportStar):
                    continue
                for alias in statement.names:
                    bound = alias.asname.name if alias.asname is not None else alias.name
                    names.add(get_full_name_for_node(bound).split(".", 1)[0])
            self._memo["imported_names"] = frozenset(names)
        return self._memo["imported_names"]

    def alias_spellings(self, last_parts: frozenset[str]) -> set[str] | None:
        """The other bare names a callee with one of these last parts (``DistributedDataParallel``) may be spelled
        with in this file: ``as`` aliases that imports bind (``from ... import DistributedDataParallel as DDP``) and
        the conventional names the file reads unbound that stand for one (``DDP`` in a snippet). None where a star
        import may bind anything."""
        spellings = set()
        for statement in self.index.nodes(cst.ImportFrom):
            if isinstance(statement.names, cst.ImportStar):
                return None
            for alias in statement.names:
                if alias.asname is not None and get_full_name_for_node(alias.name) in last_parts:
                    spellings.add(get_full_name_for_node(alias.asname.name) or "")
        for name in self.names.unbound_conventional():
            if CONVENTIONAL_NAMES[name].rsplit(".", 1)[-1] in last_parts:
                spellings.add(name)
        return spellings

    def conventional_spelling(self, qualified: str) -> str | None:
        """A conventional name the file reads unbound that means ``qualified`` (``dist`` for ``torch.distributed``
        in a snippet without imports): a fix may write it as the snippet does, without adding an import."""
        names = sorted(self.names.unbound_conventional())
        return next((name for name in names if CONVENTIONAL_NAMES[name] == qualified), None)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression, statement: cst.CSTNode) -> None:
        function = self.enclosing_function(statement)
        if isinstance(target, (cst.Tuple, cst.List)):
            for index, element in enumerate(target.elements):
                key = get_full_name_for_node(element.value)
                if key and not isinstance(element, cst.StarredElement) and not isinstance(element.value, cst.Subscript):
                    self._bindings[key].append(Binding(key, value, statement, function, index))
            return
        if isinstance(target, cst.Subscript):
            # `state[key] = value` stores an item: the name still holds the same container, now holding `value`
            key = get_full_name_for_node(target.value)
            if key:
                self._stores[key].append(Binding(key, value, statement, function))
            return
        key = get_full_name_for_node(target)
        if key:
            self._bindings[key].append(Binding(key, value, statement, function))

    # -- structure ------------------------------------------------------------------------

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.index.parent(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        return self.index.ancestors(node)

    def is_within(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        return self.index.contains(container, node)

    def within(self, container: cst.CSTNode, *types: type) -> list[cst.CSTNode]:
        """The nodes of these classes inside ``container`` (itself included), in source order, from the index."""
        return self.index.within(container, *types)

    def exclusive(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """``a`` and ``b`` sit in different branches of one ``if``/``elif``/``else`` (or ``try``/``except``)."""
        for ancestor in self.ancestors(a):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
            if isinstance(ancestor, cst.If) and ancestor.orelse is not None:
                branches = (ancestor.body, ancestor.orelse)
            elif isinstance(ancestor, cst.Try):
                branches = (ancestor.body, *ancestor.handlers)
            else:
                continue
            where_a = [i for i, branch in enumerate(branches) if self.is_within(a, branch)]
            where_b = [i for i, branch in enumerate(branches) if b is branch or self.is_within(b, branch)]
            if where_a and where_b and where_a != where_b:
                return True
        return False

    def enclosing_function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        # remembered for the node and every ancestor passed on the way up: rules ask it of most calls
        known = self._enclosing_function
        found = known.get(id(node), False)
        if found is not False:
            return found
        passed = [node]
        found = None
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                found = ancestor
                break
            cached = known.get(id(ancestor), False)
            if cached is not False:
                found = cached
                break
            passed.append(ancestor)
        for each in passed:
            known[id(each)] = found
        return found

    def enclosing_class(self, node: cst.CSTNode) -> cst.ClassDef | None:
        key = id(node)
        if key not in self._enclosing_class:
            self._enclosing_class[key] = next((a for a in self.ancestors(node) if isinstance(a, cst.ClassDef)), None)
        return self._enclosing_class[key]

    def enclosing_loop(self, node: cst.CSTNode) -> Loop | None:
        """The nearest loop around ``node`` in the same function."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, (cst.For, cst.While)) and child is ancestor.body:
                return ancestor
            child = ancestor
        return None

    def calls_within(self, node: cst.CSTNode) -> list[cst.Call]:
        """The calls strictly inside ``node``, in source order."""
        return [call for call in self.index.within(node, cst.Call) if call is not node]

    # -- names ----------------------------------------------------------------------------

    def is_variable(self, name: cst.Name) -> bool:
        """``name`` names a variable (read or bound): not the ``attr`` of ``x.name``, nor a keyword ``name=``."""
        parent = self.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            return False
        return not (isinstance(parent, cst.Arg) and parent.keyword is name)

    def is_read(self, name: cst.Name) -> bool:
        """``name`` is read as a value: a variable that no assignment, ``for``, ``with``, ``del``, comprehension,
        walrus or ``except`` binds (inside a tuple target too), and not the name a ``def``, ``class``, parameter,
        import, ``global`` or ``nonlocal`` declares. ``x += 1`` reads ``x``."""
        if not self.is_variable(name):
            return False
        child, parent = name, self.parent(name)
        if isinstance(parent, cst.Attribute):  # `a` of `a.b`: read, unless the chain is a module an import names
            while isinstance(parent, cst.Attribute):
                parent = self.parent(parent)
            return not isinstance(parent, (cst.ImportAlias, cst.ImportFrom))
        while isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
            child, parent = parent, self.parent(parent)
        if isinstance(parent, (cst.AssignTarget, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr, cst.Del)):
            return parent.target is not child
        if isinstance(parent, cst.AsName):
            return False  # `with ... as x`, `except E as x`, `import a as x`
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param)):
            return parent.name is not name
        return not isinstance(parent, (cst.ImportAlias, cst.NameItem))

    def reads_of(self, name: str, scope: cst.CSTNode) -> list[cst.Name]:
        """The reads of the variable ``name`` inside ``scope`` (nested functions included), in source order."""
        return [n for n in self.within(scope, cst.Name) if n.value == name and self.is_read(n)]

    def qualified_names(self, node: cst.CSTNode) -> frozenset[str]:
        if id(node) in self.stand_ins:
            return frozenset({get_full_name_for_node(node) or ""})
        return self.names.qualified_names(node)

    def callee_is(self, call: cst.Call, names: frozenset[str]) -> bool:
        func = call.func
        # Resolving a callee is the costly part: `x.<attr>(...)` can only be one of `names` if the attribute is
        # their last part, and a bare name only if it is that last part, an import's alias or a conventional name.
        if isinstance(func, cst.Attribute) and func.attr.value not in _last_parts(names):
            return False
        if (
            isinstance(func, cst.Name)
            and func.value not in _last_parts(names)
            and func.value not in self.imported_names
        ):
            return False
        return not names.isdisjoint(self.qualified_names(func))

    def method_name(self, call: cst.Call) -> str | None:
        """``x.y.prepare(...)`` -> "prepare"; ``prepare(...)`` -> "prepare"."""
        if isinstance(call.func, cst.Attribute):
            return call.func.attr.value
        if isinstance(call.func, cst.Name):
            return call.func.value
        return None

    def local_functions(self, call: cst.Call) -> list[cst.FunctionDef]:
        """The functions of this file a call can reach: ``f(...)``, ``self.f(...)`` in a class, or
        ``Cls(...)`` (its ``__init__``)."""
        key = id(call)
        found = self._local_functions.get(key)
        if found is None:
            found = self._local_functions[key] = self._find_local_functions(call)
        return found

    def _find_local_functions(self, call: cst.Call) -> list[cst.FunctionDef]:
        func = call.func
        if isinstance(func, cst.Name):
            constructors = [
                f
                for cls in self._classes_by_name().get(func.value, ())
                for f in self.functions.get("__init__", ())
                if self.enclosing_class(f) is cls
            ]
            if constructors:
                return constructors
            return [
                f
                for f in self.functions.get(func.value, ())
                if self.enclosing_class(f) is None and self._name_reaches(call, func.value, f)
            ]
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in {"self", "cls"}:
            cls = self.enclosing_class(call)
            return [
                f for f in self.functions.get(func.attr.value, ()) if cls is not None and self.enclosing_class(f) is cls
            ]
        if isinstance(func, cst.Attribute) and isinstance(func.value, (cst.Name, cst.Attribute)):
            # `trainer.fit()` on `trainer = Trainer(...)`, a class of this file
            methods = [f for f in self.functions.get(func.attr.value, ()) if self.enclosing_class(f) is not None]
            if methods:
                # the receiver's own assignments only: following parameters here would ask for call sites while
                # they are being indexed
                classes = {
                    id(cls)
                    for binding in self.bindings(get_full_name_for_node(func.value) or "", call)
                    if binding.index is None
                    and isinstance(binding.value, cst.Call)
                    and isinstance(binding.value.func, cst.Name)
                    for cls in self._classes_by_name().get(binding.value.func.value, ())
                }
                return [f for f in methods if id(self.enclosing_class(f)) in classes]
        return []

    def _name_reaches(self, call: cst.Call, name: str, function: cst.FunctionDef) -> bool:
        """Whether the bare ``name`` at ``call`` can mean ``function`` by Python's scoping: a function nested in
        another is seen only inside it, and a parameter of a function between the call and the definition hides it
        (accelerate's ``pippy_forward(forward, ...)`` calls its parameter, not the ``def forward`` of
        ``prepare_pippy``)."""
        owner = self.enclosing_function(function)
        for scope in self.ancestors(call):
            if scope is owner:
                return True
            if isinstance(scope, (cst.FunctionDef, cst.Lambda)) and _has_parameter(scope.params, name):
                return False
        return owner is None

    def _classes_by_name(self) -> dict[str, list[cst.ClassDef]]:
        if "classes_by_name" not in self._memo:
            by_name: dict[str, list[cst.ClassDef]] = defaultdict(list)
            for cls in self.classes:
                by_name[cls.name.value].append(cls)
            self._memo["classes_by_name"] = by_name
        return self._memo["classes_by_name"]

    def call_sites(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The calls of this file that reach ``function`` (an index built once, on the first question)."""
        if "call_sites" not in self._memo:
            sites: dict[int, list[cst.Call]] = defaultdict(list)
            named = set(self.functions) | set(self._classes_by_name())
            for call in self.calls:
                if self.method_name(call) in named:
                    for target in self.local_functions(call):
                        sites[id(target)].append(call)
            self._memo["call_sites"] = sites
        return self._memo["call_sites"].get(id(function), [])

    def reachable_calls(self, node: cst.CSTNode) -> list[cst.Call]:
        """Calls inside ``node`` and, transitively, inside the local functions they call."""
        seen: set[int] = set()
        result: list[cst.Call] = []
        pending: list[tuple[cst.CSTNode, int]] = [(node, 0)]
        while pending:
            container, depth = pending.pop()
            for call in self.calls_within(container):
                result.append(call)
                if depth < MAX_DEPTH:
                    for function in self.local_functions(call):
                        if id(function) not in seen:
                            seen.add(id(function))
                            pending.append((function, depth + 1))
        return result

    def bindings(self, key: str, at: cst.CSTNode) -> list[Binding]:
        """Assignments to ``key`` visible from ``at``: same function first, then module level.

        ``self.x`` keys are shared by the methods of one class.
        """
        candidates = self._bindings.get(key, [])
        if key.split(".", 1)[0] in {"self", "cls"}:
            cls = self.enclosing_class(at)
            # the class's own methods, then its base classes of this file (an attribute set in a base's __init__)
            for owner in self._class_chain(cls) if cls is not None else ():
                found = [b for b in candidates if b.function is not None and self.enclosing_class(b.function) is owner]
                if found:
                    return found
            return []
        function = self.enclosing_function(at)
        local = [b for b in candidates if b.function is function]
        if local or function is None:
            return local
        return [b for b in candidates if b.function is None]

    def surely_bound(self, name: str, at: cst.CSTNode) -> bool:
        """Every path to ``at`` has bound the plain name ``name``: it is a parameter, or an assignment before
        ``at`` runs unconditionally on the way (in ``at``'s own block or one around it), or each branch of an
        ``if``/``else`` assigns it. A name bound only under ``if local_rank != -1:`` is not: in the other run it
        does not exist."""
        if self.parameter(name, at) is not None:
            return True
        before = self.index.order(at)
        return any(
            0 <= self.index.order(b.statement) < before and self._bound_on_the_way(b.statement, name, at)
            for b in self.bindings(name, at)
        )

    def _bound_on_the_way(self, statement: cst.CSTNode, name: str, at: cst.CSTNode) -> bool:
        child = statement
        for ancestor in self.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)) or self.is_within(at, ancestor):
                return True
            if isinstance(ancestor, (cst.For, cst.While, cst.ExceptHandler, cst.Lambda)):
                return False  # a loop may run no time, a handler only on an error
            if isinstance(ancestor, cst.If):
                other = ancestor.orelse if child is ancestor.body else ancestor.body
                if other is None or not self._branch_binds(other, name):
                    return False
            child = ancestor
        return True

    def _branch_binds(self, branch: cst.CSTNode, name: str) -> bool:
        """Every way through ``branch`` (a block, an ``else``, an ``elif``) assigns ``name``."""
        if isinstance(branch, cst.If):
            return (
                self._branch_binds(branch.body, name)
                and branch.orelse is not None
                and self._branch_binds(branch.orelse, name)
            )
        if isinstance(branch, (cst.Else, cst.With)):
            return self._branch_binds(branch.body, name)
        if not isinstance(branch, cst.IndentedBlock):
            return False
        assigned = {id(b.statement) for b in self._bindings.get(name, ())}
        for statement in branch.body:
            if isinstance(statement, cst.SimpleStatementLine):
                if any(id(small) in assigned for small in statement.body):
                    return True
            elif isinstance(statement, (cst.If, cst.With)) and self._branch_binds(statement, name):
                return True
        return False

    def _class_chain(self, cls: cst.ClassDef) -> list[cst.ClassDef]:
        """``cls`` and the classes of this file it derives from, nearest first (3 levels)."""
        chain, pending = [cls], [cls]
        while pending and len(chain) <= 3:
            current = pending.pop(0)
            for base in current.bases:
                name = get_full_name_for_node(base.value) or ""
                for local in self._classes_by_name().get(name, ()):
                    if local not in chain:
                        chain.append(local)
                        pending.append(local)
        return chain

    def _inherited_attribute(self, expr: cst.Attribute, at: cst.CSTNode) -> list[Origin]:
        """Stand-ins for ``self.x`` set in a base class of another project module (``self.accelerator``
        assigned in ``BaseTrainer.__init__`` of ``trainer_base.py``)."""
        cls = self.enclosing_class(at)
        if self.project is None or cls is None or _CROSSING[0] >= MAX_CROSSINGS:
            return []
        key = get_full_name_for_node(expr) or ""
        found: list[Origin] = []
        for owner in self._class_chain(cls):
            for base in owner.bases:
                for qualified in self.qualified_names(base.value):
                    # a base module that makes a value, or assigns the attribute from a call (an imported helper
                    # that wraps the model: LoongForge's `self.model = wrap_model(self.model, ...)`)
                    assigned = re.compile(rf"{re.escape(key)}\s*(?::[^=\n]*)?=\s*[\w.]+\(")
                    definition = self.project.definition(qualified, VALUE_MARKERS, assigned)
                    if definition is None or not isinstance(definition[1], cst.ClassDef):
                        continue
                    other, base_class = definition
                    for binding in other._bindings.get(key, ()):
                        if binding.function is not None and other.enclosing_class(binding.function) is base_class:
                            note = f"set in `{qualified}`"
                            found.extend(self._stand_ins(other, binding.value, binding.statement, expr, note))
        return found

    def parameter(self, name: str, at: cst.CSTNode) -> tuple[cst.FunctionDef, int, cst.Param] | None:
        function = self.enclosing_function(at)
        if function is None:
            return None
        params = [*function.params.posonly_params, *function.params.params]
        for index, param in enumerate(params):
            if param.name.value == name:
                return function, index, param
        for param in function.params.kwonly_params:
            if param.name.value == name:
                return function, -1, param
        return None

    def origins(self, expr: cst.BaseExpression, at: cst.CSTNode | None = None, depth: int = 0) -> list[Origin]:
        """Every expression ``expr`` can evaluate to, following names, local calls and parameters."""
        at = at or expr
        if depth > MAX_DEPTH:
            return [Origin(expr)]
        key = get_full_name_for_node(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        if key:
            found = self.bindings(key, at)
            if found and isinstance(expr, cst.Name):
                # `loader = repeat(loader)`: the right side reads the name's earlier value, not this binding
                found = [b for b in found if b.value is not at and not self.is_within(at, b.value)]
            if found:
                held = [o for binding in found for o in self._binding_origins(binding, depth)]
                if held and all(_empty_container(o.node) for o in held):
                    # `raw = DatasetDict()` then `raw["train"] = load_dataset(...)`: the container is what it holds
                    held += [
                        o
                        for store in self._stores.get(key, ())
                        if store.function is self.enclosing_function(at)
                        and self.index.order(store.statement) < self.index.order(at)
                        for o in self.origins(store.value, store.statement, depth + 1)
                    ]
                return held
            if isinstance(expr, cst.Name):
                param = self.parameter(expr.value, at)
                if param is not None:
                    found = self._parameter_origins(*param, depth) + self._external_arguments(*param)
                    return found or [Origin(param[2])]
            elif key.split(".", 1)[0] == "self":
                return self._inherited_attribute(expr, at) or [Origin(expr)]
            return self._imported_value(expr) or [Origin(expr)]
        if isinstance(expr, cst.IfExp):
            return self.origins(expr.body, at, depth + 1) + self.origins(expr.orelse, at, depth + 1)
        position = _element_position(expr)
        if position is not None:
            # `parts = accelerator.prepare(model, loader)` then `model = parts[0]`: the same element an unpacking
            # `model, loader = ...` would take
            return self._element_origins(self.origins(expr.value, at, depth + 1), position, depth) or [Origin(expr)]
        if isinstance(expr, cst.Call) and self.local_functions(expr):
            return [
                o
                for function in self.local_functions(expr)
                for returned in self.returns.get(function, ())
                for o in self.origins(returned, returned, depth + 1)
            ] or [Origin(expr)]
        if isinstance(expr, cst.Call):
            return self._imported_value(expr) or [Origin(expr)]
        return [Origin(expr)]

    def _binding_origins(self, binding: Binding, depth: int) -> list[Origin]:
        if binding.index is None:
            return self.origins(binding.value, binding.statement, depth + 1)
        if isinstance(binding.value, (cst.Tuple, cst.List)):
            elements = binding.value.elements
            if binding.index < len(elements):
                return self.origins(elements[binding.index].value, binding.statement, depth + 1)
            return []
        return self._element_origins(self.origins(binding.value, binding.statement, depth + 1), binding.index, depth)

    def _element_origins(self, containers: list[Origin], position: int, depth: int) -> list[Origin]:
        """The origins of element ``position`` of a value with these origins: a literal tuple's element, else the
        value itself with that index (the ``position``-th result of ``accelerator.prepare(...)``)."""
        result = []
        for origin in containers:
            if isinstance(origin.node, (cst.Tuple, cst.List)) and origin.index is None:
                elements = origin.node.elements
                if position < len(elements) and not any(isinstance(e, cst.StarredElement) for e in elements):
                    result.extend(self.origins(elements[position].value, origin.node, depth + 1))
            else:
                result.append(Origin(origin.node, position))
        return result

    def _parameter_origins(self, function: cst.FunctionDef, index: int, param: cst.Param, depth: int) -> list[Origin]:
        result = []
        for call in self.call_sites(function):
            argument = self.argument_for(call, function, param.name.value, index)
            if argument is not None:
                result.extend(self.origins(argument, call, depth + 1))
        return result

    def argument_for(
        self, call: cst.Call, function: cst.FunctionDef, name: str, index: int
    ) -> cst.BaseExpression | None:
        """What a call site of ``function`` passes for its parameter ``name`` at ``index`` (-1: keyword-only).

        Methods and constructors are called without ``self``, so positions shift by one.
        """
        if index < 0:
            return argument_of(call, name, None)
        offset = 1 if self.enclosing_class(function) is not None else 0
        return argument_of(call, name, index - offset)

    # -- across modules -------------------------------------------------------------------------

    def module_definition(self, name: str) -> cst.CSTNode | None:
        """The module-level ``def`` or ``class`` named ``name``, or the value last assigned to it at module level."""
        for function in self.functions.get(name, ()):
            if self.enclosing_function(function) is None and self.enclosing_class(function) is None:
                return function
        for cls in self._classes_by_name().get(name, ()):
            if self.enclosing_function(cls) is None and self.enclosing_class(cls) is None:
                return cls
        values = [
            b.value
            for b in self._bindings.get(name, ())
            if b.function is None and b.index is None and self.enclosing_class(b.statement) is None
        ]
        return values[-1] if values else None

    def external_call_sites(self, function: cst.FunctionDef) -> list[Site]:
        """The calls of ``function`` in the project's other modules: a module-level function called by name,
        or a module-level class constructed (its ``__init__``)."""
        if self.project is None:
            return []
        name = self._exported_name(function)
        return self.project.callers(name) if name else []

    def _exported_name(self, function: cst.FunctionDef) -> str | None:
        if self.enclosing_function(function) is not None:
            return None
        cls = self.enclosing_class(function)
        if cls is None:
            return function.name.value
        if self.enclosing_class(cls) is not None or self.enclosing_function(cls) is not None:
            return None
        if function.name.value == "__init__":
            return cls.name.value
        return f"{cls.name.value}.{function.name.value}"

    def _external_arguments(self, function: cst.FunctionDef, index: int, param: cst.Param) -> list[Origin]:
        """Stand-ins for what other modules pass for a parameter (an Accelerator, a wrapped or prepared
        model, a loader with a ``DistributedSampler``), so every question about it answers as if the value
        had been made here."""
        if self.project is None or _CROSSING[0] >= MAX_CROSSINGS:
            return []
        if index == 0 and self.enclosing_class(function) is not None:
            return []  # `self`: the instance, not an argument a caller passes
        key = ("external_arguments", id(function), param.name.value, _CROSSING[0])
        return self._remember(key, lambda: self._external_arguments_of(function, index, param))

    def _remember(self, key: tuple, compute):
        """``compute()``, once per key, with the project files it read counted again on every later use (the
        cache re-checks a file when one of them changes). Keys carry the depth a question was asked at: an
        answer cut short by a depth bound is never served to a shallower question."""
        if key in self._memo:
            answer, read = self._memo[key]
            if self.project is not None:
                self.project.project.record(read)
            return answer
        if self.project is None:
            answer, read = compute(), ()
        else:
            with self.project.project.recording() as recorded:
                answer = compute()
            read = frozenset(recorded)
        self._memo[key] = (answer, read)
        return answer

    def _external_arguments_of(self, function: cst.FunctionDef, index: int, param: cst.Param) -> list[Origin]:
        offset = 1 if self.enclosing_class(function) is not None and index >= 0 else 0
        found: list[Origin] = []
        name = self._exported_name(function)
        for site in self.project.callers(name, VALUE_MARKERS) if name else ():
            argument = argument_of(site.call, param.name.value, None if index < 0 else index - offset)
            if argument is None:
                continue
            note = f"passed at {site.facts._where(site.call)}"
            found.extend(self._stand_ins(site.facts, argument, site.call, param, note))
        return found

    def _imported_value(self, expr: cst.BaseExpression) -> list[Origin]:
        """Stand-ins for a module global or a function's return value of another project module
        (``from .setup import accelerator``, ``loader = data.build_loader(...)``)."""
        if self.project is None or _CROSSING[0] >= MAX_CROSSINGS:
            return []
        target = expr.func if isinstance(expr, cst.Call) else expr
        if not self.imported_root(target) or self.index.order(target) < 0:
            return []  # only an imported name can come from another module
        if any(_class_like(part) for part in (get_full_name_for_node(target) or "").split(".")):
            # `Trainer(...)` builds an instance of the class: no function's return to follow; `PrecisionType.FP8`
            # and `AcceleratorState` are a class and its attribute, not a value made elsewhere
            return []
        found: list[Origin] = []
        for qualified in self.qualified_names(target):
            definition = self.project.definition(qualified, VALUE_MARKERS)
            if definition is None:
                continue
            other, node = definition
            if isinstance(expr, cst.Call):
                if not isinstance(node, cst.FunctionDef):
                    continue
                for returned in other.returns.get(node, ()):
                    found.extend(self._stand_ins(other, returned, returned, expr, f"returned by `{qualified}`"))
            elif isinstance(node, cst.BaseExpression):
                found.extend(self._stand_ins(other, node, node, expr, f"made in `{qualified}`"))
        return found

    def imported_root(self, expr: cst.BaseExpression) -> bool:
        """``expr`` is a dotted name whose first part an import binds (``utils.save``, ``build_loader``): the
        only names that can come from another module."""
        while isinstance(expr, cst.Attribute):
            expr = expr.value
        return isinstance(expr, cst.Name) and expr.value in self.imported_names

    def _stand_ins(
        self, other: PythonFacts, value: cst.BaseExpression, at: cst.CSTNode, here: cst.CSTNode, note: str
    ) -> list[Origin]:
        _CROSSING[0] += 1
        try:
            kinds = other.value_kinds(value, at)
        finally:
            _CROSSING[0] -= 1
        return [Origin(self.stand_in(STAND_INS[kind], here, note)) for kind in kinds]

    def stand_in(self, template: str, here: cst.CSTNode, note: str) -> cst.BaseExpression:
        """A detached expression that stands, at ``here``, for a value made in another module; its names are
        their own qualified names, and a finding placed on it is placed on ``here``."""
        key = ("stand_in", template, id(here))
        if key not in self._memo:
            node = cst.parse_expression(template)
            for part in _walk_detached(node, (cst.CSTNode,)):
                self.stand_ins[id(part)] = here
                self._stand_in_notes[id(part)] = note
            self._memo[key] = node
        return self._memo[key]

    def stand_in_note(self, node: cst.CSTNode) -> str | None:
        """Where a stand-in's value was made (``passed at train.py:12``); None for a node of this file."""
        return self._stand_in_notes.get(id(node))

    def value_kinds(self, expr: cst.BaseExpression, at: cst.CSTNode) -> list[str]:
        """What a value is, in the terms another module's questions need: "accelerator", "ddp", "prepared",
        "sampled" (a loader with a shuffling ``DistributedSampler``), "loader" (one without)."""
        kinds = []
        origins = self.origins(expr, at)
        if self.is_accelerator(expr, at):
            kinds.append("accelerator")
        calls = [o.node for o in origins if isinstance(o.node, cst.Call)]
        if any(self.callee_is(call, DDP_CLASSES) for call in calls):
            kinds.append("ddp")
        elif any(self.is_prepare_call(call) for call in calls):
            kinds.append("prepared")
        elif "accelerator" not in kinds:
            use = self.distributed_sampler(expr, at)
            if use is not None:
                kinds.append("sampled" if use.shuffle else "maybe_sampled")
            elif any(self.is_instance_of(call, DATALOADER_CLASSES) for call in calls):
                kinds.append("loader")
        return kinds

    # -- which ranks reach a statement ----------------------------------------------------------

    def rank_dependent(self, test: cst.BaseExpression) -> bool:
        """Some ranks take the branch and others may not (``rank == 0``, ``rank != 0 and not evaluate``)."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.rank_dependent(test.expression)
        if isinstance(test, cst.BooleanOperation):
            return self.rank_dependent(test.left) or self.rank_dependent(test.right)
        return self.main_when(test, True) or self.main_when(test, False)

    def rank_split(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """What, inside its own function, lets some ranks skip ``node``: a rank guard, or an ``if`` on a rank
        test in either branch."""
        guard = self.rank_guard(node)
        if guard is not None:
            return guard
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.If) and child is not ancestor.test and self.rank_dependent(ancestor.test):
                return ancestor
            child = ancestor
        return None

    def all_ranks_reach(self, node: cst.CSTNode, depth: int = 0, some_path: bool = False) -> Reach:
        """Whether every rank runs ``node``, following the enclosing function's callers in every module of the
        project: ``Reach(True)`` when no rank test stands on any path, ``Reach(False, where)`` when one does,
        ``Reach(None, why)`` when a caller is out of sight (a function nobody here calls, or handed away).

        With ``some_path``, whether some path reaches ``node`` on every rank: a helper that one caller runs under
        ``if rank == 0`` and another calls unguarded is ``Reach(True)``, through the unguarded caller."""
        split = self.rank_split(node)
        if split is not None:
            return Reach(False, at=(self, split))
        function = self.enclosing_function(node)
        if function is None:
            return Reach(True)
        if depth >= MAX_CALLER_DEPTH + 2:
            return Reach(None, f"the callers of `{function.name.value}()` are too deep to follow")
        return self._remember(
            ("reach", id(function), depth, some_path), lambda: self._reach_from_callers(function, depth, some_path)
        )

    def _reach_from_callers(self, function: cst.FunctionDef, depth: int, some_path: bool) -> Reach:
        answers = [self.all_ranks_reach(site, depth + 1, some_path) for site in self.call_sites(function)]
        answers += [
            _through(site.facts, site.call, site.facts.all_ranks_reach(site.call, depth + 1, some_path))
            for site in self.external_call_sites(function)
        ]
        for call, main_only in self._handed_to(function):
            answers.append(
                Reach(False, at=(self, call)) if main_only else self.all_ranks_reach(call, depth + 1, some_path)
            )
        name = self._exported_name(function)
        if self.project is not None and name and "." not in name:
            for other, reference, _ in self.project.references(name):
                call, main_only = _handing_call(other, reference)
                if call is None:
                    answers.append(Reach(None, f"`{name}()` is kept as a value in {other._where(reference)}"))
                else:
                    answers.append(
                        Reach(False, at=(other, call))
                        if main_only
                        else _through(other, call, other.all_ranks_reach(call, depth + 1, some_path))
                    )
        if name and self.project is not None and self.project.project.too_many_callers(self.project.path, name):
            answers.append(Reach(None, f"`{function.name.value}()` is called from more modules than lintdist follows"))
        if not answers:
            where = f" ({self.project.path.name})" if self.project is not None else ""
            return Reach(None, f"`{function.name.value}()`{where} is called from code lintdist cannot see")
        if some_path:
            return next((a for a in answers if a.value is True), None) or next(
                (a for a in answers if a.value is None), answers[0]
            )
        return next((a for a in answers if a.value is False), None) or next(
            (a for a in answers if a.value is None), Reach(True, through=tuple(t for a in answers for t in a.through))
        )

    def _handed_to(self, function: cst.FunctionDef) -> list[tuple[cst.Call, bool]]:
        """The calls this file hands ``function`` to as an argument (``mp.spawn(main_worker, ...)``,
        ``notebook_launcher(training_function)``), each with whether the callee runs it on the main process only."""
        if "arguments_by_name" not in self._memo:
            by_name: dict[str, list[cst.Name]] = defaultdict(list)
            for argument in self.index.nodes(cst.Arg):
                if isinstance(argument.value, cst.Name):
                    by_name[argument.value.value].append(argument.value)
            self._memo["arguments_by_name"] = by_name
        found = []
        for name in self._memo["arguments_by_name"].get(function.name.value, ()):
            call, main_only = _handing_call(self, name)
            if call is not None:
                found.append((call, main_only))
        return found

    def where(self, node: cst.CSTNode) -> str:
        """Where a node of this module is, for a message: ``main.py:6`` (see ``_where``)."""
        return self._where(node)

    def _where(self, node: cst.CSTNode) -> str:
        """``main.py:6``; without a project (a text with no file), the test itself: ``if rank == 0``."""
        if self.project is not None:
            return f"{self.project.path.name}:{self.project.line(self, node)}"
        shown = node.test if isinstance(node, (cst.If, cst.While)) else node
        return f"`{cst.Module([]).code_for_node(shown).strip().splitlines()[0]}`"

    # -- objects known by their API ---------------------------------------------------------------

    def used_as(self, expr: cst.BaseExpression, at: cst.CSTNode) -> tuple[str, tuple[str, ...]] | None:
        """The kind of object ``expr`` is by the API used on it in its scope, where nothing binds it in sight:
        ("accelerator", (the attributes it rests on)), ("ddp", ...), ("sampler", ...) or ("deepspeed_engine", ...)."""
        key = get_full_name_for_node(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
        if not key:
            return None
        memo = ("used_as", key, id(self._api_scope(key, at)))
        if memo not in self._memo:
            self._memo[memo] = self._identify(key, at)
        return self._memo[memo]

    def _api_scope(self, key: str, at: cst.CSTNode) -> cst.CSTNode:
        if key.split(".", 1)[0] in {"self", "cls"}:
            return self.enclosing_class(at) or self.index.module
        return self.enclosing_function(at) or self.index.module

    def _identify(self, key: str, at: cst.CSTNode) -> tuple[str, tuple[str, ...]] | None:
        if "attribute_uses" not in self._memo:
            uses: dict[str, list[cst.Attribute]] = defaultdict(list)
            for attribute in self.index.nodes(cst.Attribute):
                if isinstance(attribute.value, (cst.Name, cst.Attribute)):
                    owner = get_full_name_for_node(attribute.value)
                    if owner:
                        uses[owner].append(attribute)
            self._memo["attribute_uses"] = uses
        scope = self._api_scope(key, at)
        used = {
            a.attr.value
            for a in self._memo["attribute_uses"].get(key, ())
            if scope is self.index.module or self.is_within(a, scope)
        }
        last = key.rsplit(".", 1)[-1].lower()
        for kind, (required, together) in API_SIGNATURES.items():
            flags = sorted(used & required)
            others = sorted(used & together)
            if flags and others:
                return kind, (flags[0], *others)
            if not required and len(others) >= 2:
                return kind, tuple(others)
            if API_CONVENTIONAL_NAMES.get(kind) == last and (flags or others):
                return kind, ("its name", *flags, *others)
        return None

    def identified(self, expr: cst.BaseExpression, at: cst.CSTNode, kind: str) -> str | None:
        """``"`accelerator` is used as an Accelerator: `is_main_process`, `save_state`"`` where ``expr`` is
        known as ``kind`` by its API alone; None where a binding says what it is, or the API does not."""
        if not self.unbound(expr, at):
            return None
        found = self.used_as(expr, at)
        if found is None or found[0] != kind:
            return None
        name = get_full_name_for_node(expr)
        root = (name or "").split(".", 1)[0]
        if found[1][0] == "its name" and (root in self.imported_names or self.bindings(name or "", at)):
            return None  # the name alone speaks only where nothing in the file binds it
        attributes = ", ".join(a if a == "its name" else f"`{a}`" for a in found[1])
        return f"`{name}` is used as {API_NAMES[kind]}: {attributes}"

    def unbound(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """No assignment, import or known argument in sight says what ``expr`` holds."""
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return False
        for origin in self.origins(expr, at):
            if isinstance(origin.node, cst.Param):
                continue
            if origin.node is expr and (
                self.index.order(expr) < 0
                or not any(q.split(".", 1)[0] in KNOWN_LIBRARIES for q in self.qualified_names(expr))
            ):
                continue
            return False
        return True

    # -- loaders, samplers and loops ------------------------------------------------------------

    def data_loops(self) -> list[tuple[cst.For, cst.BaseExpression]]:
        """``for`` loops over a name, attribute or call (through ``enumerate``/``tqdm``/``iter``), with that expression."""
        if "data_loops" in self._memo:
            return self._memo["data_loops"]
        result = self._memo["data_loops"] = []
        for loop in self.loops:
            if isinstance(loop, cst.For):
                iterated = iterated_expression(loop.iter)
                if iterated is not None:
                    result.append((loop, iterated))
        return result

    def iterator_passes(self) -> list[tuple[Loop, cst.BaseExpression]]:
        """Loops that pull batches with ``next(it)`` (or ``it.next()``) from ``it = iter(loader)`` (or
        ``enumerate``/``tqdm`` of it), with the loader's expression: a pass over the loader that is no ``for batch
        in loader``. ``iterator_starts`` says where each iterator is made."""
        if "iterator_passes" in self._memo:
            return self._memo["iterator_passes"]
        result = self._memo["iterator_passes"] = []
        starts: dict[int, tuple[cst.Call, ...]] = self._memo.setdefault("iterator_starts", {})
        for call in self.calls:
            iterator = _pulled_iterator(call)
            if iterator is None:
                continue
            loop = self.enclosing_loop(call)
            if loop is None:
                continue
            found = []
            for origin in self.origins(iterator, call):
                node = origin.node
                if isinstance(node, cst.Call) and origin.index is None and wrapped_iterable(node) is not None:
                    inner = iterated_expression(node)
                    if inner is not None:
                        found.append((node, inner))
            # every `iter(...)` that (re)makes this iterator: the one before the loop and the one that restarts it
            made = tuple(node for node, _ in found)
            for _, inner in found:
                result.append((loop, inner))
                starts[id(inner)] = tuple(dict.fromkeys((*starts.get(id(inner), ()), *made)))
        return result

    def iterator_starts(self, loader: cst.BaseExpression) -> tuple[cst.Call, ...]:
        """For the loader expression of an iterator pass (``iterator_passes``): the ``iter(...)`` calls that make
        the iterator the pass pulls from, the first one and any that re-make it when it runs out (``except
        StopIteration: it = iter(loader)``). Empty for any other expression."""
        self.iterator_passes()
        return self._memo["iterator_starts"].get(id(loader), ())

    def reaches_method(self, node: cst.CSTNode, names: frozenset[str]) -> bool:
        """A call of one of these method (or function) names runs inside ``node``, directly or via local calls."""
        return any(self.method_name(call) in names for call in self.reachable_calls(node))

    def trains(self, node: cst.CSTNode) -> bool:
        """A backward pass runs inside ``node``."""
        return self.reaches_method(node, BACKWARD_METHODS)

    def distributed_sampler(
        self, loader: cst.BaseExpression, at: cst.CSTNode, _wrappers: frozenset[int] = frozenset()
    ) -> SamplerUse | None:
        """The shuffling ``DistributedSampler`` behind a loader expression, unless the loader was prepared
        by accelerate or Fabric (they set the epoch themselves)."""
        facts = self
        key = string_key(loader)
        if key is not None:
            # `self.data_loader["train"]` of `data_loader = {"train": DataLoader(...), "dev": ...}`
            for origin in facts.origins(loader.value, at):
                if isinstance(origin.node, cst.Dict) and id(origin.node) not in _wrappers:
                    for element in origin.node.elements:
                        if isinstance(element, cst.DictElement) and string_value(element.key) == key:
                            use = self.distributed_sampler(element.value, element, _wrappers | {id(origin.node)})
                            if use is not None:
                                return use
        origins = facts.origins(loader, at)
        if any(facts.is_prepare_call(o.node) for o in origins):
            return None  # accelerate and Fabric loaders set the epoch themselves
        for origin in origins:
            node = origin.node
            if not isinstance(node, cst.Call) or id(node) in _wrappers:
                continue
            if origin.index is not None:
                # `model, opt, loader, sched = backend.distribute(model=..., training_data=dl)`: the one loader
                # going in is the one coming out
                uses = [
                    use
                    for arg in node.args
                    if not arg.star
                    and (use := self.distributed_sampler(arg.value, node, _wrappers | {id(node)})) is not None
                ]
                if len(uses) == 1:
                    return uses[0]
                continue
            if wrapped_iterable(node) is not None:  # `progress = tqdm(loader)` ... `for batch in progress`
                return self.distributed_sampler(wrapped_iterable(node), node, _wrappers | {id(node)})
            is_dataloader = facts.is_instance_of(node, DATALOADER_CLASSES)
            sampler_arg = argument_of(node, "sampler", 3 if is_dataloader else None)
            candidates = [sampler_arg] if sampler_arg is not None else []
            batch_sampler = argument_of(node, "batch_sampler", 4 if is_dataloader else None)
            if batch_sampler is not None:
                for inner in facts.origins(batch_sampler, node):
                    if isinstance(inner.node, cst.Call):
                        wrapped = argument_of(inner.node, "sampler", 0)
                        if wrapped is not None:
                            candidates.append(wrapped)
            for candidate in candidates:
                for sampler in facts.origins(candidate, node):
                    call = sampler.node
                    if not isinstance(call, cst.Call):
                        continue
                    chosen = not facts.is_instance_of(call, SAMPLER_CLASSES, "DistributedSampler")
                    if chosen and not facts.may_construct(call, SAMPLER_CLASSES, "DistributedSampler"):
                        continue
                    shuffle = argument_of(call, "shuffle", 3)
                    if isinstance(shuffle, cst.Name) and shuffle.value == "False":
                        continue
                    known = shuffle is None or (isinstance(shuffle, cst.Name) and shuffle.value == "True")
                    return SamplerUse(call, candidate, node, True if known else None, chosen)
        return None

    def epoch_loops(
        self, node: cst.CSTNode, loader: cst.BaseExpression, depth: int = 0
    ) -> list[tuple[Loop, cst.BaseExpression]]:
        """The loops that run ``node`` once per iteration, with the loader's expression there.

        When ``node`` sits in a function with no loop around it, the loops around
        the function's call sites count, the loader followed through its parameter.
        """
        facts = self
        outer = facts.enclosing_loop(node)
        if outer is not None:
            return [(outer, loader)]
        function = facts.enclosing_function(node)
        if function is None or depth >= MAX_CALLER_DEPTH:
            return []
        found = []
        for call in facts.call_sites(function):
            passed = self._passed(loader, node, function, call)
            if passed is not None:
                found.extend(self.epoch_loops(call, passed, depth + 1))
        return found

    def _passed(
        self, loader: cst.BaseExpression, at: cst.CSTNode, function: cst.FunctionDef, call: cst.Call
    ) -> cst.BaseExpression | None:
        """The caller's expression for ``loader``: the argument, when ``loader`` is a parameter."""
        if not isinstance(loader, cst.Name):
            return loader
        parameter = self.parameter(loader.value, at)
        if parameter is None:
            return loader
        return self.argument_for(call, function, loader.value, parameter[1])

    # -- what the script does -------------------------------------------------------------

    def imports(self, package: str) -> bool:
        """The file imports ``package`` or one of its modules (``import accelerate.utils``, ``from accelerate import
        x``)."""
        return any(m == package or m.startswith(f"{package}.") for m in self.imported_modules)

    def is_prepare_call(self, node: cst.CSTNode) -> bool:
        """``accelerator.prepare(...)``, ``prepare_data_loader`` or Fabric's ``setup_dataloaders``."""
        if not isinstance(node, cst.Call):
            return False
        if isinstance(node.func, cst.Attribute):
            method, receiver = node.func.attr.value, node.func.value
            if method not in PREPARE_METHODS:
                return False
            if method == "setup_dataloaders":
                return self._fabric_like(receiver, node)
            return self.accelerator_like(receiver, node)
        return self.callee_is(node, PREPARE_FUNCTIONS)

    def accelerator_like(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``expr`` holds an Accelerator, or its name says so (``self.accelerator`` handed in by unseen code)."""
        return self.is_accelerator(expr, at) or "accelerator" in _last_name_lower(expr)

    def _fabric_like(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``expr`` holds a Lightning ``Fabric``, or its name says so."""
        if any(isinstance(o.node, cst.Call) and self.callee_is(o.node, FABRIC_CLASSES) for o in self.origins(expr, at)):
            return True
        return "fabric" in _last_name_lower(expr)

    def is_accelerator(self, expr: cst.BaseExpression, at: cst.CSTNode | None = None) -> bool:
        """``expr`` holds an Accelerator: made here, passed in from another module, or known by its API where
        nothing in sight binds it (``is_main_process`` with ``save_state``)."""
        if any(
            isinstance(o.node, cst.Call) and self.callee_is(o.node, ACCELERATOR_CLASSES) for o in self.origins(expr, at)
        ):
            return True
        return self.identified(expr, at or expr, "accelerator") is not None

    @property
    def accelerator_constructions(self) -> list[cst.Call]:
        """``Accelerator(...)`` calls, in source order."""
        if "accelerator_constructions" not in self._memo:
            self._memo["accelerator_constructions"] = [c for c in self.calls if self.callee_is(c, ACCELERATOR_CLASSES)]
        return self._memo["accelerator_constructions"]

    def accelerator_at(self, at: cst.CSTNode) -> str | None:
        """Source text naming an Accelerator bound where ``at`` is (``self.accelerator``), or None: see
        ``lintdist.spelling``."""
        return spelling.accelerator_at(self, at)

    def distributed_at(self, at: cst.CSTNode | None = None) -> str | None:
        """How the script spells ``torch.distributed`` where ``at`` is (``dist``), or None: see ``lintdist.spelling``."""
        return spelling.distributed_at(self, at)

    def is_lightning_module(self, cls: cst.ClassDef) -> bool:
        """``cls`` derives from Lightning's ``LightningModule`` (see ``lintdist.lightning``)."""
        return lightning.is_lightning_module(self, cls)

    def lightning_module_of(self, node: cst.CSTNode) -> cst.ClassDef | None:
        """The LightningModule whose method ``node`` is in, or None (see ``lintdist.lightning``)."""
        return lightning.lightning_module_of(self, node)

    @property
    def lightning_trainers(self) -> list[cst.Call]:
        """Lightning ``Trainer(...)`` calls, in source order."""
        if "lightning_trainers" not in self._memo:
            self._memo["lightning_trainers"] = [c for c in self.calls if self.callee_is(c, LIGHTNING_TRAINERS)]
        return self._memo["lightning_trainers"]

    def trainer_devices(self, trainer: cst.Call) -> str | None:
        """ "one", "several" or None: how many devices a ``Trainer(...)`` runs on (see ``lintdist.lightning``)."""
        return lightning.trainer_devices(self, trainer)

    def local_classes(self) -> dict[str, set[str]]:
        """Class name -> qualified names of its bases, for subclasses defined in this file."""
        if "local_classes" in self._memo:
            return self._memo["local_classes"]
        result: dict[str, set[str]] = {}
        self._memo["local_classes"] = result
        for cls in self.classes:
            bases: set[str] = set()
            for arg in cls.bases:
                bases |= self.qualified_names(arg.value) | {get_full_name_for_node(arg.value) or ""}
            result[cls.name.value] = bases
        return result

    def derives_from(self, cls: cst.ClassDef, accept: Callable[[str], bool], depth: int = 0) -> bool:
        """A base of ``cls``, or of a local class it derives from (3 levels), has a qualified name ``accept`` takes."""
        for arg in cls.bases:
            if any(accept(name) for name in self.qualified_names(arg.value)):
                return True
            local = next((c for c in self.classes if c.name.value == get_full_name_for_node(arg.value)), None)
            if local is not None and local is not cls and depth < 3 and self.derives_from(local, accept, depth + 1):
                return True
        return False

    def is_instance_of(self, call: cst.Call, classes: frozenset[str], name_part: str | None = None) -> bool:
        """The call constructs one of ``classes``, a local subclass, or a class whose name contains ``name_part``."""
        return self._names_class(call.func, classes, name_part)

    def _names_class(self, expr: cst.BaseExpression, classes: frozenset[str], name_part: str | None) -> bool:
        names = self.qualified_names(expr)
        if not names.isdisjoint(classes):
            return True
        simple = get_full_name_for_node(expr) or ""
        last_parts = {n.rsplit(".", 1)[-1] for n in names | {simple}}
        if name_part and any(name_part in part for part in last_parts):
            return True
        return any(not self.local_classes().get(part, set()).isdisjoint(classes) for part in last_parts)

    def class_choices(self, call: cst.Call) -> list[cst.BaseExpression]:
        """The classes a call may construct when its callee is chosen at run time: each branch of ``(A if c else
        B)(...)``, or of the value a name bound that way holds (``sampler_cls = RandomSampler if rank == -1 else
        DistributedSampler``, then ``sampler_cls(ds)``), followed through names. Empty when the callee names its
        class itself, or holds what lintdist cannot read (a parameter no call site fills, a call's result)."""
        func = call.func
        if not isinstance(func, (cst.Name, cst.IfExp)):
            return []
        if isinstance(func, cst.Name) and not self.bindings(func.value, call):
            return []
        choices = [o.node for o in self.origins(func, call)]
        if any(not isinstance(node, (cst.Name, cst.Attribute)) or node is func for node in choices):
            return []
        return choices

    def may_construct(self, call: cst.Call, classes: frozenset[str], name_part: str | None = None) -> bool:
        """``is_instance_of``, or one of the classes the callee may be chosen from (``class_choices``) is."""
        if self.is_instance_of(call, classes, name_part):
            return True
        return any(self._names_class(choice, classes, name_part) for choice in self.class_choices(call))

    def wraps_in_another_module(self, call: cst.Call, classes: frozenset[str], markers: tuple[str, ...]) -> bool:
        """``call`` runs a function of another project module that wraps a model in one of ``classes`` itself
        (torchtune's ``training.shard_model`` calls ``fully_shard``; h2o-llmstudio's ``wrap_model_distributed``
        builds the ``DistributedDataParallel``), followed one level; ``markers`` spare modules that cannot."""
        if self.project is None or not self.imported_root(call.func) or self.local_functions(call):
            return False
        for qualified in self.qualified_names(call.func):
            found = self.project.definition(qualified, markers)
            if found is not None and isinstance(found[1], cst.FunctionDef):
                other, function = found
                if any(other.callee_is(inner, classes) for inner in other.calls_within(function)):
                    return True
        return False

    def named_ddp_helper(self, call: cst.Call) -> str | None:
        """The name of the helper ``call`` runs when that name says it wraps a model in DDP
        (``init_distributed_data_parallel_model(model)``, ``wrap_ddp(model)``) and its body is not in sight: not
        in this module, nor in a project module lintdist can read (``origins`` follows a helper it can read, and
        what that returns is the answer). None otherwise."""
        name = _last_name(call.func)
        if not name or not DDP_HELPER_NAME.search(name) or self.local_functions(call):
            return None
        if self.project is not None and self.imported_root(call.func):
            if any(self.project.definition(q) is not None for q in self.qualified_names(call.func)):
                return None
        return name

    def sets_up_processes(self) -> bool:
        """This module's own code makes a run of several processes: an Accelerator, a DDP/FSDP wrapper, a
        process group, a spawn, DeepSpeed or Fabric."""
        if "sets_up_processes" not in self._memo:
            self._memo["sets_up_processes"] = bool(self.wrapped_models()) or any(
                self.callee_is(call, ACCELERATOR_CLASSES | DISTRIBUTED_CALLS) for call in self.calls
            )
        return self._memo["sets_up_processes"]

    def wrapped_models(self) -> list[cst.Call]:
        """``DistributedDataParallel(...)``, ``FullyShardedDataParallel(...)`` and ``fully_shard(...)`` calls."""
        if "wrapped_models" not in self._memo:
            self._memo["wrapped_models"] = [call for call in self.calls if self.callee_is(call, DDP_CLASSES)]
        return self._memo["wrapped_models"]

    def under_no_grad(self, node: cst.CSTNode) -> bool:
        """Inside ``with torch.no_grad():``/``inference_mode()`` or a function decorated with one."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.With):
                for item in ancestor.items:
                    target = item.item.func if isinstance(item.item, cst.Call) else item.item
                    if not self.qualified_names(target).isdisjoint(NO_GRAD_CONTEXTS):
                        return True
            if isinstance(ancestor, cst.FunctionDef):
                for decorator in ancestor.decorators:
                    target = decorator.decorator
                    target = target.func if isinstance(target, cst.Call) else target
                    if not self.qualified_names(target).isdisjoint(NO_GRAD_CONTEXTS):
                        return True
        return False

    # -- which ranks run a statement -------------------------------------------------------

    def rank_guard(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """What makes ``node`` run on the main process only, inside its own function: an ``if`` on
        ``is_main_process``/``rank == 0``/``local_rank in (-1, 0)`` (or the ``else`` of the negated test),
        an earlier ``if not is_main_process: return`` in an enclosing block, or an
        ``@accelerator.on_main_process``-style decorator. None when any rank may run it; the call sites
        of the enclosing function are not followed."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, cst.If):
                if child is ancestor.body and self.main_when(ancestor.test, True):
                    return ancestor
                if child is ancestor.orelse and self.main_when(ancestor.test, False):
                    return ancestor
            elif isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                for statement in ancestor.body:
                    if statement is child:
                        break
                    if (
                        isinstance(statement, cst.If)
                        and statement.orelse is None
                        and _exits(statement.body)
                        and self.main_when(statement.test, False)
                    ):
                        return statement
            elif isinstance(ancestor, cst.FunctionDef):
                return next((d for d in ancestor.decorators if _last_name(d.decorator) in MAIN_ONLY_DECORATORS), None)
            elif isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
                return None
            child = ancestor
        return None

    def main_when(self, test: cst.BaseExpression, value: bool, depth: int = 0) -> bool:
        """``test`` evaluating to ``value`` implies that this is the main process (global or per node)."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.main_when(test.expression, not value, depth)
        if isinstance(test, cst.BooleanOperation):
            # `a and b` true, or `a or b` false, implies the same of each side
            if isinstance(test.operator, cst.And if value else cst.Or):
                return self.main_when(test.left, value, depth) or self.main_when(test.right, value, depth)
            return False
        if isinstance(test, cst.Comparison):
            return _rank_comparison(test) is value
        if _is_rank(test):
            return not value  # `if not rank:`
        if _last_name(test) in MAIN_FLAGS:
            return value
        if isinstance(test, (cst.Name, cst.Attribute)) and depth < MAX_CALLER_DEPTH:
            # `master_process = ddp_rank == 0` (or `= True` in the single-process branch) ... `if master_process:`,
            # and `self.is_main = accelerator.is_main_process` in `__init__` ... `if self.is_main:` in a method
            values = [b.value for b in self.bindings(get_full_name_for_node(test) or "", test) if b.index is None]
            tests = [v for v in values if not (isinstance(v, cst.Name) and v.value == "True")]
            if values or not MAIN_FLAG_LIKE.fullmatch(_last_name(test) or ""):
                return bool(tests) and all(self.main_when(t, value, depth + 1) for t in tests)
        if isinstance(test, (cst.Name, cst.Attribute, cst.Call)) and MAIN_FLAG_LIKE.fullmatch(_last_name(test) or ""):
            if isinstance(test, cst.Call) and test.args:
                return False  # `is_main(rank)`: a question about its argument, not about this process
            return value and self.project_main_flag(test, depth) is not False
        return False

    def project_main_flag(self, test: cst.BaseExpression, depth: int = 0) -> bool | None:
        """Whether a flag named like a main-process test (``distr.is_global_main``, ``self.is_master``,
        ``env.is_main()``) holds on the main process only, by its definition: True when every value its
        class gives it (a property's or method's returns, a class-level value, ``self.flag = ...`` in a method; in
        this module or, through the project, the module that defines the receiver's class) is such a test
        (``return self.global_rank <= 0``), False when some is not, None when no definition is in sight (the name
        then speaks for it)."""
        target = test.func if isinstance(test, cst.Call) else test
        key = ("project_main_flag", id(target), depth)
        return self._remember(key, lambda: self._project_main_flag(target, depth))

    def _project_main_flag(self, target: cst.BaseExpression, depth: int) -> bool | None:
        name = _last_name(target) or ""
        definitions = [
            (facts, value) for facts, cls in self._receiver_classes(target) for value in facts._class_values(cls, name)
        ]
        if not definitions:
            return None
        if depth >= MAX_CALLER_DEPTH or _CROSSING[0] >= MAX_CROSSINGS:
            return False
        literal = {"True", "False", "None"}
        tests = [(f, v) for f, v in definitions if not (isinstance(v, cst.Name) and v.value in literal)]
        _CROSSING[0] += 1
        try:
            return bool(tests) and all(f.main_when(v, True, depth + 1) for f, v in tests)
        finally:
            _CROSSING[0] -= 1

    def _receiver_classes(self, target: cst.BaseExpression) -> list[tuple[PythonFacts, cst.ClassDef]]:
        """The classes (with the facts of their module) that may define the attribute ``target`` reads: the
        enclosing class for ``self.x``, the class a receiver was built from (``distr = DistribTorch.instance()``,
        ``env = Env()``), here or in another project module; else the classes of this module that define it."""
        name = _last_name(target) or ""
        if not isinstance(target, cst.Attribute):
            return []
        receiver = target.value
        found: list[tuple[PythonFacts, cst.ClassDef]] = []
        if isinstance(receiver, cst.Name) and receiver.value in {"self", "cls"}:
            cls = self.enclosing_class(target)
            found = [(self, c) for c in self._class_chain(cls)] if cls is not None else []
        else:
            for origin in self.origins(receiver, target):
                node = origin.node
                if not isinstance(node, cst.Call):
                    continue
                # `DistribTorch()` or `DistribTorch.instance()`: the class named there
                for candidate in (node.func, node.func.value if isinstance(node.func, cst.Attribute) else None):
                    if isinstance(candidate, (cst.Name, cst.Attribute)):
                        found.extend(self._class_named(candidate))
        if not found:
            found = [(self, c) for c in self.classes if self._class_values(c, name)]
        return found

    def _class_named(self, expr: cst.BaseExpression) -> list[tuple[PythonFacts, cst.ClassDef]]:
        """The class ``expr`` names: one of this module (with its local bases), or one another project module
        defines."""
        local = self._classes_by_name().get(get_full_name_for_node(expr) or "", [])
        if local:
            return [(self, c) for cls in local for c in self._class_chain(cls)]
        if self.project is None or not self.imported_root(expr):
            return []
        found = []
        for qualified in self.qualified_names(expr):
            definition = self.project.definition(qualified)
            if definition is not None and isinstance(definition[1], cst.ClassDef):
                other, cls = definition
                found.extend((other, c) for c in other._class_chain(cls))
        return found

    def _class_values(self, cls: cst.ClassDef, name: str) -> list[cst.BaseExpression]:
        """What class ``cls`` of this module gives its attribute ``name``: the returns of a method or property of
        that name, a value assigned in the class body, and ``self.name = ...`` in its methods."""
        values: list[cst.BaseExpression] = []
        for function in self.functions.get(name, ()):
            if self.enclosing_class(function) is cls and self.enclosing_function(function) is None:
                values.extend(self.returns.get(function, ()))
        for binding in self._bindings.get(name, ()):
            if binding.function is None and binding.index is None and self.enclosing_class(binding.statement) is cls:
                values.append(binding.value)
        for binding in self._bindings.get(f"self.{name}", ()):
            if binding.function is not None and binding.index is None and self.enclosing_class(binding.function) is cls:
                values.append(binding.value)
        return values

    def single_process_branch(self, node: cst.CSTNode) -> cst.If | None:
        """The ``if`` inside ``node``'s function whose taken branch runs only in a one-process job (``if RANK == -1
        and stop:``, the ``else`` of ``if world_size > 1:``), or None. Rank-dependent control flow there cannot
        make ranks disagree: there is one rank."""
        child = node
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return None
            if isinstance(ancestor, cst.If) and child is not ancestor.test:
                if self.single_process_when(ancestor.test, child is ancestor.body):
                    return ancestor
            child = ancestor
        return None

    def single_process_when(self, test: cst.BaseExpression, value: bool) -> bool:
        """``test`` evaluating to ``value`` implies a job of one process: a rank of -1 (``local_rank == -1``, the
        convention of scripts that run with or without a launcher), a world size of 1, no process group
        (``not dist.is_initialized()``), ``DistributedType.NO``, or a false distributed flag (``not args.distributed``,
        nanoGPT's ``ddp``)."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.single_process_when(test.expression, not value)
        if isinstance(test, cst.BooleanOperation):
            if isinstance(test.operator, cst.And if value else cst.Or):
                return self.single_process_when(test.left, value) or self.single_process_when(test.right, value)
            return False
        if isinstance(test, cst.Comparison):
            holds = _one_process_comparison(test)
            return holds is not None and holds is value
        if isinstance(test, cst.Call) and not value:
            return bool(self.qualified_names(test.func) & PROCESS_GROUP_TESTS)
        if isinstance(test, (cst.Name, cst.Attribute)) and not value:
            return _last_name_lower(test).lstrip("_") in DISTRIBUTED_FLAGS
        return False

    def excludes_main(self, test: cst.BaseExpression, value: bool, depth: int = 0) -> bool:
        """``test`` evaluating to ``value`` implies that this is NOT the main process: the dual of ``main_when``,
        needed for conjunctions (``rank != 0 and not evaluate`` true excludes the main process, but its being
        false does not imply the main process)."""
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            return self.excludes_main(test.expression, not value, depth)
        if isinstance(test, cst.BooleanOperation):
            if isinstance(test.operator, cst.And if value else cst.Or):
                return self.excludes_main(test.left, value, depth) or self.excludes_main(test.right, value, depth)
            return False
        atom = _is_rank(test) or _last_name(test) in MAIN_FLAGS
        if isinstance(test, (cst.Name, cst.Attribute)) and depth < MAX_CALLER_DEPTH and not atom:
            values = [b.value for b in self.bindings(get_full_name_for_node(test) or "", test) if b.index is None]
            if not values and MAIN_FLAG_LIKE.fullmatch(_last_name(test) or ""):
                return self.main_when(test, not value, depth)  # the project's own flag: one test, as `rank == 0`
            if value and any(isinstance(v, cst.Name) and v.value == "True" for v in values):
                return False
            tests = [v for v in values if not (isinstance(v, cst.Name) and v.value == "True")]
            return bool(tests) and all(self.excludes_main(t, value, depth + 1) for t in tests)
        # a single rank test or main-process flag holds exactly on the main process
        return self.main_when(test, not value, depth)


def _through(facts: PythonFacts, call: cst.Call, reach: Reach) -> Reach:
    """``reach``, the answer at a call in another module, as an answer followed through that call."""
    return replace(reach, through=((facts, call), *reach.through))


def barrier_unsafe(reach: Reach) -> str:
    """Why a fix that adds a barrier or moves a collective is not offered: not every rank provably reaches it."""
    if reach.value is False:
        return f"a rank test at {reach.why} keeps some ranks from this code, and they would never reach the barrier"
    return f"{reach.why}, so lintdist cannot show that every rank reaches the barrier"


@lru_cache(maxsize=512)
def _last_parts(names: frozenset[str]) -> frozenset[str]:
    return frozenset(name.rsplit(".", 1)[-1] for name in names)


def single_pass(loop: Loop) -> bool:
    """A ``for`` loop that runs at most once: over a literal of one element, or ``range(1)``."""
    if not isinstance(loop, cst.For):
        return False
    iterator = loop.iter
    if isinstance(iterator, (cst.List, cst.Tuple)):
        return len(iterator.elements) <= 1
    return (
        isinstance(iterator, cst.Call)
        and get_full_name_for_node(iterator.func) == "range"
        and len(iterator.args) == 1
        and isinstance(iterator.args[0].value, cst.Integer)
        and iterator.args[0].value.evaluated_value <= 1
    )


def epoch_counter(loop: Loop) -> str | None:
    """The loop's epoch counter: a plain ``for`` target, or a ``while`` body's ``name += 1``."""
    if isinstance(loop, cst.For):
        target = loop.target
        return target.value if isinstance(target, cst.Name) and target.value != "_" else None
    if isinstance(loop.body, cst.IndentedBlock):
        for statement in loop.body.body:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if (
                        isinstance(small, cst.AugAssign)
                        and isinstance(small.operator, cst.AddAssign)
                        and isinstance(small.target, cst.Name)
                        and isinstance(small.value, cst.Integer)
                        and small.value.value == "1"
                    ):
                        return small.target.value
    return None


def argument_of(call: cst.Call, keyword: str, position: int | None) -> cst.BaseExpression | None:
    """The argument a call passes for a parameter, by keyword or by position."""
    positional = 0
    for arg in call.args:
        if arg.keyword is not None:
            if arg.keyword.value == keyword:
                return arg.value
        elif arg.star:
            return None
        else:
            if position is not None and positional == position:
                return arg.value
            positional += 1
    return None


def _pulled_iterator(call: cst.Call) -> cst.BaseExpression | None:
    """``it`` of ``next(it)`` or ``it.next()`` (the Python 2 spelling old loaders kept)."""
    func = call.func
    if isinstance(func, cst.Name) and func.value == "next" and call.args and not call.args[0].star:
        return call.args[0].value
    if isinstance(func, cst.Attribute) and func.attr.value == "next" and not call.args:
        return func.value
    return None


EMPTY_CONTAINERS = frozenset({"dict", "DatasetDict", "IterableDatasetDict", "OrderedDict", "defaultdict"})


def _empty_container(node: cst.CSTNode) -> bool:
    """``{}``, ``dict()``, ``DatasetDict()``: a container made empty, to be filled by item stores."""
    if isinstance(node, cst.Dict):
        return not node.elements
    return isinstance(node, cst.Call) and _last_name(node) in EMPTY_CONTAINERS and not node.args


def _element_position(expr: cst.BaseExpression) -> int | None:
    """``n`` for ``value[n]`` with a literal non-negative integer ``n``; None for any other expression."""
    if not isinstance(expr, cst.Subscript) or len(expr.slice) != 1:
        return None
    index = expr.slice[0].slice
    if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer):
        return index.value.evaluated_value
    return None


def wrapped_iterable(call: cst.Call) -> cst.BaseExpression | None:
    """The iterable inside ``enumerate(x)``, ``tqdm(x, ...)``, ``iter(x)``; None for other calls."""
    name = get_full_name_for_node(call.func) or ""
    if name.rsplit(".", 1)[-1] not in ITERATION_WRAPPERS:
        return None
    return argument_of(call, "iterable", 0)


def iterated_expression(expr: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``loader`` from ``loader``, ``enumerate(loader)``, ``tqdm(DataLoader(...))``, ``loaders["train"]``..."""
    while isinstance(expr, cst.Call) and wrapped_iterable(expr) is not None:
        expr = wrapped_iterable(expr)
    return expr if isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) else None


def _last_name_lower(expr: cst.BaseExpression) -> str:
    """The last part of a dotted name, lower-cased (``self.accelerator`` -> "accelerator"); "" for other
    expressions."""
    return (get_full_name_for_node(expr) or "").rsplit(".", 1)[-1].lower()


def _class_like(name: str) -> bool:
    """A CamelCase name (``Trainer``, ``PrecisionType``), not a constant (``ACCELERATOR``) or a function."""
    return name[:1].isupper() and any(c.islower() for c in name)


def _last_name(expr: cst.BaseExpression) -> str | None:
    """``accelerator.is_main_process`` -> "is_main_process"; calls give their callee's last name."""
    if isinstance(expr, cst.Call):
        expr = expr.func
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    if isinstance(expr, cst.Name):
        return expr.value
    return None


def _is_rank(expr: cst.BaseExpression) -> bool:
    """A process's rank: ``rank``, ``args.local_rank``, ``dist.get_rank()``, ``int(os.environ["RANK"])``..."""
    if isinstance(expr, (cst.Name, cst.Attribute)):  # `cfg.environment._local_rank`: a private copy is one too
        return (_last_name(expr) or "").lstrip("_") in RANK_NAMES
    if isinstance(expr, cst.Call):
        name = _last_name(expr)
        if name in RANK_GETTERS:
            return True
        if name == "int" and expr.args:
            return _is_rank(expr.args[0].value)
        if name in {"get", "getenv"} and expr.args:
            return _is_rank_variable(expr.args[0].value)
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        return _is_rank_variable(expr.slice[0].slice.value)
    return False


def _is_rank_variable(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.SimpleString) and expr.evaluated_value in {"RANK", "LOCAL_RANK"}


def _integer(expr: cst.BaseExpression) -> int | None:
    if isinstance(expr, cst.Integer):
        return int(expr.value)
    if (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
    ):
        return -int(expr.expression.value)
    return None


def _one_process_comparison(test: cst.Comparison) -> bool | None:
    """True if the comparison holds only in a one-process job, False if it fails only there, else None:
    ``rank == -1``, ``local_rank != -1``, ``world_size == 1``, ``world_size > 1``, ``num_processes <= 1``,
    ``distributed_type == DistributedType.NO``."""
    if len(test.comparisons) != 1:
        return None
    left, operator, right = test.left, test.comparisons[0].operator, test.comparisons[0].comparator
    if _integer(left) is not None or get_full_name_for_node(left) in {"DistributedType.NO", "NO"}:
        left, right = right, left
        flipped = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan}
        flipped.update({cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual})
        operator = flipped.get(type(operator), type(operator))()
    equal, unequal = isinstance(operator, (cst.Equal, cst.Is)), isinstance(operator, (cst.NotEqual, cst.IsNot))
    bound = _integer(right)
    if _is_rank(left) or _is_rank_variable_read(left):
        if bound == -1 and (equal or unequal):
            return equal
        return None
    if _is_world_size(left) and bound is not None:
        return {
            cst.Equal: True if bound == 1 else None,
            cst.NotEqual: False if bound == 1 else None,
            cst.LessThanEqual: True if bound == 1 else None,
            cst.LessThan: True if bound == 2 else None,
            cst.GreaterThan: False if bound == 1 else None,
            cst.GreaterThanEqual: False if bound == 2 else None,
        }.get(type(operator))
    if _last_name_lower(left) == "distributed_type" and (get_full_name_for_node(right) or "").endswith(
        "DistributedType.NO"
    ):
        return True if equal else False if unequal else None
    return None


def _is_rank_variable_read(expr: cst.BaseExpression) -> bool:
    """``RANK``, ``LOCAL_RANK`` as module constants (``RANK = int(os.getenv("RANK", -1))``)."""
    return isinstance(expr, (cst.Name, cst.Attribute)) and _last_name(expr) in {"RANK", "LOCAL_RANK"}


def _is_world_size(expr: cst.BaseExpression) -> bool:
    """A job's process count: ``world_size``, ``WORLD_SIZE``, ``accelerator.num_processes``,
    ``dist.get_world_size()``, ``int(os.environ["WORLD_SIZE"])``."""
    if isinstance(expr, cst.Call):
        name = _last_name(expr)
        if name == "get_world_size":
            return True
        if name == "int" and expr.args:
            return _is_world_size(expr.args[0].value)
        if name in {"get", "getenv"} and expr.args:
            return (
                isinstance(expr.args[0].value, cst.SimpleString) and expr.args[0].value.evaluated_value == "WORLD_SIZE"
            )
        return False
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        key = expr.slice[0].slice.value
        return isinstance(key, cst.SimpleString) and key.evaluated_value == "WORLD_SIZE"
    return _last_name_lower(expr).lstrip("_") in WORLD_SIZE_NAMES


def _rank_comparison(test: cst.Comparison) -> bool | None:
    """True if the comparison holds only on the main process, False if it fails only there, else None."""
    if len(test.comparisons) != 1:
        return None
    target = test.comparisons[0]
    left, operator, right = test.left, target.operator, target.comparator
    if _is_rank(right) and not _is_rank(left):
        left, right = right, left
        flipped = {cst.LessThan: cst.GreaterThan, cst.GreaterThan: cst.LessThan}
        flipped.update({cst.LessThanEqual: cst.GreaterThanEqual, cst.GreaterThanEqual: cst.LessThanEqual})
        operator = flipped.get(type(operator), type(operator))()
    if not _is_rank(left):
        return None
    if isinstance(operator, (cst.In, cst.NotIn)):
        if not isinstance(right, (cst.Tuple, cst.List, cst.Set)):
            return None
        values = {_integer(e.value) for e in right.elements}
        if 0 not in values or not values <= {-1, 0}:
            return None
        return isinstance(operator, cst.In)
    bound = _integer(right)
    holds_at_zero = {
        cst.Equal: (bound == 0, True),
        cst.NotEqual: (bound == 0, False),
        cst.LessThanEqual: (bound == 0, True),
        cst.LessThan: (bound == 1, True),
        cst.GreaterThan: (bound == 0, False),
        cst.GreaterThanEqual: (bound == 1, False),
    }.get(type(operator))
    if holds_at_zero is None or not holds_at_zero[0]:
        return None
    return holds_at_zero[1]


def _exits(body: cst.BaseSuite) -> bool:
    """The block ends by leaving its enclosing block: ``return``, ``continue``, ``break`` or ``raise``."""
    statements = body.body
    last = statements[-1] if statements else None
    if isinstance(last, cst.SimpleStatementLine):
        last = last.body[-1] if last.body else None
    return isinstance(last, (cst.Return, cst.Continue, cst.Break, cst.Raise))


def _handing_call(facts: PythonFacts, name: cst.Name) -> tuple[cst.Call | None, bool]:
    """The call ``name`` is handed to as an argument, and whether that callee runs it on the main process only."""
    argument = facts.parent(name)
    call = facts.parent(argument) if isinstance(argument, cst.Arg) else None
    if isinstance(call, cst.Call) and argument.value is name:
        return call, _last_name(call.func) in MAIN_ONLY_DECORATORS
    return None, False


def _has_parameter(params: cst.Parameters, name: str) -> bool:
    star = [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return any(p.name.value == name for p in (*params.posonly_params, *params.params, *params.kwonly_params, *star))


def string_key(expr: cst.BaseExpression) -> str | None:
    """``"train"`` of ``loaders["train"]``."""
    if isinstance(expr, cst.Subscript) and len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        return string_value(expr.slice[0].slice.value)
    return None


def string_value(expr: cst.BaseExpression | None) -> str | None:
    """The text of a plain string literal (not bytes), else None."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None
