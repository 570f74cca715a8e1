"""LD304 context-parallel-label-shift: a causal LM shifts its labels per shard inside context parallelism."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from lintdist.batch_keys import key_quote, mentions_key
from lintdist.blocks import statement_before
from lintdist.edits import keyword_arg, replace_nodes, with_last_item
from lintdist.facts import string_key
from lintdist.labels import batch_holds, called_head, hands_labels, may_call_model, model_head
from lintdist.literals import is_name
from lintdist.loop import keyword
from lintdist.model import Applicability, Fix, Severity
from lintdist.model_outputs import loss_read_in
from lintdist.parallelism import (
    TORCH_CONTEXT_PARALLEL,
    Size,
    accelerator_configs,
    buffer_lists,
    context_parallel_call,
    parallelism_size,
    sequence_dim_like,
)
from lintdist.rule import Invalid, Rule, Valid
from lintdist.spelling import name_taken

# the modules a script's own `shift_labels` may come from: then the fix's import is already there
RUNTIME_MODULES = frozenset({"lintdist.runtime", "lintdist.runtime.tokens"})


# -- the rule ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Site:
    """A causal-LM call inside a context-parallel block."""

    call: cst.Call
    block: cst.With
    context: cst.Call  # the maybe_context_parallel(...) / context_parallel(...) call
    labels: cst.BaseExpression | None  # the `labels=` argument, or None for `**batch`
    batch: cst.BaseExpression | None  # the `**batch` mapping


class ContextParallelLabelShift(Rule):
    """
    ## What it does
    Reports a causal language model called with `labels` (`labels=...`, or
    `**batch` where the batch holds `"labels"`) inside
    `with accelerator.maybe_context_parallel(...)` (or torch's
    `context_parallel(...)`) without `shift_labels`, when context parallelism
    is on: `ParallelismConfig(cp_size=k)` with `k > 1` in the script, or
    `parallelism_config_cp_size` in the accelerate config or launch flags that
    run it. When the size is an expression (`cp_size=args.cp_size`) it is a
    warning: the code is wrong whenever it runs with CP.

    ## Why is this bad?
    Context parallelism shards `input_ids`, `labels` and the other `buffers`
    along the sequence before the forward pass, so each rank holds a piece of
    every sequence. A transformers causal LM (`ForCausalLMLoss`) shifts the
    labels it is given by one position and pads the end with -100. Shifted per
    shard, the last position of every shard loses its target (k-1 targets per
    sequence), and with torch's default head-tail load balancing (each rank
    holds chunks `r` and `2k-1-r`) the two chunks are joined, so k-1 more
    positions are scored against a token from another part of the sequence.
    The loss and gradients are silently wrong. The model uses `shift_labels`
    as they are when they are given (`labels` must still be passed: the loss is
    computed only when it is not None), so shifting once, before sharding,
    and sharding the result with the other buffers gives the unsharded loss.
    This is what accelerate's `nd_parallel.py` example and transformers'
    `Trainer` do. A model whose head does not shift (sequence-to-sequence,
    masked LM, token classification) is not reported.

    ## Example
    ```python
    accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=4))
    for batch in loader:
        with accelerator.maybe_context_parallel(
            buffers=[batch["input_ids"], batch["labels"]], buffer_seq_dims=[1, 1]
        ):
            loss = model(**batch).loss
            accelerator.backward(loss)
    ```

    ## Use instead
    ```python
    from lintdist.runtime import shift_labels

    accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=4))
    for batch in loader:
        batch["shift_labels"] = shift_labels(batch["labels"])
        with accelerator.maybe_context_parallel(
            buffers=[batch["input_ids"], batch["labels"], batch["shift_labels"]], buffer_seq_dims=[1, 1, 1]
        ):
            loss = model(**batch).loss
            accelerator.backward(loss)
    ```

    ## Fix safety
    Unsafe (`--unsafe-fixes`): it changes the loss the script trains on (to
    the right one). It inserts `batch["shift_labels"] = shift_labels(batch["labels"])`
    (`lintdist.runtime.shift_labels` pads with -100 exactly as
    `ForCausalLMLoss` does) before the block, or `shifted_labels =
    shift_labels(labels)` and a `shift_labels=shifted_labels` argument for a
    call given `labels=labels`, and adds the shifted labels to `buffers`, to
    `buffer_seq_dims` (with the labels' sequence dimension) and to a literal
    `no_restore_buffers` set. It is offered only when `buffers` and
    `buffer_seq_dims` are list literals (in the call, or bound in the same
    block of statements before it), the context call is written in the
    `with` and the model call sits directly in the block; the report alone
    otherwise, and also for a model whose `forward` takes no `shift_labels`.

    ## References
    - transformers `loss/loss_utils.py::ForCausalLMLoss` (the shift, and `shift_labels` used as given)
    - accelerate `Accelerator.maybe_context_parallel` and `docs/source/concept_guides/context_parallelism.md`
    - accelerate `examples/torch_native_parallelism/nd_parallel.py`; transformers `Trainer._prepare_context_parallel_inputs`
    - torch `distributed/tensor/experimental/_context_parallel/_attention.py::context_parallel` and
      `_load_balancer.py::_HeadTailLoadBalancer`
    """

    code = "LD304"
    name = "context-parallel-label-shift"
    severity = Severity.ERROR
    fix_kind = "unsafe"
    triggers = ("maybe_context_parallel", "context_parallel(")

    VALID = (
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig
from lintdist.runtime import shift_labels

accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=4))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    batch["shift_labels"] = shift_labels(batch["labels"])
    buffers = [batch["input_ids"], batch["labels"], batch["shift_labels"]]
    with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1]):
        loss = model(**batch).loss
        accelerator.backward(loss)
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig

accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=8, cp_size=1))
for batch in loader:
    with accelerator.maybe_context_parallel(buffers=[batch["input_ids"], batch["labels"]], buffer_seq_dims=[1, 1]):
        loss = model(**batch).loss
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig
from transformers import AutoModelForSequenceClassification

model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=2))
model, loader = accelerator.prepare(model, loader)
for batch in loader:
    with accelerator.maybe_context_parallel(buffers=[batch["input_ids"]], buffer_seq_dims=[1]):
        loss = model(**batch).loss
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig

accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=4))
model, loader = accelerator.prepare(model, loader)
for batch in loader:
    with accelerator.maybe_context_parallel(buffers=[batch["input_ids"]], buffer_seq_dims=[1]):
        logits = model(**batch).logits
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator, ParallelismConfig

accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=4))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.maybe_context_parallel(
        buffers=[batch["input_ids"], batch["labels"]],
        buffer_seq_dims=[1, 1],
        no_restore_buffers={batch["input_ids"], batch["labels"]},
    ):
        loss = model(**batch).loss
        accelerator.backward(loss)
""",
            lines=(11,),
            unsafe_fixed="""\
from accelerate import Accelerator, ParallelismConfig
from lintdist.runtime import shift_labels

accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, cp_size=4))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    batch["shift_labels"] = shift_labels(batch["labels"])
    with accelerator.maybe_context_parallel(
        buffers=[batch["input_ids"], batch["labels"], batch["shift_labels"]],
        buffer_seq_dims=[1, 1, 1],
        no_restore_buffers={batch["input_ids"], batch["labels"], batch["shift_labels"]},
    ):
        loss = model(**batch).loss
        accelerator.backward(loss)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import ParallelismConfig


def train(model, loader, args):
    config = ParallelismConfig(dp_shard_size=args.dp, cp_size=args.cp)
    accelerator = Accelerator(parallelism_config=config)
    model, loader = accelerator.prepare(model, loader)
    for input_ids, labels in loader:
        buffers = [input_ids, labels]
        with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1]):
            out = model(input_ids=input_ids, labels=labels)
            accelerator.backward(out.loss)
""",
            lines=(12,),
            unsafe_fixed="""\
from accelerate import Accelerator
from accelerate.utils import ParallelismConfig
from lintdist.runtime import shift_labels


def train(model, loader, args):
    config = ParallelismConfig(dp_shard_size=args.dp, cp_size=args.cp)
    accelerator = Accelerator(parallelism_config=config)
    model, loader = accelerator.prepare(model, loader)
    for input_ids, labels in loader:
        shifted_labels = shift_labels(labels)
        buffers = [input_ids, labels, shifted_labels]
        with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1]):
            out = model(input_ids=input_ids, labels=labels, shift_labels=shifted_labels)
            accelerator.backward(out.loss)
""",
        ),
    )

    def finish(self) -> None:
        for site in self._sites().values():
            torch_cp = self.facts.callee_is(site.context, TORCH_CONTEXT_PARALLEL)
            configs = None if torch_cp else accelerator_configs(self.facts, site.context.func.value, site.context)
            size = parallelism_size(
                self.facts, self.context.settings, lambda n: self.context.span(n).line, "cp", configs
            )
            if not torch_cp and size is not None and size.value is not None and size.value <= 1:
                continue  # CP off: the accelerate context manager does nothing
            known = torch_cp or (size is not None and size.value is not None)
            self._report(site, size if not torch_cp else None, certain=known)

    # -- finding the calls ---------------------------------------------------------------------------

    def _sites(self) -> dict[int, _Site]:
        """The sites by their call, each once: a helper's model call reached from two blocks counts for the first."""
        facts = self.facts
        sites: dict[int, _Site] = {}
        for block in facts.index.nodes(cst.With):
            context = next(
                (c for i in block.items if (c := context_parallel_call(facts, i.item, block)) is not None), None
            )
            if context is None:
                continue
            for call in facts.reachable_calls(block.body):
                if id(call) not in sites and (site := self._site(call, block, context)) is not None:
                    sites[id(call)] = site
        return sites

    def _site(self, call: cst.Call, block: cst.With, context: cst.Call) -> _Site | None:
        facts = self.facts
        if not hands_labels(call) or keyword(call, "shift_labels") is not None or not may_call_model(facts, call):
            return None
        labels = keyword(call, "labels")
        batch = next((a.value for a in call.args if a.star == "**"), None)
        head = called_head(facts, call)
        if is_name(labels, "None") or (head is not None and not head.shifts):
            return None  # no labels, or a head that keeps its labels unshifted
        if labels is None:
            # the batch holds labels (the call's `.loss` is read: a transformers model computes one only from them)
            scope = facts.enclosing_function(call) or facts.index.module
            if not batch_holds(facts, call, batch, "labels") and not loss_read_in(facts, self.loop, call, scope):
                return None
            block_scope = facts.enclosing_function(block) or facts.index.module
            if batch_holds(facts, call, batch, "shift_labels") or any(
                mentions_key(facts, s, "shift_labels") for s in (scope, block_scope)
            ):
                return None
        return _Site(call, block, context, labels, batch)

    # -- reporting -----------------------------------------------------------------------------------

    def _report(self, site: _Site, size: Size | None, certain: bool) -> None:
        facts = self.facts
        code = facts.index.module.code_for_node
        head = model_head(facts, site.call.func, site.call)
        given = "`**" + code(site.batch) + "`" if site.labels is None else f"`labels={code(site.labels)}`"
        if size is None:
            why = "inside torch's `context_parallel`"
        elif size.value is None:
            why = f"inside `maybe_context_parallel`, when context parallelism is on ({size.where})"
        else:
            why = f"inside `maybe_context_parallel` with context parallelism on ({size.where})"
        lost = "k-1" if size is None or size.value is None else str(size.value - 1)
        if site.labels is None:
            shift = f'`{code(site.batch)}["shift_labels"] = shift_labels({code(site.batch)}["labels"])`'
        else:
            shift = f"`shift_labels({code(site.labels)})` passed as `shift_labels=`"
        message = (
            f"`{code(site.call.func)}(...)` gets {given} {why} and no `shift_labels`: the causal-LM loss shifts each "
            f"rank's shard of the labels on its own, so {lost} targets per sequence are lost at the shard boundaries "
            f"and, under torch's default head-tail load balancing, {lost} more are scored against the wrong token; "
            f"shift once before sharding ({shift}, from `lintdist.runtime`) and add the result to `buffers`"
        )
        fix = None
        direct = facts.enclosing_function(site.call) is facts.enclosing_function(site.block)  # not in a helper
        if head is not None and not head.takes_shift_labels:
            message += f" ({head.why_not})"
        elif direct and facts.is_within(site.call, site.block.body):
            fix = self._fix(site)
        self.report(site.call, message, fix=fix, severity=Severity.ERROR if certain else Severity.WARNING)

    # -- the fix -------------------------------------------------------------------------------------

    def _fix(self, site: _Site) -> Fix | None:
        facts = self.facts
        lists = buffer_lists(facts, site.context, site.block)
        if lists is None or name_taken(facts, "shift_labels", RUNTIME_MODULES):
            return None  # (a context made before the block, `with cp_context:`, would need its own edit)
        code = facts.index.module.code_for_node
        # what to compute, and what the call then needs
        if site.labels is None:
            quote = key_quote(facts, site.batch)
            labels_text = f"{code(site.batch)}[{quote}labels{quote}]"
            shifted_text = f"{code(site.batch)}[{quote}shift_labels{quote}]"
        elif string_key(site.labels) == "labels":
            labels_text = code(site.labels)
            quote = site.labels.slice[0].slice.value.quote
            shifted_text = f"{code(site.labels.value)}[{quote}shift_labels{quote}]"
        elif isinstance(site.labels, cst.Name):
            labels_text = site.labels.value
            shifted_text = "shifted_labels" if labels_text == "labels" else f"shifted_{labels_text}"
            if name_taken(facts, shifted_text):
                return None
        else:
            return None
        dim = sequence_dim_like(lists.buffers, lists.dims, labels_text, code)
        if dim is None:
            return None
        shifted = cst.parse_expression(shifted_text)
        inside, outside = [], []
        if site.labels is not None:
            inside.append((site.call, with_last_item(site.call, keyword_arg("shift_labels", shifted.deep_clone()))))
        for old, new in lists.adding(shifted, dim):
            (inside if facts.is_within(old, site.block) else outside).append((old, new))
        statement = cst.parse_statement(f"{shifted_text} = shift_labels({labels_text})\n")
        # the shift goes before the first statement that reads it: the buffers' binding, else the block
        first = lists.buffers_line if lists.buffers_line is not None else site.block
        replacements = [
            (old, statement_before(old, new, statement) if old is first else new)
            for old, new in [*outside, (site.block, replace_nodes(site.block, inside))]
        ]
        return Fix(
            Applicability.UNSAFE,
            "Shift the labels once before sharding and pass them as `shift_labels`, sharded with the other buffers",
            replacements=tuple(replacements),
            imports=(("lintdist.runtime", "shift_labels"),),
        )
