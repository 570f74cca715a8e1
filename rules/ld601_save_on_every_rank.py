"""LD601 save-on-every-rank: a checkpoint or tokenizer written by every process of a distributed run."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.edits import with_keyword_last
from lintdist.facts import DATALOADER_CLASSES, RANK_GETTERS, RANK_NAMES, PythonFacts, argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid

TORCH_SAVES = frozenset({"torch.save", "torch.serialization.save"})
BUFFERS = frozenset({"io.BytesIO", "io.StringIO"})
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
# Parts of a class name (or, failing an origin, of a variable's name) that say it is not a model: its
# `save_pretrained` writes on every process in every transformers version.
NON_MODEL_PARTS = ("tokenizer", "processor", "config", "featureextractor", "feature_extractor")
# Calls in a saved expression that make it a collective somewhere (gathers, sharded state dicts): such a save
# must stay on every rank, so it is never put under a rank test.
GATHERING_METHODS = frozenset(
    {
        "get_state_dict",
        "gather",
        "gather_for_metrics",
        "gather_object",
        "reduce",
        "all_gather",
        "all_reduce",
        "broadcast",
        "full_optim_state_dict",
        "optim_state_dict",
        "sharded_optim_state_dict",
        "get_model_state_dict",
        "get_optimizer_state_dict",
        "wait_for_everyone",
    }
)
SHARDED = frozenset({"FSDP", "DEEPSPEED"})


# -- helpers shared with LD602 --------------------------------------------------------------------


def code_of(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def mentions_rank(facts: PythonFacts, expr: cst.BaseExpression | None, at: cst.CSTNode, depth: int = 0) -> bool:
    """``expr`` reads the process's rank: a rank name, a rank getter, ``"RANK"``, or a name bound to such."""
    if expr is None:
        return False
    for node in [expr, *facts.within(expr, cst.Name, cst.Attribute, cst.Call, cst.SimpleString)]:
        if isinstance(node, cst.Name) and node.value in RANK_NAMES:
            return True
        if isinstance(node, cst.Attribute) and node.attr.value in RANK_NAMES:
            return True
        if isinstance(node, cst.Call) and facts.method_name(node) in RANK_GETTERS:
            return True
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in RANK_GETTERS:
            return True
        if isinstance(node, cst.SimpleString) and "RANK" in node.value:
            return True
    if depth < 2:
        names = {id(n): n for n in [expr, *facts.within(expr, cst.Name)] if isinstance(n, cst.Name)}
        for name in names.values():
            for binding in facts.bindings(name.value, at):
                if binding.value is not expr and mentions_rank(facts, binding.value, binding.statement, depth + 1):
                    return True
    return False


def rank_tested(facts: PythonFacts, node: cst.CSTNode, depth: int = 0) -> bool:
    """An ``if`` whose test reads the rank in a way ``facts.rank_guard`` does not parse (``args.rank % ngpus == 0``)
    stands around ``node``, or around every call of its function in this file."""
    child = node
    for ancestor in facts.ancestors(node):
        if (
            isinstance(ancestor, (cst.If, cst.While))
            and child is not ancestor.test
            and mentions_rank(facts, ancestor.test, ancestor, depth=2)
        ):
            return True
        if isinstance(ancestor, cst.FunctionDef):
            sites = facts.call_sites(ancestor)
            return depth < 3 and bool(sites) and all(rank_tested(facts, site, depth + 1) for site in sites)
        child = ancestor
    return False


def gathers(rule: Rule, expr: cst.CSTNode | None) -> bool:
    """``expr`` calls something that is collective under some backend."""
    if expr is None:
        return False
    facts = rule.facts
    for call in facts.within(expr, cst.Call) + ([expr] if isinstance(expr, cst.Call) else []):
        name = facts.method_name(call) or (call.func.value if isinstance(call.func, cst.Name) else None)
        if name in GATHERING_METHODS:
            return True
        if name == "state_dict" and (rule.loop.backend in SHARDED or _fsdp_wrapped(rule)):
            return True
    return False


def _fsdp_wrapped(rule: Rule) -> bool:
    facts = rule.facts
    return any(
        any("FullyShardedDataParallel" in q or "fully_shard" in q for q in facts.qualified_names(call.func))
        for call in facts.wrapped_models()
    )


