"""LD601 save-on-every-rank: a checkpoint or tokenizer written by every process of a distributed run."""

from __future__ import annotations

import libcst as cst

from lintdist.collectives import may_gather
from lintdist.edits import guarded_call, with_keyword_last
from lintdist.facts import argument_of
from lintdist.file_io import TORCH_SAVES, in_memory, per_item_path
from lintdist.model import Applicability, Fix, Severity
from lintdist.pretrained import pretrained_kind
from lintdist.rank_reads import every_rank_callers, reads_rank
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.spelling import main_process_test

SHARDED = frozenset({"FSDP", "DEEPSPEED"})
WHAT = {
    "model": "a model's `save_pretrained` (transformers < 5 writes on every process unless told otherwise)",
    "peft": "a PEFT model's `save_pretrained` (peft writes on every process unless `is_main_process=False`)",
    "other": "a tokenizer's, processor's or config's `save_pretrained`",
}


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
        if not self.loop.distributed and facts.project is None:
            return  # a module that sets up no processes is checked for the runs its callers elsewhere set up
        for call in facts.calls:
            if facts.callee_is(call, TORCH_SAVES):
                self._check_torch_save(call)
            elif facts.method_name(call) == "save_pretrained" and isinstance(call.func, cst.Attribute):
                self._check_save_pretrained(call)

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
        if accelerator is None:
            self.report(call, message + "; write it on rank 0 only", fix=self._guard_fix(call, obj))
            return
        fix = None
        if all(a.keyword is None or a.keyword.value in {"obj", "f"} for a in call.args) and len(call.args) <= 2:
            new = call.with_changes(func=cst.parse_expression(f"{accelerator}.save"))
            fix = Fix(
                Applicability.SAFE,
                f"Use `{accelerator}.save(...)`, which writes on the main process only",
                replacements=((call, new),),
            )
        message += f"; use `{accelerator}.save(obj, path)`, which writes on the main process only"
        self.report(call, message, fix=fix)

    def _check_save_pretrained(self, call: cst.Call) -> None:
        if any(a.keyword is not None and a.keyword.value == "is_main_process" for a in call.args):
            return
        path = argument_of(call, "save_directory", 0)
        evidence = self._every_rank(call)
        if evidence is None or (path is not None and self._local_target(path, call)):
            return
        kind = pretrained_kind(self.facts, call.func.value, call)
        if kind is None or (kind == "model" and self.versions.allows("transformers", "<5") is not True):
            return  # transformers 5 writes a model on global rank 0 only; unknown pins: not reported
        accelerator = self.facts.accelerator_at(call)
        if kind == "peft" and accelerator is not None:
            # peft gates every write on this argument; the call stays on every rank (its arguments may gather)
            new = with_keyword_last(call, "is_main_process", cst.parse_expression(f"{accelerator}.is_main_process"))
            fix = Fix(
                Applicability.SAFE,
                f"Pass `is_main_process={accelerator}.is_main_process`",
                replacements=((call, new),),
            )
        else:
            fix = self._guard_fix(call, argument_of(call, "state_dict", None), accelerator)
        test = f"{accelerator}.is_main_process" if accelerator else "rank 0"
        remedy = f"call it under `if {test}:`"
        if kind != "other":
            remedy = f"pass `is_main_process={test}`" if accelerator else f"pass `is_main_process=` (true on {test})"
            if kind == "model":
                remedy += " and `save_function=accelerator.save`, or " + f"call it under `if {test}:`"
        what = WHAT[kind]
        self.report(
            call,
            f"{what[0].upper()}{what[1:]} runs on every process{evidence}: they all write the same files at once; "
            f"{remedy}",
            fix=fix,
        )

    def _every_rank(self, call: cst.Call) -> str | None:
        """None unless every process of a distributed run reaches ``call``; else what a message adds as evidence:
        nothing where this module sets the run up, the callers' places where another module does (a helper)."""
        callers = every_rank_callers(self.facts, call)
        if not callers:
            return None if callers is None else ""
        places = ", ".join(other.where(site) for other, site in callers)
        return f" (reached on every rank from {places}, a run of several processes)"

    def _local_target(self, path: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """A per-rank file (the path reads the rank), one file per item of a loop, or an in-memory buffer."""
        facts = self.facts
        return reads_rank(facts, path, at) or per_item_path(facts, self.loop, path, at) or in_memory(facts, path, at)

    def _guard_fix(self, call: cst.Call, saved: cst.CSTNode | None, accelerator: str | None = None) -> Fix | None:
        """Put the call's line under a main-process test, when nothing in it is collective."""
        facts = self.facts
        sharded = self.loop.backend in SHARDED
        if sharded or may_gather(facts, call, False) or may_gather(facts, saved, False):
            return None
        test = main_process_test(facts, call, accelerator)
        wrapped = guarded_call(facts, call, test) if test is not None else None
        if wrapped is None:
            return None
        return Fix(Applicability.SAFE, f"Run it under `if {test}:`", replacements=(wrapped,))
