"""LD111 labels-shifted-twice: labels shifted by hand, then shifted again by a transformers causal LM."""

from __future__ import annotations

import re

import libcst as cst

from lintdist.edits import keyword_arg, repeatable, with_arg_appended
from lintdist.facts import argument_of
from lintdist.labels import Head, LabelFacts, Shift, called_head, hands_labels, model_head, model_loss_trainer
from lintdist.loop import keyword
from lintdist.model import Applicability, Fix, Severity
from lintdist.model_outputs import reads_model_loss
from lintdist.rule import Invalid, Pattern, Rule, Valid


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
            trainer = model_loss_trainer(facts, call)
            if trainer:
                model = argument_of(call, "model", 0)
                head = model_head(facts, model, call) if model is not None else None
            elif hands_labels(call):
                head = called_head(facts, call)
            else:
                continue
            if head is None or head.kind != "causal" or not head.shifts:
                continue
            received = labels.trainer_received(call) if trainer else labels.received(call)
            if not trainer and received.shifts and not reads_model_loss(facts, call):
                continue  # the loss is computed by hand on the logits
            for shift in () if received.shift_labels else received.shifts:
                found.setdefault(id(shift.node), (shift, []))[1].append((call, head, trainer))
        claimed: set[int] = set()
        for shift, uses in found.values():
            self._report(shift, uses, claimed)

    def _report(self, shift: Shift, uses: list[tuple[cst.Call, Head, bool]], claimed: set[int]) -> None:
        code = self.context.module.code_for_node
        call, head, trainer = uses[0]
        unshift = (
            "stop shifting (`labels` = the uncut `input_ids`, -100 at padding), which makes each sequence one token "
            "longer"
        )
        if trainer:
            advice = (
                "add the same tensor to the batch under a `shift_labels` key too (the Trainer passes it to the "
                f"model, which uses it as it is, and counts tokens with it), or {unshift}"
            )
        elif head.takes_shift_labels:
            advice = (
                f"pass them as `shift_labels=` too (the model uses those as they are; keep `labels=`), or {unshift}"
            )
        else:
            advice = f"{head.why_not}: {unshift}"
        message = (
            f"these labels are shifted by hand (`{code(shift.node)}`) and reach `{code(call.func)}(...)` (line "
            f"{self.context.span(call).line}) as `labels`; {'its' if trainer else 'that'} model (`{head.name}`) "
            f"shifts `labels` again itself (`ForCausalLMLoss`), so each position is trained to predict the token "
            f"after next; {advice}"
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


def _with_shift_labels(call: cst.Call) -> cst.Call | None:
    """The call with ``shift_labels=<its labels>`` added after its last argument, in the call's own layout."""
    value = keyword(call, "labels")
    stars = [a.value for a in call.args if a.star == "**"]
    if value is None and len(stars) == 1:
        value = cst.Subscript(value=stars[0], slice=[cst.SubscriptElement(cst.Index(cst.SimpleString('"labels"')))])
    if value is None or not repeatable(value):
        return None
    if not (isinstance(value, cst.Call) and value.func.attr.value == "contiguous"):  # (repeatable: a method call)
        # `ForCausalLMLoss` flattens `shift_labels` with `.view(-1)`, which fails on a slice such as `ids[:, 1:]`
        value = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("contiguous")))
    return with_arg_appended(call, keyword_arg("shift_labels", value.deep_clone()))