def guarded_statement(statement: cst.SimpleStatementLine, test: str) -> cst.If:
    """``statement`` under ``if <test>:``, its comments and blank lines kept in front of the ``if``."""
    return cst.If(
        test=cst.parse_expression(test),
        body=cst.IndentedBlock(body=[statement.with_changes(leading_lines=())]),
        leading_lines=statement.leading_lines,
    )


def lone_statement(facts, call: cst.Call) -> cst.SimpleStatementLine | None:
    """The line ``call`` is the whole of (``torch.save(...)`` alone on its line, in an indented block)."""
    expr = facts.parent(call)
    line = facts.parent(expr) if isinstance(expr, cst.Expr) else None
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    if not isinstance(facts.parent(line), (cst.IndentedBlock, cst.Module)):
        return None
    return line


# -- the rule -------------------------------------------------------------------------------------


class SaveOnEveryRank(Rule):
    """
    ## What it does
    Reports a `torch.save(...)`, or a tokenizer's, processor's or config's
    `save_pretrained(...)`, that every process of a distributed script
    reaches: no `if accelerator.is_main_process:`/`if rank == 0:` guard
    around it, no earlier `if not accelerator.is_main_process: return`, no
    `@accelerator.on_main_process` decorator, and no caller (in this module or
    another of the project) that calls it under such a guard. The script is
    distributed when it builds an `Accelerator`, wraps a model in DDP/FSDP or
    starts a process group, and its launch does not run one process.

    A helper module that does none of this itself (a `checkpoint.py` with
    `save_checkpoint(model, ..., args)`) is checked for the runs of its
    callers: the save is reported when every call of it in the project, and
    of the functions that lead to it, reaches it on every rank and at least
    one of those calls sits in a module that sets up processes; the message
    names those calls (`reached on every rank from main.py:194`). The helper
    module must read `torch.distributed` (or mention a wrapper), or the
    pre-filter does not open it.

    A model's `save_pretrained` is reported only when the project pins
    transformers below 5: from transformers 5 on, `PreTrainedModel.save_pretrained`
    writes only on global rank 0 when `torch.distributed` is initialized
    (`should_save_on_this_rank`). A PEFT model's `save_pretrained`
    (`get_peft_model(...)`, `PeftModel.from_pretrained(...)`) is reported in
    any version: peft checks only its `is_main_process` argument.

    Not reported: a save in a function handed to a `register_*` call (an
    accelerate `register_save_state_pre_hook` hook: whoever calls
    `save_state` decides which ranks run it), a save under an `if` whose test
    reads the rank in a form the guard analysis does not parse
    (`args.rank % ngpus_per_node == 0`, here or around a caller), a save in a loop over items whose
    path reads the loop variable (one file per item, not per step or batch),
    a file whose path reads the rank (`f"ckpt_rank{rank}.pt"`),
    a save into an in-memory buffer (`io.BytesIO()`), `save_pretrained(...,
    is_main_process=...)`, `accelerator.save`, `accelerator.save_state`,
    `dcp.save` (collective by design) and a DeepSpeed engine's
    `save_checkpoint`.

    ## Why is this bad?
    Every process writes the same file at the same time. On a shared file
    system the writes race: a reader can see a truncated or interleaved
    checkpoint, `torch.load` fails with "PytorchStreamReader failed reading
    zip archive", and the run spends N times the I/O. Every rank also pays
    the serialization time.

    ## Example
    ```python
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    ...
    torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    tokenizer.save_pretrained(output_dir)
    ```

    ## Use instead
    ```python
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    ...
    accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    if accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)
    ```
    `accelerator.save(obj, path)` evaluates `obj` on every rank (as before)
    and writes it on the main process only (once per node with
    `ProjectConfiguration(save_on_each_node=True)`).

    ## Fix safety
    The fix is safe. A PEFT model's save gets
    `is_main_process=accelerator.is_main_process` (the call stays on every
    rank, so a `state_dict=accelerator.get_state_dict(model)` argument still
    gathers everywhere). With an `Accelerator` in scope, `torch.save(obj, path)`
    becomes `accelerator.save(obj, path)` (only when no other argument is
    given: `accelerator.save` takes no `pickle_protocol`); the other saves are
    put under `if accelerator.is_main_process:` (raw `torch.distributed`:
    `if not dist.is_initialized() or dist.get_rank() == 0:`), which is
    offered only when the saved expression contains nothing that is
    collective under some backend (`get_state_dict`, a gather, a sharded
    `state_dict()`): the other ranks would then skip it and hang the main
    process. Only the other processes' redundant writes disappear; code on
    another rank (or node, without a shared file system) that reads the file
    right after writing it would now need to wait for the main process.

    ## References
    - accelerate `Accelerator.save` and `accelerate.utils.save`
      (`if PartialState().is_main_process and not save_on_each_node`)
    - transformers 5.24 `distributed/mixin.py::should_save_on_this_rank`,
      called by `PreTrainedModel.save_pretrained`
    - peft `PeftModel.save_pretrained` (`if is_main_process and safe_serialization:`)
    - kakaobrain/scrl issue #5: `checkpoint_best.pth` corrupted by several
      processes writing it at once (fixed with a main-process test)
    - meta-llama/llama-cookbook issue #198: a PEFT `save_pretrained` called on
      every rank leaves a corrupted `adapter_model.bin` most epochs
    - cybertronai/imagenet18_old issue #16: workers clobber each other's
      checkpoints
    - OpenGVLab/efficient-video-recognition issue #18: `save_checkpoint` in
      `checkpoint.py` saves on every rank, called from `main.py`'s DDP loop
    """

    code = "LD601"
    name = "save-on-every-rank"
    severity = Severity.WARNING
    needs_several_processes = True
    fix_kind = "safe"
    # `torch.save(`/`save(` from torch, `.save_pretrained(`: both need a distributed marker too
    triggers = (Pattern(("save(", "save_pretrained("), None),)
    # `torch.distributed`: a helper module that reads it may run in the distributed run of its callers (the word
    # "distributed" alone is in the docstrings of most library modules)
    also_triggers = (
        (
            "Accelerator(",
            "DistributedDataParallel",
            "init_process_group",
            "DDP(",
            "fully_shard",
            "torch.distributed",
            "torch import distributed",
        ),
    )

    VALID = (
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
if accelerator.is_main_process:
    torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
    tokenizer.save_pretrained("out")
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.save(shard, f"ckpt_rank{rank}.pt")
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

accelerator = Accelerator()
model = AutoModelForCausalLM.from_pretrained("gpt2")
model = accelerator.prepare(model)
accelerator.unwrap_model(model).save_pretrained("out")
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
torch.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
""",
            lines=(6,),
            fixed="""\
import torch
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
accelerator.save(accelerator.unwrap_model(model).state_dict(), "model.pt")
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
from transformers import AutoTokenizer

accelerator = Accelerator()
tokenizer = AutoTokenizer.from_pretrained("gpt2")
# keep the vocabulary next to the weights
tokenizer.save_pretrained("out")
""",
            lines=(7,),
            fixed="""\
from accelerate import Accelerator
from transformers import AutoTokenizer

accelerator = Accelerator()
tokenizer = AutoTokenizer.from_pretrained("gpt2")
# keep the vocabulary next to the weights
if accelerator.is_main_process:
    tokenizer.save_pretrained("out")
""",
        ),
        Invalid(
            """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.save({"step": step}, "state.pt")
""",
            lines=(5,),
            fixed="""\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if not dist.is_initialized() or dist.get_rank() == 0:
    torch.save({"step": step}, "state.pt")
""",
        ),
        Invalid(
            """\
import torch

torch.distributed.init_process_group("gloo")
torch.save({"step": step}, "state.pt")
""",
            lines=(4,),
            fixed="""\
import torch

torch.distributed.init_process_group("gloo")
if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
    torch.save({"step": step}, "state.pt")
""",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        loop = self.loop
        if not loop.distributed and facts.project is None:
            return  # a module that sets up no processes is checked for the runs its callers elsewhere set up
        for call in facts.calls:
            if facts.callee_is(call, TORCH_SAVES):
                self._check_torch_save(call)
            elif facts.method_name(call) == "save_pretrained" and isinstance(call.func, cst.Attribute):
                self._check_save_pretrained(call)

    # -- torch.save -------------------------------------------------------------------------

    def _check_torch_save(self, call: cst.Call) -> None:
        obj = argument_of(call, "obj", 0)
        path = argument_of(call, "f", 1)
        if obj is None or path is None:
            return
        evidence = self._every_rank(call)
        if evidence is None or self._local_target(path, call):
            return
        message = f"`torch.save` runs on every process{evidence}: they all write the same file at once"
        accelerator = self.facts.accelerator_at(call)
        fix = None
        if accelerator is not None:
            extra = [a for a in call.args if a.keyword is not None and a.keyword.value not in {"obj", "f"}]
            positional = [a for a in call.args if a.keyword is None]
            if not extra and len(positional) <= 2 and not any(a.star for a in call.args):
                new = call.with_changes(func=cst.parse_expression(f"{accelerator}.save"))
                fix = Fix(
                    Applicability.SAFE,
                    f"Use `{accelerator}.save(...)`, which writes on the main process only",
                    replacements=((call, new),),
                )
            message += f"; use `{accelerator}.save(obj, path)`, which writes on the main process only"
        else:
            fix = self._guard_fix(call, obj)
            message += "; write it on rank 0 only"
        self.report(call, message, fix=fix)

    # -- save_pretrained --------------------------------------------------------------------

    def _check_save_pretrained(self, call: cst.Call) -> None:
        if any(a.keyword is not None and a.keyword.value == "is_main_process" for a in call.args):
            return
        path = argument_of(call, "save_directory", 0)
        evidence = self._every_rank(call)
        if evidence is None or (path is not None and self._local_target(path, call)):
            return
        receiver = call.func.value
        kind = self._kind(receiver, call)
        if kind == "model":
            if self.versions.allows("transformers", "<5") is not True:
                return  # transformers 5 writes a model on global rank 0 only; unknown pins: not reported
            what = "a model's `save_pretrained` (transformers < 5 writes on every process unless told otherwise)"
        elif kind == "peft":
            what = "a PEFT model's `save_pretrained` (peft writes on every process unless `is_main_process=False`)"
        elif kind == "other":
            what = "a tokenizer's, processor's or config's `save_pretrained`"
        else:
            return
        accelerator = self.facts.accelerator_at(call)
        state_dict = argument_of(call, "state_dict", None)
        if kind == "peft" and accelerator is not None:
            # peft gates every write on this argument; the call stays on every rank (its arguments may gather)
            new = with_keyword_last(call, "is_main_process", cst.parse_expression(f"{accelerator}.is_main_process"))
            fix = Fix(
                Applicability.SAFE,
                f"Pass `is_main_process={accelerator}.is_main_process`",
                replacements=((call, new),),
            )
        else:
            fix = self._guard_fix(call, state_dict, accelerator)
        test = f"{accelerator}.is_main_process" if accelerator else "rank 0"
        remedy = f"call it under `if {test}:`"
        if kind != "other":
            remedy = f"pass `is_main_process={test}`" if accelerator else f"pass `is_main_process=` (true on {test})"
            if kind == "model":
                remedy += " and `save_function=accelerator.save`, or " + f"call it under `if {test}:`"
        self.report(
            call,
            f"{what[0].upper()}{what[1:]} runs on every process{evidence}: they all write the same files at once; "
            f"{remedy}",
            fix=fix,
        )

    def _kind(self, receiver: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> str | None:
        """ "other" (tokenizer, processor, config), "peft", "model", or None when nothing says."""
        facts = self.facts
        if isinstance(receiver, cst.Call) and facts.method_name(receiver) == "unwrap_model" and receiver.args:
            return self._kind(receiver.args[0].value, at, depth + 1)
        found = None
        for origin in facts.origins(receiver, at):
            node = origin.node
            if not isinstance(node, cst.Call):
                continue
            if facts.method_name(node) == "unwrap_model" and node.args and depth < 2:
                inner = self._kind(node.args[0].value, node, depth + 1)
                if inner is not None:
                    found = found or inner
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
        if "peft" in last:
            return "peft"
        return None  # a model of unknown library (diffusers, timm...) or an unknown object: not reported

    # -- shared -----------------------------------------------------------------------------

    def _every_rank(self, call: cst.Call) -> str | None:
        """None unless every process of a distributed run reaches ``call``; else what a message adds as evidence:
        nothing where this module sets the run up, the callers' places where another module does (a helper)."""
        facts = self.facts
        function = facts.enclosing_function(call)
        if function is not None and self._registered(function):
            return None  # a hook (`register_save_state_pre_hook(fn)`): its caller decides which ranks run it
        reach = facts.all_ranks_reach(call, some_path=True)
        if reach.value is not True or rank_tested(facts, call):
            return None
        if self.loop.distributed:
            return ""
        callers = reach.from_distributed_callers
        if not callers or any(rank_tested(other, site) for other, site in reach.through):
            return None  # no caller sets up processes, or one tests the rank in a way the facts do not parse
        places = ", ".join(other.where(site) for other, site in callers)
        return f" (reached on every rank from {places}, a run of several processes)"

    def _registered(self, function: cst.FunctionDef) -> bool:
        facts = self.facts
        name = function.name.value
        for call in facts.calls:
            method = facts.method_name(call) or ""
            if method.startswith("register_") and any(
                isinstance(a.value, cst.Name) and a.value.value == name for a in call.args
            ):
                return True
        return False

    def _loader(self, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
        facts = self.facts
        if "loader" in (get_full_name_for_node(expr) or "").lower():
            return True
        return any(
            isinstance(o.node, cst.Call)
            and (facts.callee_is(o.node, DATALOADER_CLASSES) or self.loop.is_accelerate_prepare(o.node))
            for o in facts.origins(expr, at)
        )

    def _per_item(self, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """The path reads the variable of an enclosing loop over items that are not steps or batches
        (``for image_path in image_paths:``): each item gets its own file, so ranks do not write the same one."""
        facts = self.facts
        reads = {n.value for n in facts.within(path, cst.Name)} | (
            {path.value} if isinstance(path, cst.Name) else set()
        )
        for name in list(reads):
            for binding in facts.bindings(name, at):
                reads |= {n.value for n in facts.within(binding.value, cst.Name)}
        for ancestor in facts.ancestors(at):
            if not isinstance(ancestor, cst.For):
                continue
            targets = {n.value for n in facts.within(ancestor.target, cst.Name)}
            if isinstance(ancestor.target, cst.Name):
                targets.add(ancestor.target.value)
            if not targets & reads:
                continue
            core = ancestor.iter
            while (
                isinstance(core, cst.Call)
                and core.args
                and ((get_full_name_for_node(core.func) or "").rsplit(".", 1)[-1] in {"enumerate", "tqdm", "iter"})
            ):
                core = core.args[0].value
            if isinstance(core, cst.Call) and (get_full_name_for_node(core.func) or "") in {"range", "trange"}:
                continue
            if self._loader(core, ancestor):
                continue
            return True
        return False

    def _local_target(self, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """A per-rank file (the path reads the rank) or an in-memory buffer."""
        if mentions_rank(self.facts, path, at) or self._per_item(path, at):
            return True
        facts = self.facts
        return any(isinstance(o.node, cst.Call) and facts.callee_is(o.node, BUFFERS) for o in facts.origins(path, at))

    def _guard_fix(self, call: cst.Call, saved: cst.CSTNode | None, accelerator: str | None = None) -> Fix | None:
        """Put the call's line under a main-process test, when nothing in it is collective."""
        facts = self.facts
        line = lone_statement(facts, call)
        if line is None or gathers(self, call) or gathers(self, saved) or self.loop.backend in SHARDED:
            return None
        if accelerator is None:
            accelerator = self.facts.accelerator_at(call)
        if accelerator is not None:
            test = f"{accelerator}.is_main_process"
        else:
            alias = self.facts.distributed_at(call)
            if alias is None:
                return None
            test = f"not {alias}.is_initialized() or {alias}.get_rank() == 0"
        return Fix(
            Applicability.SAFE,
            f"Run it under `if {test}:`",
            replacements=((line, guarded_statement(line, test)),),
        )
