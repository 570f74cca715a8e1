"""LD410 all-gather-uneven-shapes: gathering `generate` outputs or mask-selected elements, whose length differs per
rank, without padding."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of
from lintdist.literals import is_name
from lintdist.model import Severity
from lintdist.per_rank_shapes import is_generate, per_rank_source
from lintdist.rule import Invalid, Pattern, Rule, Valid

TORCH_GATHERS = frozenset(
    {
        "torch.distributed.all_gather",
        "torch.distributed.all_gather_into_tensor",
        "torch.distributed.distributed_c10d.all_gather",
        "torch.distributed.distributed_c10d.all_gather_into_tensor",
    }
)
ACCELERATE_GATHERS = frozenset({"accelerate.utils.gather", "accelerate.utils.operations.gather"})


class AllGatherUnevenShapes(Rule):
    """
    ## What it does
    Reports an all-gather of the sequences `generate` returned, not padded
    to a common length first: `accelerator.gather(x)`,
    `accelerator.gather_for_metrics(x)` (also inside a tuple, as in
    `gather_for_metrics((tokens, labels))`), `accelerate.utils.gather(x)`,
    `torch.distributed.all_gather(out, x)` and `all_gather_into_tensor(out,
    x)`, where `x` is the output of a `generate(...)` call (through names,
    slices such as `out[:, prompt_len:]`, `.sequences` and same-shape
    methods such as `.cpu()`) and no assignment from `pad_across_processes`
    stands between them. Not reported: a value padded with
    `accelerator.pad_across_processes(x, dim=1, ...)` on every path,
    `gather_for_metrics(..., use_gather_object=True)` and
    `gather_object`/`all_gather_object` (they pickle any shape), a
    `generate` with `min_new_tokens` equal to `max_new_tokens`, and values
    lintdist cannot follow (a parameter, a helper's result). The
    `min_new_tokens == max_new_tokens` case is left out although the prompts'
    padding can still differ per rank: lintdist cannot tell. Also reported:
    the same gathers of the elements a boolean mask selects
    (`x[mask.bool()]`, `torch.masked_select(x, mask)`), whose number is
    the mask's count of `True` on each rank. Model outputs whose sequence
    dimension follows each rank's own batch padding (multi-vector
    embeddings) are not reported: nothing in the code tells them from
    pooled `[batch, dim]` embeddings, which gather fine.

    ## Why is this bad?
    `generate` stops when this rank's sequences are done and pads its
    prompts to this rank's longest, so the output's length differs from rank
    to rank. An all-gather needs the same shape on every rank: accelerate
    1.15's `gather` sizes the output from the local tensor (`_gpu_gather`:
    `torch.empty(num_processes * tensor.numel())`, or `empty_like` per rank
    under gloo) and checks shapes only in debug mode. With NCCL the job
    hangs or returns silently wrong data; with gloo a rank aborts ("Received
    data size doesn't match expected size") while another gets garbage.

    ## Example
    ```python
    tokens = accelerator.unwrap_model(model).generate(**batch, max_new_tokens=64)
    tokens, labels = accelerator.gather_for_metrics((tokens, batch["labels"]))
    ```

    ## Use instead
    ```python
    tokens = accelerator.unwrap_model(model).generate(**batch, max_new_tokens=64)
    tokens = accelerator.pad_across_processes(tokens, dim=1, pad_index=tokenizer.pad_token_id)
    tokens, labels = accelerator.gather_for_metrics((tokens, batch["labels"]))
    ```

    ## Fix safety
    No automatic fix: the padding value must be chosen (the tokenizer's pad
    id for tokens, -100 for labels the metric ignores), and whatever reads
    the gathered tensor must skip it.

    ## References
    - accelerate 1.15 `accelerate/utils/operations.py::_gpu_gather` (output sized from the local tensor),
      `::verify_operation` (shape check only when `PartialState().debug`) and `::pad_across_processes`
    - torch 2.13 `torch/distributed/distributed_c10d.py::all_gather` ("tensor_list ... should contain
      correctly-sized tensors") and `::all_gather_into_tensor` (output = world size x input)
    - https://github.com/huggingface/accelerate/issues/167: gathering per-batch padded predictions gets stuck;
      the maintainer: "There is a `pad_across_processes` method you can use for this"
    - https://github.com/Lightning-AI/pytorch-lightning/issues/7773: `all_gather` of tensors of different
      sizes on different devices freezes the run
    - https://github.com/NVIDIA/nccl/issues/1417: the NCCL maintainer: it may hang as soon as the sizes differ,
      and some data will be incorrect
    - https://github.com/huggingface/trl/pull/3964: GRPO's entropy masking hangs on several GPUs because
      `accelerator.gather(entropies[mask.bool()])` gathers tensors of different lengths; fixed by padding first
    - Proof: tests/proofs/test_ld410_uneven_gather.py (gloo, 2 ranks): gathering generated sequences of
      lengths 4 and 7 with accelerate fails; padded with `pad_across_processes` first, every rank gets both
    """

    code = "LD410"
    name = "all-gather-uneven-shapes"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "none"
    triggers = ("generate(", ".bool()]", "masked_select(")
    # a gather across processes: torch's, or accelerate's (`torch.gather` and `x.gather(dim, index)` are tensor ops)
    also_triggers = (
        (
            "all_gather",
            "gather_for_metrics",
            Pattern(
                ("gather",),
                re.compile(r"accelerat\w*\.gather\(|accelerate\.utils\.gather\(|from accelerate\.utils import[^\n]*\bgather\b"),
            ),
        ),
    )

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
tokens = accelerator.unwrap_model(model).generate(**batch, max_new_tokens=64)
tokens = accelerator.pad_across_processes(tokens, dim=1, pad_index=tokenizer.pad_token_id)
tokens, labels = accelerator.gather_for_metrics((tokens, batch["labels"]))
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
tokens = model.generate(**batch, max_new_tokens=64)
texts = accelerator.gather_for_metrics(tokens, use_gather_object=True)
fixed = model.generate(**batch, min_new_tokens=16, max_new_tokens=16)
accelerator.gather(fixed)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
tokens = accelerator.unwrap_model(model).generate(**batch, max_new_tokens=64)
tokens, labels = accelerator.gather_for_metrics((tokens, batch["labels"]))
""",
            lines=(5,),
        ),
        Invalid(
            """\
import torch
import torch.distributed as dist

out = model.generate(input_ids, max_new_tokens=32)[:, input_ids.shape[1]:]
gathered = [torch.zeros_like(out) for _ in range(dist.get_world_size())]
dist.all_gather(gathered, out)
""",
            lines=(6,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
kept = token_losses[response_mask.bool()].float()
everyone = accelerator.gather(kept)
cutoff = torch.quantile(everyone, 0.9)
""",
            lines=(5,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            gathered = self._gathered(call)
            if gathered is None:
                continue
            elements = gathered.elements if isinstance(gathered, (cst.Tuple, cst.List)) else ()
            values = [e.value for e in elements] or [gathered]
            for value in values:
                source = per_rank_source(facts, value, call)
                if source is not None and not (is_generate(facts, source) and _fixed_length(source)):
                    self._report(call, value, source)
                    break

    def _gathered(self, call: cst.Call) -> cst.BaseExpression | None:
        """The tensor an all-gather gathers (its argument), or None for any other call."""
        facts = self.facts
        method = facts.method_name(call)
        if method not in {"gather", "gather_for_metrics", "all_gather", "all_gather_into_tensor"}:
            return None
        if method.startswith("all_gather"):
            return (
                argument_of(call, "tensor" if method == "all_gather" else "input_tensor", 1)
                if facts.callee_is(call, TORCH_GATHERS)
                else None
            )
        if method == "gather_for_metrics":
            by_object = argument_of(call, "use_gather_object", 1)
            if by_object is not None and not is_name(by_object, "False"):
                return None
        receiver = call.func.value if isinstance(call.func, cst.Attribute) else None
        accelerate = (receiver is not None and facts.accelerator_like(receiver, call)) or facts.callee_is(
            call, ACCELERATE_GATHERS
        )
        return argument_of(call, "tensor" if method == "gather" else "input_data", 0) if accelerate else None

    def _report(self, call: cst.Call, value: cst.BaseExpression, source: cst.CSTNode) -> None:
        shown = cst.Module([]).code_for_node(value)
        callee = get_full_name_for_node(call.func) or "the gather"
        line = self.context.span(source).line
        generated = is_generate(self.facts, source)
        if generated:
            what = (
                f"the output of `generate` (line {line}), whose length differs per rank (each rank stops at its own "
                "EOS and pads its prompts to its own longest)"
            )
        else:
            what = f"the elements a boolean mask selects (line {line}), as many as the mask has `True` on each rank"
        message = (
            f"`{callee}()` gathers `{shown}`, {what}: an all-gather needs the same shape on every rank, so the job "
            "hangs or gathers wrong data; "
        )
        if (self.facts.method_name(call) or "").startswith("all_gather"):
            message += "all-gather the lengths first and pad to the longest, or use `dist.all_gather_object`"
        else:
            dim, pad = ("1", "tokenizer.pad_token_id") if generated else ("0", "<a value it never holds>")
            message += f"pad it first: `accelerator.pad_across_processes({shown}, dim={dim}, pad_index={pad})`"
        self.report(call, message)


def _fixed_length(generate: cst.Call) -> bool:
    """``generate(..., min_new_tokens=n, max_new_tokens=n)``: every rank makes the same number of tokens."""
    given = {a.keyword.value: a.value for a in generate.args if a.keyword is not None}  # also after `**batch`
    low, high = given.get("min_new_tokens"), given.get("max_new_tokens")
    module = cst.Module([])
    return low is not None and high is not None and module.code_for_node(low) == module.code_for_node(high)
