"""LD102 token-loss-not-global: a per-micro-batch token mean where the optimizer step needs the global token mean."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.blocks import statement_before
from lintdist.edits import replace_nodes, with_arg_changes
from lintdist.facts import BACKWARD_METHODS
from lintdist.labels import LabelFacts
from lintdist.lightning import accumulated_batches, fitting_trainers, returned_loss
from lintdist.loaders import batch_loop, passes_batch_labels, per_batch_loop
from lintdist.loop import (
    TOKEN_COLLATORS,
    BackwardSite,
    Chain,
    Term,
    integer_literal,
    is_loss_field,
)
from lintdist.model import Applicability, Fix, Severity
from lintdist.mutation import changes
from lintdist.normalisation import (
    Normalisation,
    counted_labels,
    gradient_scaling,
    normalisation,
    on_one_path,
    predicted_positions,
)
from lintdist.rule import Invalid, Pattern, Rule, Valid, words
from lintdist.spelling import unused_name


class TokenLossNotGlobal(Rule):
    """
    ## What it does
    Reports a token-level loss (labels padded or masked with `-100`) that is
    averaged per micro-batch while gradients are accumulated over several
    micro-batches or averaged over several ranks. The report points at the line
    that computes the mean-reduced (or locally normalised) loss. It also
    reports the half-done recipes: a loss divided by this rank's token count
    only, a gathered count without the `num_processes` factor, a missing or
    wrong gradient-accumulation factor, a causal LM's count that includes the
    first position of each sequence (the model shifts the labels), and a mean
    divided by a token count. In Lightning, it reports a `training_step` that
    returns such a mean when the `Trainer` fitting the module says
    `accumulate_grad_batches` > 1 or several devices (literal arguments only).
    A loss returned by an imported helper that lintdist cannot read, given the
    micro-batch's `-100` labels (`loss, parts = token_loss(logits, labels)`),
    is taken for a token mean, the default of losses, and reported as a
    warning; so is a sum of two such means (two masked views of a batch),
    and a loss object built by an imported factory
    (`self._loss_fn = config.instantiate(cfg.loss)`, torchtune's recipes,
    where the padding label is read off it as `self._loss_fn.ignore_index`),
    and a model whose forward returns its own loss, given targets masked by
    hand (`targets[mask == 0] = -1`, then `loss = model(inputs, targets)`:
    nanoGPT-style SFT scripts such as nanochat's). A token sum whose
    gradients are scaled after the backward (`scale_grads(model, 1 /
    num_tokens)`, torchtune's recipes) is reported when the count is this
    rank's only, or when it is summed over ranks but DDP/FSDP (also applied by
    a helper of another module) already average the gradients and the scale
    has no world-size factor (torchtune PR 2172).

    ## Why is this bad?
    `outputs.loss` and `CrossEntropyLoss()` return the mean over the
    micro-batch's tokens. Accumulation sums the micro-batch gradients and DDP,
    FSDP and DeepSpeed average them over ranks, so the optimizer step sees a
    mean of means: a micro-batch with 10 tokens weighs as much as one with 500,
    and the gradient is not the gradient of the mean over all tokens of the
    step. The correct scale of micro-batch `(r, g)` is `S_rg * G * W / N`
    (sum of its token losses, accumulation steps, data-parallel ranks, global
    token count). HF `Trainer` and TRL do this already (`num_items_in_batch`);
    sequence classification, fixed-length packed blocks (no `-100`) and short
    targets tokenised to one fixed length (class names padded to a
    `max_length` of at most 8, or to the longest class name) have (nearly) the
    same number of label tokens in every example and are not reported. It is an error under accumulation
    or with sure signs of several processes (a DDP/FSDP wrapper,
    `init_process_group`, a launch with `num_processes` above 1), and a warning
    when the only sign is an `Accelerator`, which single-device scripts build
    too. Not reported without accumulation when the linked launch runs one
    process (`num_processes: 1`, `--num_processes 1`, a plain `python
    train.py` line): the micro-batch mean is then the step's mean.

    ## Example
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=4)
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    from lintdist.runtime import TokenWindows

    accelerator = Accelerator(gradient_accumulation_steps=4)
    token_windows = TokenWindows(train_dataloader, accelerator=accelerator, shifted=True)
    for batch in token_windows:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(token_windows.scale_mean(loss, batch))
            optimizer.step()
            optimizer.zero_grad()
    ```
    `TokenWindows` reads one accumulation window of batches ahead, sums their
    loss tokens over the ranks (one all-reduce per window), and yields the
    batches in order; `scale_mean` turns the micro-batch's mean into its share
    of the window's global token mean. Its windows are accelerate's own: it
    follows `accelerator.step`, ends a window where the loader ends, and stands
    in for the prepared loader in `GradientState`, so reading ahead never makes
    accelerate sync or step in the middle of a window (`skip_first_batches`
    on resume included). A raw DDP loop that steps on
    `(step + 1) % accum == 0 or last` uses
    `TokenWindows(loader, steps=accum, grad_divisor=accum)` (the divisor is its
    `loss / accum`) with `model.no_sync()` as before; its batches must be dicts
    holding `labels` (or the labels tensor passed to `scale_mean`). With
    Lightning (`accumulate_grad_batches`), lintdist reports the
    `training_step` and offers no fix: the Trainer iterates the loader
    itself, reads a batch ahead and moves each batch to the device, so a
    loader wrapper cannot tell which window a batch belongs to; use manual
    optimization (`automatic_optimization = False`), count the step's tokens
    first, and scale the sum-reduced losses with `TokenLossWindow.scale_sum`.

    ## Fix safety
    Safe, for the accelerate loop as it is written in the wild (the
    `*_no_trainer.py` examples and their kin): a `for` over the loader (plain,
    `enumerate(...)` or `tqdm(...)`) whose body holds, once per batch, a
    `with accelerator.accumulate(model):` block (or, where the accelerator
    does not accumulate, the backward call itself) whose only backward is
    `accelerator.backward(loss)`, `loss` being the model's `.loss` (a
    `transformers` causal-LM, masked-LM, seq2seq-LM or token-classification
    head, or a local class named like one) called with `**batch` or
    `labels=batch[...]`. The fix adds one line before the loop,
    `token_windows = TokenWindows(<loader>, accelerator=accelerator, shifted=True)`
    (`shifted=True` only for a causal LM), iterates `token_windows` instead of
    the loader, and passes `token_windows.scale_mean(loss, batch)` to
    `backward`. Every other statement (logging, clipping, the scheduler,
    `completed_steps`, checkpoints, trackers, a `break` at max steps, resume)
    stays where it was and sees the same values: `loss` is still the
    micro-batch's mean, so logged losses do not change; optimizer steps and
    `if accelerator.sync_gradients:` fire on the same batches. The gradient of
    each optimizer step is then the gradient of the global token mean (proven
    on 2 gloo ranks with a tiny Llama, at every step, with a resume). Not
    fixed: a loop that `continue`s before the block (a skipped batch would be
    counted), that changes the batch's labels, runs two backward passes, or
    scales the loss itself; custom losses, raw DDP and Lightning (see above).

    A loop that already counts the step's tokens but counts every label of a
    causal LM (`batch["labels"].ne(-100)`, `labels != -100`) gets a safe fix of
    that count alone: `batch["labels"][..., 1:].ne(-100)`, the positions
    the model predicts (transformers' `ForCausalLMLoss` pads and shifts the
    labels). Not where the labels were shifted by hand before the model shifts
    them again: that is LD111's finding, whose fix (`shift_labels=`) makes the
    count of the pre-shifted labels the right one, so LD102 says nothing there.

    ## References
    - accelerate guide "Gradient accumulation", section on variable-size
      training samples (sum reduction, gathered `num_items_in_batch`)
    - transformers PR #34191 and the HF blog post "Fixing Gradient Accumulation"
    - `transformers.Trainer.compute_loss` (`num_items_in_batch`)
    """

    code = "LD102"
    name = "token-loss-not-global"
    severity = Severity.ERROR
    fix_kind = "safe"
    # a backward call in code (`loss.backward(`, `accelerator.backward(`, `self.manual_backward(`): not an autograd
    # Function's `def backward(`, nor a docstring's `>>> loss.backward()` or a comment (modeling modules have
    # many); read backwards from the `(`. Or a Trainer's compute_loss / Lightning's training_step, as whole names
    # (not `num_training_steps`)
    triggers = (
        Pattern(
            ("backward",),
            re.compile(r"\(\s*drawkcab(?![ \t]+fed(?:\s|\Z))(?![^\n]*(?:>>>|\.\.\.|#)[ \t]*(?:\n|\Z))"),
            backwards=True,
        ),
        words("compute_loss", "training_step"),
    )
    # token evidence; "= -1": targets masked by hand (`targets[mask == 0] = -1`)
    also_triggers = (("-100", "ignore_index", "label_pad_token_id", "= -1", *sorted(TOKEN_COLLATORS)),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM
from lintdist.runtime import TokenWindows

accelerator = Accelerator(gradient_accumulation_steps=4)
model = AutoModelForCausalLM.from_pretrained("gpt2")
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
token_windows = TokenWindows(loader, accelerator=accelerator, shifted=True)
for step, batch in enumerate(token_windows):
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(token_windows.scale_mean(loss, batch))
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        Valid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
loss_fn = torch.nn.CrossEntropyLoss(reduction="sum", ignore_index=-100)
for step_batches in groups:
    n = sum((b["labels"][:, 1:] != -100).sum() for b in step_batches)
    n = accelerator.gather(n).sum()
    for batch in step_batches:
        with accelerator.accumulate(model):
            logits = model(batch["input_ids"])[:, :-1]
            loss = loss_fn(logits.flatten(0, 1), batch["labels"][:, 1:].flatten())
            loss = loss * accelerator.gradient_accumulation_steps * accelerator.num_processes / n
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding

accelerator = Accelerator(gradient_accumulation_steps=4)
model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", num_labels=2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        accelerator.backward(model(**batch).loss)
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        Valid(
            """\
import torch.nn.functional as F

for batch in loader:
    logits = model(batch["input_ids"])
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""
        ),
        Valid(
            """\
from transformers import Trainer


class WeightedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs, num_items_in_batch=num_items_in_batch)
        return (outputs.loss, outputs) if return_outputs else outputs.loss


collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)
WeightedTrainer(model=model, args=args, data_collator=collator).train()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import lightning as L
import torch.nn.functional as F

class LitLM(L.LightningModule):
    def training_step(self, batch, batch_idx):
        logits = self.net(batch["input_ids"])
        loss = F.cross_entropy(logits.transpose(1, 2), batch["labels"], ignore_index=-100)
        return loss

L.Trainer(accumulate_grad_batches=4).fit(LitLM(), loader)
""",
            lines=(7,),
        ),
        Invalid(
            """\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling

accelerator = Accelerator(gradient_accumulation_steps=4)
model = AutoModelForCausalLM.from_pretrained("gpt2")
collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
for batch in train_dataloader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()
""",
            lines=(10,),
            fixed="""\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling
from lintdist.runtime import TokenWindows

accelerator = Accelerator(gradient_accumulation_steps=4)
model = AutoModelForCausalLM.from_pretrained("gpt2")
collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(model, optimizer, train_dataloader, lr_scheduler)
token_windows = TokenWindows(train_dataloader, accelerator=accelerator, shifted=True)
for batch in token_windows:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(token_windows.scale_mean(loss, batch))
        optimizer.step(); lr_scheduler.step(); optimizer.zero_grad()
""",
        ),
        Invalid(
            """\
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(model)
criterion = torch.nn.CrossEntropyLoss(ignore_index=-100)
for step, (inputs, labels) in enumerate(loader):
    logits = model(inputs)
    loss = criterion(logits.view(-1, vocab), labels.view(-1))
    loss = loss / accum_steps
    loss.backward()
    if (step + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
            lines=(8,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        total_items = accelerator.gather((batch["labels"] != -100).sum()).sum()
        loss = outputs.loss / total_items
        accelerator.backward(loss)
""",
            lines=(8,),
        ),
        Invalid(
            """\
import torch
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=2)
loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
for batch in loader:
    with accelerator.accumulate(model):
        n_local = (batch["labels"] != -100).sum()
        loss = loss_fn(model(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten())
        loss = loss * accelerator.gradient_accumulation_steps * accelerator.num_processes / n_local
        accelerator.backward(loss)
""",
            lines=(10,),
        ),
        Invalid(
            """\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM, DataCollatorForLanguageModeling

accelerator = Accelerator(gradient_accumulation_steps=4)
model = AutoModelForCausalLM.from_pretrained("gpt2")
collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        accelerator.backward(outputs.loss, retain_graph=True)
        accelerator.backward(0.01 * outputs.aux_loss)
        optimizer.step()
        optimizer.zero_grad()
""",
            lines=(11,),
        ),
        Invalid(
            """\
from transformers import Trainer


class MyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        loss = outputs.loss
        return (loss, outputs) if return_outputs else loss


collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100)
MyTrainer(model=model, args=args, data_collator=collator).train()
""",
            lines=(7,),
        ),
    )

    # -- whole-file analysis ------------------------------------------------------------------

    def finish(self) -> None:
        if not self.loop.token_evidence or self.loop.short_fixed_labels:
            return
        self._findings: set[int] = set()
        for site in self.loop.backward_sites:
            self._check_backward(site)  # (sets the severity of its findings)
        self._severity = Severity.ERROR  # the Trainer and Lightning checks are certain
        for function in self.facts.functions.get("compute_loss", ()):
            self._check_compute_loss(function)
        for function in self.facts.functions.get("training_step", ()):
            self._check_training_step(function)

    # -- the loss handed to backward ------------------------------------------------------------

    def _check_backward(self, site: BackwardSite) -> None:
        call, loss, receiver = site.call, site.loss, site.receiver
        statement = self.loop.statement_of(call)
        if loss is None or statement is None:
            return
        chain = self.loop.chain(loss, statement)
        if chain.base not in {"mean", "sum"}:
            return
        accelerated = receiver is not None and self.facts.is_accelerator(receiver, call)
        # a process group whose ranks never average gradients (tensor parallelism, the same batch on every rank)
        distributed = self.loop.distributed and (accelerated or self.loop.averages_gradients(call))
        norm = normalisation(self.loop, chain)
        accumulating = self.loop.accumulates or norm.divided_by_accumulation
        if not accumulating and (not distributed or self.loop.surely_single):
            return  # one process, one micro-batch per step: its own token mean is the step's mean
        # An Accelerator alone does not say the job runs on several processes (it is also used for mixed precision
        # on one device): without accumulation that is only a warning.
        certain = not chain.assumed and (accumulating or self.loop.surely_distributed)
        self._severity = Severity.ERROR if certain else Severity.WARNING
        head = self.loop.loss_head(chain)
        if head == "sequence":
            return
        count = norm.count
        if norm.base == "mean":
            if count:
                self._report_once(
                    count.at,
                    count.expr,
                    f"{_subject(chain)} is already a per-micro-batch mean; dividing it by a token count gives a mean "
                    "of means scaled down by the count, not the global token mean; " + _REMEDY,
                )
            else:
                self._report_mean(call, chain, head, accelerated, distributed)
            return
        # a token sum: divided by a count here, or with its gradients scaled after the backward; both where the
        # division is on one path only (`if optimizer_in_backward: loss = loss / num_tokens`)
        if count:
            self._check_normalised(chain, norm, head, receiver if accelerated else None, distributed, call)
        if not count or on_one_path(self.facts, count, call):
            self._check_grad_scaling(call, distributed)

    def _check_grad_scaling(self, call: cst.Call, distributed: bool) -> None:
        """A token-sum loss whose gradients are divided by the token count after the backward (torchtune's
        ``training.scale_grads(model, 1 / num_tokens)``): the count must span every rank, and where DDP or FSDP
        average the gradients over ranks the scale must also multiply by their number (torchtune PR 2172)."""
        found = gradient_scaling(self.loop, call)
        if found is None:
            return
        numerator, count = found
        if not self.loop.factor(count).gathered:
            problem = (
                "by this rank's token count only, so ranks with fewer tokens weigh more; sum the count over "
                "ranks (`dist.all_reduce`)"
            )
        elif distributed and self.loop.factor(numerator).kind != "world":
            problem = (
                "by the global token count, but DDP/FSDP have already averaged them over ranks: the step's "
                "gradient is 1/world_size of the global token mean's; scale by `world_size / num_tokens`"
            )
        else:
            return
        self._report_once(
            count.at,
            count.expr,
            f"the summed token losses' gradients are scaled {problem}; or use `TokenLossWindow.scale_sum` from "
            "`lintdist.runtime`",
        )

    def _report_mean(
        self, call: cst.Call, chain: Chain, head: str | None, accelerated: bool, distributed: bool
    ) -> None:
        why = "accumulated over micro-batches" + (" and averaged over ranks" if distributed else "")
        fix = self._windows_fix(call, chain, head) if accelerated else None
        remedy = (
            "iterate the loader through `TokenWindows` and pass `token_windows.scale_mean(loss, batch)` to backward "
            "(auto-fixable)"
            if fix
            else _REMEDY
        )
        lead = f"{_subject(chain)} is a mean over this micro-batch's tokens, so the optimizer step"
        if chain.assumed:
            lead = (
                f"{_subject(chain)} comes from `{get_full_name_for_node(chain.base_expr.func)}(...)`, which gets "
                "this micro-batch's token labels: if it averages over their tokens (the default of losses), the "
                "optimizer step"
            )
        self._report_once(
            chain.base_at,
            chain.base_expr,
            f"{lead} ({why}) averages "
            f"per-micro-batch means and over-weights tokens of short micro-batches instead of taking the mean over "
            f"all tokens of the step; {remedy}",
            fix,
        )

    def _check_normalised(
        self,
        chain: Chain,
        norm: Normalisation,
        head: str | None,
        accelerator: cst.BaseExpression | None,
        distributed: bool,
        call: cst.Call,
    ) -> None:
        """A sum-reduced loss divided by a token count: the count must be global, shifted for a causal LM, and
        the loss multiplied by the number of ranks and by the accumulation steps the backend divides by."""
        count = norm.count
        factor = self.loop.factor(count)
        problem = None
        unshifted = False  # the one problem a local edit of the count fixes
        if not factor.gathered:
            problem = (
                "divides by this rank's token count only, so ranks with fewer tokens weigh more; sum the count over "
                "ranks (`accelerator.gather(n).sum()` or `dist.all_reduce`) and multiply by the number of processes"
            )
        elif head == "causal" and not factor.shifted:
            model_call = self.loop.model_call(chain.base_expr)
            if model_call is not None and LabelFacts.of(self.facts).received(model_call).shifts:
                # labels shifted by hand and shifted again by the model: LD111's finding, whose fix (`shift_labels=`)
                # makes this count of the pre-shifted labels the right one; a count fix here would undo it
                return
            unshifted = True
            problem = (
                "counts every label, but a causal LM shifts its labels and never predicts the first position; count "
                "`labels[..., 1:] != -100` (or use `TokenLossWindow(..., shifted=True)`)"
            )
        elif distributed and not norm.world:
            problem = (
                "divides by the global token count but is not multiplied by the number of processes, and DDP or FSDP then "
                "average over ranks: the gradient is 1/world_size of the global token mean's; multiply by "
                "`accelerator.num_processes` (or `dist.get_world_size()`)"
            )
        else:
            configured = self.loop.accelerator_accumulation(accelerator, call) if accelerator is not None else None
            expected = integer_literal(configured, self.facts, call) if configured is not None else None
            if norm.literal is not None and expected is not None and norm.literal != expected:
                problem = (
                    f"multiplies by {norm.literal} accumulation steps while the Accelerator divides by {expected}; "
                    "multiply by `accelerator.gradient_accumulation_steps`"
                )
            elif configured is not None and norm.accumulation != 1:
                problem = (
                    "is not multiplied by the gradient accumulation steps that `accelerator.backward` divides by, so "
                    "the gradient is 1/G of the global token mean's; multiply by "
                    "`accelerator.gradient_accumulation_steps`"
                )
            elif accelerator is None and norm.accumulation != 0:
                problem = (
                    "is scaled by the accumulation steps although a plain backward does not divide by them and the "
                    "global count already spans the whole step; drop the accumulation factor"
                )
        if problem:
            self._report_once(
                count.at,
                count.expr,
                f"this token-normalised loss {problem}; or use `TokenLossWindow.scale_sum` from `lintdist.runtime`",
                self._shift_count_fix(count) if unshifted else None,
            )

    def _shift_count_fix(self, count: Term) -> Fix | None:
        """Count only the labels a causal LM predicts, where the count reads one labels expression."""
        labels = counted_labels(self.loop, count)
        if labels is None:
            return None
        message = "Count only the labels a causal LM predicts (`[..., 1:]`)"
        return Fix(Applicability.SAFE, message, replacements=((labels, predicted_positions(labels)),))

    def _check_training_step(self, function: cst.FunctionDef) -> None:
        """A LightningModule's ``training_step`` returning a token mean, with accumulation or several devices."""
        cls = self.facts.lightning_module_of(function.body)
        scale = self._lightning_scale(cls) if cls is not None else None
        if scale is None:
            return
        for chain in self._returned_means(function, returned_loss):
            if self.loop.loss_head(chain) == "sequence":
                continue
            self._report_once(
                chain.base_at,
                chain.base_expr,
                f"{_subject(chain)} is a mean over this batch's tokens, and the Trainer {scale}, so each optimizer "
                "step weighs batches, not tokens, equally; return the sum-reduced loss scaled with "
                "`TokenLossWindow.scale_sum` from `lintdist.runtime` (global token count of the step, with "
                "`automatic_optimization = False` to see the step's batches first)",
            )

    def _lightning_scale(self, cls: cst.ClassDef) -> str | None:
        """How the Trainer that fits ``cls`` makes a step average batches: accumulation or several devices."""
        for call in fitting_trainers(self.facts, cls):
            if (batches := accumulated_batches(call)) is not None:
                return f"accumulates {batches} batches per step (`accumulate_grad_batches`)"
            if self.facts.trainer_devices(call) == "several":
                return "averages the gradient over devices"
        return None

    def _check_compute_loss(self, function: cst.FunctionDef) -> None:
        """A Trainer subclass whose ``compute_loss`` ignores ``num_items_in_batch`` returns a per-batch mean."""
        cls = self.facts.enclosing_class(function)
        if cls is None or not self.facts.derives_from(cls, _is_hf_trainer):
            return
        if any(name.value == "num_items_in_batch" for name in self.facts.within(function.body, cst.Name)):
            return  # it reads the step's token count
        for chain in self._returned_means(function, _first_returned):
            self._report_once(
                chain.base_at,
                chain.base_expr,
                f"`compute_loss` ignores `num_items_in_batch`, so {_subject(chain)} is a per-batch token mean "
                "and the Trainer's accumulated step is a mean of means; compute the summed loss and divide it by "
                "`num_items_in_batch` (or pass it to the model: `model(**inputs, num_items_in_batch=...)`)",
            )

    def _returned_means(self, function: cst.FunctionDef, loss_of) -> Iterator[Chain]:
        """The losses ``function`` returns (``loss_of(returned)`` picks each) that are token means, uncounted."""
        for returned in self.facts.returns.get(function, ()):
            expr = loss_of(returned)
            if expr is None:
                continue
            chain = self.loop.chain(expr, returned)
            if chain.base == "mean" and not normalisation(self.loop, chain).counted:
                yield chain

    def _report_once(
        self, at: cst.CSTNode | None, expr: cst.BaseExpression | None, message: str, fix: Fix | None = None
    ) -> None:
        node = at if isinstance(at, (cst.Assign, cst.AugAssign, cst.AnnAssign)) else expr
        if node is None or id(node) in self._findings:
            return
        self._findings.add(id(node))
        self.report(node, message, fix=fix, severity=self._severity)

    # -- the fix: wrap the loop's loader in TokenWindows and scale what goes to backward -----------

    def _windows_fix(self, call: cst.Call, chain: Chain, head: str | None) -> Fix | None:
        """``for ... in enumerate(X):`` with one ``accelerator.accumulate`` block per batch becomes
        ``token_windows = TokenWindows(X, ...)`` + ``for ... in enumerate(token_windows):``, and
        ``accelerator.backward(loss)`` becomes ``accelerator.backward(token_windows.scale_mean(loss, batch))``."""
        facts, code = self.facts, self.context.module.code_for_node
        if head not in {"causal", "token"} or chain.num or chain.den or not is_loss_field(chain.base_expr):
            return None
        if not call.args or call.args[0].keyword is not None or call.args[0].star:
            return None
        accelerator = call.func.value
        block = self.loop.accumulate_block_of(call)
        if block is not None:
            if code(block.accelerator) != code(accelerator):
                return None
            anchor = block.node
        elif self.loop.accumulation(accelerator, call).state == "none":
            anchor = facts.parent(self.loop.statement_of(call))  # no accumulation: windows of one batch
        else:
            return None
        loop = per_batch_loop(facts, anchor)
        if loop is None:
            return None  # the accumulate block (or the backward) must run once for every batch the loop reads
        batch, source = batch_loop(facts, loop)
        if batch is None:
            return None
        model_call = self.loop.model_call(chain.base_expr)
        if model_call is None or not passes_batch_labels(model_call, batch) or changes(facts, loop.body, batch):
            return None  # the window counts the labels the loader yields
        if head == "causal":
            received = LabelFacts.of(facts).received(model_call)
            if received.shifts or received.shift_labels:
                return None  # labels shifted by hand (LD111) or `shift_labels`: which positions count is unclear
        backwards = [c for c in facts.reachable_calls(loop.body) if facts.method_name(c) in BACKWARD_METHODS]
        if len(backwards) != 1:
            return None  # several backward passes per micro-batch (LD101's shape)
        name = self._free_name(loop)
        if name is None:
            return None
        shifted = ", shifted=True" if head == "causal" else ""
        created = cst.parse_statement(
            f"{name} = TokenWindows({code(source)}, accelerator={code(accelerator)}{shifted})\n"
        )
        scaled = cst.Call(
            func=cst.Attribute(value=cst.Name(name), attr=cst.Name("scale_mean")),
            args=[cst.Arg(call.args[0].value), cst.Arg(cst.Name(batch))],
        )
        new_call = with_arg_changes(call, {id(call.args[0]): call.args[0].with_changes(value=scaled)})
        new_loop = replace_nodes(loop, ((source, cst.Name(name)), (call, new_call)))
        return Fix(
            Applicability.SAFE,
            "Iterate the loader through `TokenWindows` and scale the loss passed to `backward` with `scale_mean`",
            replacements=((loop, statement_before(loop, new_loop, created)),),
            imports=(("lintdist.runtime", "TokenWindows"),),
        )

    def _free_name(self, loop: cst.For) -> str | None:
        """A name for the windows that nothing in the loop's function uses; None beside a TokenWindows of the
        script's own."""
        module_names = {name.value for name in self.facts.index.nodes(cst.Name)}
        if "TokenWindows" in module_names and "lintdist" not in module_names:
            return None
        scope = self.facts.enclosing_function(loop) or self.context.module
        return unused_name(self.facts, scope, ("token_windows", "loss_windows"))


_REMEDY = (
    "iterate the loader through `TokenWindows` from `lintdist.runtime` and pass `token_windows.scale_mean(loss, "
    "batch)` (or `.scale_sum(loss_sum)` for a sum-reduced loss) to backward: each optimizer step then follows the "
    "window's global token mean"
)


def _is_hf_trainer(name: str) -> bool:
    return name.split(".", 1)[0] in {"transformers", "trl"} and name.endswith("Trainer")


def _first_returned(returned: cst.BaseExpression) -> cst.BaseExpression:
    """The loss of ``return (loss, outputs) if return_outputs else loss``: the first branch's first element."""
    expr = returned.body if isinstance(returned, cst.IfExp) else returned
    return expr.elements[0].value if isinstance(expr, cst.Tuple) and expr.elements else expr


def _subject(chain: Chain) -> str:
    at = chain.base_at
    single = isinstance(at, cst.Assign) and len(at.targets) == 1
    name = get_full_name_for_node(at.targets[0].target) if single else None
    return f"`{name}`" if name else "the loss"
