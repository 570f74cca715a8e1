"""LD111 labels-shifted-twice: labels shifted by hand, then shifted again by a transformers causal LM."""

from __future__ import annotations

import re

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import argument_of
from lintdist.labels import TRAINERS, Head, LabelFacts, Received, Shift, model_head
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.wrappers import forward_target

# Methods a Trainer subclass overrides when it computes the loss itself (then the labels may be used as they are).
OWN_LOSS_METHODS = frozenset({"compute_loss", "training_step"})
# Tensor methods the fix may repeat (`labels.to(device)` twice gives the same tensor twice).
PURE_METHODS = frozenset({"to", "cuda", "cpu", "long", "contiguous"})
# Fields of a model output that are not the loss.
OTHER_OUTPUT_FIELDS = frozenset(
    {"logits", "hidden_states", "attentions", "past_key_values", "last_hidden_state", "aux_loss", "router_logits"}
)


class LabelsShiftedTwice(Rule):
    """
    ## What it does
    Reports labels shifted by hand for next-token prediction (`labels =
    ids[:, 1:]`, `ids[..., 1:]` or `chunk[1:]`, with the inputs cut to
    `ids[:, :-1]` beside them) that reach a transformers causal LM as its
    `labels`: passed as `labels=`, or as the `"labels"` key of a `**batch`
    built in the loop, in a DataLoader's `collate_fn`, in a `.map(fn)`
    preprocessing function or in a Dataset's `__getitem__`, or handed to a
    `Trainer` by its `data_collator` or datasets. The model is an
    `AutoModelForCausalLM`, a `*ForCausalLM`/`*LMHeadModel` class or its
    `from_pretrained`/`from_config`, or a PEFT model wrapping one, possibly
    through `accelerator.prepare`, DDP, `torch.compile` or `.to()`. The
    report points at the subscript that shifts the labels and names the model
    call.

    ## Why is this bad?
    A transformers causal LM shifts `labels` itself. In transformers 5.23,
    `ForCausalLMLoss` pads `labels` with -100 and takes `labels[..., 1:]` as
    the targets of `logits` whenever it gets no `shift_labels`. Labels shifted
    by hand are shifted twice: position t is trained to predict token t + 2,
    not t + 1. Nothing fails and the loss still falls (the model learns
    something), so the run looks healthy while training the wrong objective,
    and generation from it is poor.

    Not reported: a loss computed by hand on the logits
    (`F.cross_entropy(logits[:, :-1]..., labels[:, 1:])` is the correct manual
    shift) or a model call whose `.loss` is never read; labels passed as
    `shift_labels=` (or a batch with a `shift_labels` key, the
    context-parallel recipe); seq2seq models (`*ForSeq2SeqLM`) and the
    `*ForCausalLM` decoders of encoder-decoder families (BART, Marian,
    Pegasus, Whisper, TrOCR...), whose forward does not shift; custom
    `nn.Module` models, subclasses that define their own `forward`, `Trainer`
    subclasses that override `compute_loss`, and models lintdist cannot
    trace (built in another file). Labels shifted in a `.map` step that a
    `DataCollatorForLanguageModeling` then replaces (it copies `input_ids`),
    or that TRL's `SFTTrainer` gets without a `data_collator`, are not
    reported either.

    ## Example
    ```python
    model = AutoModelForCausalLM.from_pretrained("gpt2")
    for batch in loader:
        ids = batch["input_ids"]
        outputs = model(input_ids=ids[:, :-1], labels=ids[:, 1:])
        accelerator.backward(outputs.loss)
    ```

    ## Use instead
    ```python
    model = AutoModelForCausalLM.from_pretrained("gpt2")
    for batch in loader:
        ids = batch["input_ids"]
        shifted = ids[:, 1:]
        outputs = model(input_ids=ids[:, :-1], labels=shifted, shift_labels=shifted.contiguous())
        accelerator.backward(outputs.loss)
    ```
    `ForCausalLMLoss` takes `shift_labels` as they are (and flattens them
    with `.view(-1)`, so they must be contiguous: a slice such as `ids[:, 1:]`
    is not); `labels` stays because the model computes a loss only when
    `labels` is not None. The other correct rewrite stops shifting:
    `model(input_ids=ids, labels=ids)` with padding set to -100 in the labels.
    It changes the sequence length by one token, so lintdist only names it.

    ## Fix safety
    Unsafe: the training objective changes (to the intended one), so losses
    and checkpoints are not comparable with earlier runs. Where the model call
    is visible, the fix adds `shift_labels=<the labels>.contiguous()` to it
    (for a `**batch` call, `shift_labels=batch["labels"].contiguous()`), to
    every call that receives those labels. In transformers 5.23
    `*ForCausalLM.forward` hands its `**kwargs` to `self.loss_function`, and
    PEFT's `PeftModelForCausalLM` and accelerate's and DDP's wrappers pass
    keywords through. There is no fix (a diagnostic only) for a `Trainer` (add
    a `shift_labels` key to the collator's batch: the Trainer passes it on and
    counts tokens with it), for a PEFT prompt-learning model (its virtual
    tokens make `shift_labels` too short), for the few heads whose forward
    takes no `**kwargs` (`BlipTextLMHeadModel`, `ClvpForCausalLM`), and for
    labels written as an expression the fix would have to evaluate twice.

    ## References
    - transformers `loss/loss_utils.py::ForCausalLMLoss` and
      `models/llama/modeling_llama.py::LlamaForCausalLM.forward` (5.23)
    - transformers `Trainer._get_num_items_in_batch` (reads `shift_labels`)
    - transformers issue #32944 and PR #44642; InternLM issue #318
    """

    code = "LD111"
    name = "labels-shifted-twice"
    severity = Severity.ERROR
    fix_kind = "unsafe"
    triggers = (Pattern(("1:]",)),)
    # the inputs' cut beside the shift, and a model this rule knows, named in the file (a PEFT model wraps one)
    # and an import of the libraries that build such models (a `>>> from transformers` docstring line is not one:
    # transformers' own modeling files, full of shifts and causal-LM names, are not parsed for this rule)
    also_triggers = (
        (":-1]",),
        ("labels",),
        ("ForCausalLM", "LMHeadModel"),
        (re.compile(r"(?m)^[ \t]*(?:from|import)[ \t]+(?:transformers|peft|trl)\b"),),
    )

    VALID = (
        Valid(
            """\
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("gpt2")
for batch in loader:
    ids = batch["input_ids"]
    logits = model(input_ids=ids[:, :-1]).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
    loss.backward()
"""
        ),
        Valid(
            """\
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("gpt2")
for batch in loader:
    ids = batch["input_ids"]
    labels = ids[:, 1:]
    loss = model(input_ids=ids[:, :-1], labels=labels, shift_labels=labels).loss
    loss.backward()
"""
        ),
        Valid(
            """\
from transformers import AutoModelForSeq2SeqLM

model = AutoModelForSeq2SeqLM.from_pretrained("t5-small")
for batch in loader:
    target = batch["labels"]
    loss = model(input_ids=batch["input_ids"], decoder_input_ids=target[:, :-1], labels=target[:, 1:]).loss
    loss.backward()
"""
        ),
        Valid(
            """\
from torch import nn


class TinyLM(nn.Module):
    def forward(self, input_ids, labels=None):
        ...


model = TinyLM()
for batch in loader:
    ids = batch["input_ids"]
    loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
"""
        ),
        Valid(
            """\
from my_project.models import load_model
from transformers import AutoModelForCausalLM

reference = AutoModelForCausalLM.from_pretrained("gpt2").eval()
model = load_model("checkpoints/last")  # built in another file: its head is unknown here
for batch in loader:
    ids = batch["input_ids"]
    loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
    loss.backward()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("gpt2")
for batch in loader:
    ids = batch["input_ids"]
    outputs = model(input_ids=ids[:, :-1], labels=ids[:, 1:])
    outputs.loss.backward()
""",
            lines=(6,),
            unsafe_fixed="""\
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("gpt2")
for batch in loader:
    ids = batch["input_ids"]
    outputs = model(input_ids=ids[:, :-1], labels=ids[:, 1:], shift_labels=ids[:, 1:].contiguous())
    outputs.loss.backward()
""",
        ),
        Invalid(
            """\
import torch
from torch.utils.data import DataLoader
from transformers import LlamaForCausalLM


def collate(rows):
    ids = torch.tensor([row["input_ids"] for row in rows])
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B")
loader = DataLoader(dataset, batch_size=8, collate_fn=collate)
for batch in loader:
    loss = model(
        **batch,
        use_cache=False,
    ).loss
    loss.backward()
""",
            lines=(8,),
            unsafe_fixed="""\
import torch
from torch.utils.data import DataLoader
from transformers import LlamaForCausalLM


def collate(rows):
    ids = torch.tensor([row["input_ids"] for row in rows])
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B")
loader = DataLoader(dataset, batch_size=8, collate_fn=collate)
for batch in loader:
    loss = model(
        **batch,
        use_cache=False,
        shift_labels=batch["labels"].contiguous(),
    ).loss
    loss.backward()
""",
        ),
        Invalid(
            """\
from transformers import AutoModelForCausalLM, Trainer


def shift_collator(features):
    ids = torch.stack([f["input_ids"] for f in features])
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


model = AutoModelForCausalLM.from_pretrained("gpt2")
trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=shift_collator)
trainer.train()
""",
            lines=(6,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        labels = LabelFacts.of(facts)
        found: dict[int, tuple[Shift, list[tuple[cst.Call, Head, bool]]]] = {}
        for call in facts.calls:
            if self._is_trainer(call):
                model = argument_of(call, "model", 0)
                head = model_head(facts, model, call) if model is not None else None
                if head is None or head.kind != "causal" or not head.shifts:
                    continue
                received = labels.trainer_received(call)
                trainer = True
            elif _model_call_shape(call):
                head = model_head(facts, forward_target(call), call)
                if head is None or head.kind != "causal" or not head.shifts:
                    continue
                received = labels.received(call)
                if received.shifts and not self._loss_read(call):
                    continue  # the loss is computed by hand on the logits
                trainer = False
            else:
                continue
            for shift in _reported(received):
                found.setdefault(id(shift.node), (shift, []))[1].append((call, head, trainer))
        claimed: set[int] = set()
        for shift, uses in found.values():
            self._report(shift, uses, claimed)

    def _is_trainer(self, call: cst.Call) -> bool:
        facts = self.facts
        name = facts.method_name(call) or ""
        if "Trainer" not in name and name not in facts.local_classes():
            return False  # (a cheap test first: resolving every call's name is the expensive part)
        if facts.callee_is(call, TRAINERS):
            return True
        if not facts.is_instance_of(call, TRAINERS):
            return False
        name = (get_full_name_for_node(call.func) or "").rsplit(".", 1)[-1]
        classes = [c for c in facts.classes if c.name.value == name]
        return not any(
            facts.enclosing_class(f) in classes for method in OWN_LOSS_METHODS for f in facts.functions.get(method, ())
        )

    def _loss_read(self, call: cst.Call) -> bool:
        """The model's own loss is used: ``.loss``, ``["loss"]``/``[0]``, or an output that goes somewhere lintdist
        cannot see; False when every read of the output takes another field (``.logits``)."""
        facts = self.facts
        parent = facts.parent(call)
        if isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is call:
            return _reads_loss(parent)
        statement = parent
        if not (
            isinstance(statement, cst.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.targets[0].target, cst.Name)
        ):
            return True
        target = statement.targets[0].target
        function = facts.enclosing_function(call)
        names = facts.within(function, cst.Name) if function is not None else facts.index.nodes(cst.Name)
        for name in names:
            if name.value != target.value or name is target:
                continue
            if function is None and facts.enclosing_function(name) is not None:
                continue
            read = facts.parent(name)
            if isinstance(read, (cst.Attribute, cst.Subscript)) and read.value is name:
                if _reads_loss(read):
                    return True
                continue
            if isinstance(read, cst.AssignTarget):
                continue  # rebound
            return True
        return False

    def _report(self, shift: Shift, uses: list[tuple[cst.Call, Head, bool]], claimed: set[int]) -> None:
        code = self.context.module.code_for_node
        call, head, trainer = uses[0]
        line = self.context.span(call).line
        callee = code(call.func)
        unshift = (
            "stop shifting (`labels` = the uncut `input_ids`, -100 at padding), which makes each sequence one token "
            "longer"
        )
        if trainer:
            owner, advice = (
                "its model",
                (
                    "add the same tensor to the batch under a `shift_labels` key too (the Trainer passes it to the "
                    f"model, which uses it as it is, and counts tokens with it), or {unshift}"
                ),
            )
        elif head.takes_shift_labels:
            owner, advice = (
                "that model",
                (f"pass them as `shift_labels=` too (the model uses those as they are; keep `labels=`), or {unshift}"),
            )
        else:
            owner, advice = "that model", f"{head.why_not}: {unshift}"
        message = (
            f"these labels are shifted by hand (`{code(shift.node)}`) and reach `{callee}(...)` (line {line}) as "
            f"`labels`; {owner} (`{head.name}`) shifts `labels` again itself (`ForCausalLMLoss`), so each position "
            f"is trained to predict the token after next; {advice}"
        )
        self.report(shift.node, message, fix=self._fix(uses, claimed))

    def _fix(self, uses: list[tuple[cst.Call, Head, bool]], claimed: set[int]) -> Fix | None:
        replacements = []
        for call, head, trainer in uses:
            if id(call) in claimed:
                continue
            if trainer or not head.takes_shift_labels:
                return None
            new = _with_shift_labels(call)
            if new is None:
                return None
            replacements.append((call, new))
        if not replacements:
            return None
        claimed.update(id(call) for call, _ in replacements)
        return Fix(
            Applicability.UNSAFE,
            "Pass the pre-shifted labels as `shift_labels=` too (the model uses them without shifting)",
            replacements=tuple(replacements),
        )


def _reported(received: Received) -> tuple[Shift, ...]:
    return () if received.shift_labels else received.shifts


def _model_call_shape(call: cst.Call) -> bool:
    """A call that can hand a model its labels: a ``labels=`` keyword or a ``**batch``."""
    return any(arg.star == "**" or (arg.keyword is not None and arg.keyword.value == "labels") for arg in call.args)


def _reads_loss(read: cst.Attribute | cst.Subscript) -> bool:
    if isinstance(read, cst.Attribute):
        return read.attr.value not in OTHER_OUTPUT_FIELDS
    if len(read.slice) != 1 or not isinstance(read.slice[0].slice, cst.Index):
        return True
    key = read.slice[0].slice.value
    if isinstance(key, cst.SimpleString):
        return key.evaluated_value not in OTHER_OUTPUT_FIELDS
    return not (isinstance(key, cst.Integer) and key.value != "0")


def _with_shift_labels(call: cst.Call) -> cst.Call | None:
    """The call with ``shift_labels=<its labels>`` added after its last argument, in the call's own layout."""
    labels = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "labels"), None)
    if labels is not None:
        if not _plain(labels):
            return None
        value = labels.deep_clone()
    else:
        stars = [a.value for a in call.args if a.star == "**"]
        if len(stars) != 1 or not _plain(stars[0]):
            return None
        key = cst.SubscriptElement(cst.Index(cst.SimpleString('"labels"')))
        value = cst.Subscript(value=stars[0].deep_clone(), slice=[key])
    if not (isinstance(value, cst.Call) and _is_method(value, "contiguous")):
        # `ForCausalLMLoss` flattens `shift_labels` with `.view(-1)`, which fails on a slice such as `ids[:, 1:]`
        value = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("contiguous")))
    equal = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    added = cst.Arg(value=value, keyword=cst.Name("shift_labels"), equal=equal)
    args = list(call.args)
    last = args[-1]
    if not isinstance(last.comma, cst.Comma):
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return call.with_changes(args=[*args, added])
    after = last.comma.whitespace_after
    indent = call.whitespace_before_args
    if isinstance(after, cst.ParenthesizedWhitespace) and isinstance(indent, cst.ParenthesizedWhitespace):
        # one argument per line with a trailing comma: the new one goes on its own line, the comment stays put
        between = after.with_changes(empty_lines=[], last_line=indent.last_line)
        closing = after.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        args[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=between))
        return call.with_changes(args=[*args, added.with_changes(comma=cst.Comma(whitespace_after=closing))])
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, added.with_changes(comma=last.comma)])


def _is_method(call: cst.Call, name: str) -> bool:
    return isinstance(call.func, cst.Attribute) and call.func.attr.value == name


def _plain(expr: cst.BaseExpression) -> bool:
    """An expression the fix may write twice: names, attributes and subscripts by literals, names and slices."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return _plain(expr.value)
    if isinstance(expr, cst.Subscript):
        return _plain(expr.value) and all(_plain_slice(element.slice) for element in expr.slice)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in PURE_METHODS:
        return _plain(expr.func.value) and all(not arg.star and _plain_index(arg.value) for arg in expr.args)
    return False


def _plain_slice(part: cst.BaseSlice) -> bool:
    if isinstance(part, cst.Index):
        return _plain_index(part.value)
    return all(bound is None or _plain_index(bound) for bound in (part.lower, part.upper, part.step))


def _plain_index(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.SimpleString, cst.Integer, cst.Ellipsis)):
        return True
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return _plain(expr)
    return (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
    )
