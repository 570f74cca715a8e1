"""LD207 metric-over-sampler-padding: a raw-torch eval metric gathered over DistributedSampler's padded duplicates."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.batch_rows import accumulated_in, batch_derived, first_rows_cut, mentions
from lintdist.collectives import combined_value
from lintdist.evaluation import evaluates
from lintdist.facts import SAMPLER_CLASSES
from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.samplers import padding_sampler


class MetricOverSamplerPadding(Rule):
    """
    ## What it does
    Reports a `torch.distributed` collective (`all_reduce`, `reduce`,
    `all_gather`, `all_gather_into_tensor`, `all_gather_object`, `gather`,
    `gather_object`), or a call of the file's own helper that runs one on its
    argument (`reduce_tensor(t)`), that combines the ranks' evaluation results, when the
    evaluation loop reads a loader whose sampler is a `DistributedSampler`
    without `drop_last=True` (built there, or returned by a function of
    another project module, `sampler=utils.get_sampler(ds)`), and nothing
    cuts the gathered results back to the dataset's length. The results are the loop's batch values (the
    collective runs in the loop) or what the loop accumulated from them
    (`correct += ...`, `preds.append(...)`) and the collective runs after it
    in the same function. The loop evaluates: no backward, under `no_grad`,
    after `model.eval()`, or in a function named for evaluation.

    Not reported: a loader passed to `accelerator.prepare` (LD404 covers
    accelerate's `gather`), a sampler given `drop_last=True`, other
    libraries' samplers (`UnpaddedDistributedSampler`,
    `DistributedEvalSampler` exist because they do not pad), a collective
    whose value does not come from the loop, results cut afterwards
    (`preds[:len(dataset)]`, any `x[:n]` later in the function), and results
    written into a table at the gathered sample indices (`idx =
    all_gather(idx)`, then `bank[idx] = feats`: a repeated sample overwrites
    its own row). A dataset
    whose length divides by the world size has no duplicates; lintdist
    cannot prove that, so the rule is a warning.

    ## Why is this bad?
    `DistributedSampler` (torch 2.13 `torch/utils/data/distributed.py`,
    `__iter__`) pads the index list with its first indices until it divides
    by the number of replicas when `drop_last` is False, the default, so that
    every rank runs the same number of steps. With `len(dataset) % W != 0`,
    the metric counts up to world_size-1 samples twice: 11 validation
    images on 2 ranks are scored as 12, and the accuracy, loss or F1 is not
    the one a single process computes. The error changes with the number of
    processes, and papers have reported it.

    ## Example
    ```python
    sampler = DistributedSampler(val_set, shuffle=False)
    loader = DataLoader(val_set, batch_size=64, sampler=sampler)
    model.eval()
    correct = torch.zeros(1)
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
    dist.all_reduce(correct)
    accuracy = correct.item() / len(val_set)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(val_set, shuffle=False)
    loader = DataLoader(val_set, batch_size=64, sampler=sampler)
    model.eval()
    hits = []
    with torch.no_grad():
        for x, y in loader:
            hits.append(model(x).argmax(1) == y)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, torch.cat(hits))
    # rank r holds padded positions r, r + W, ...: interleave, then keep the first len(val_set)
    ordered = torch.stack(gathered, dim=1).flatten()[: len(val_set)]
    accuracy = ordered.double().mean().item()
    ```

    ## Fix safety
    No fix. A count reduced with `all_reduce` cannot be un-padded after the
    fact: the loop must know which of its samples are duplicates. Gathered
    per-sample results can be cut, but only in the padded order: rank `r`
    holds positions `r, r + W, r + 2W...`, so the ranks' lists must be
    interleaved before keeping the first `len(dataset)`; cutting the plain
    concatenation keeps the duplicates and drops real samples once W > 2.
    Which fix fits (interleave and cut, an unpadded sampler with uneven
    inputs and `Join`, or evaluating the remainder on one rank as the
    ImageNet example does) is the author's choice.

    ## References
    - torch 2.13 `torch/utils/data/distributed.py::DistributedSampler.__iter__`
      (`if not self.drop_last: ... indices += indices[:padding_size]`, then
      `indices[self.rank : self.total_size : self.num_replicas]`)
    - https://github.com/pytorch/pytorch/issues/25162: "Incorrect Validation
      Accuracy Due to Distributed Sampler", acknowledged by the maintainers
    - https://github.com/pytorch/vision/issues/4559: the reference scripts
      count some images twice when the dataset does not divide; a maintainer
      notes it can change reported results
    - https://github.com/pytorch/examples/pull/980: the ImageNet example's
      validation accuracy was wrong for the same reason; fixed by evaluating
      the remainder separately
    - https://github.com/mosaicml/composer/pull/2218: distributed samplers pad
      with duplicate samples; the fix slices them off for exact evaluation
    - Proof: tests/proofs/test_ld207_padded_metric.py (gloo, 2 ranks): on an
      11-sample eval set the all_reduced count and the gathered accuracy
      score 12 samples and differ from the single-process float64 reference;
      the interleaved results cut to 11 equal it
    """

    code = "LD207"
    name = "metric-over-sampler-padding"
    severity = Severity.WARNING
    needs_several_processes = True
    triggers = ("DistributedSampler", "sampler=")
    also_triggers = (("all_reduce", "all_gather", "gather", "reduce"),)

    VALID = (
        Valid(
            """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False, drop_last=True))
correct = torch.zeros(1)
with torch.no_grad():
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum()
dist.all_reduce(correct)
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False))
preds = []
with torch.no_grad():
    for x, y in loader:
        preds.append(model(x).argmax(1))
gathered = [None] * dist.get_world_size()
dist.all_gather_object(gathered, torch.cat(preds))
ordered = torch.stack(gathered, dim=1).flatten()[: len(val_set)]
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(train_set, batch_size=64, sampler=DistributedSampler(train_set))
for x, y in loader:
    loss = loss_fn(model(x), y)
    loss.backward()
    dist.all_reduce(loss)
"""
        ),
        Valid(
            """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False))
bank = torch.zeros(len(val_set), 128)
with torch.no_grad():
    for index, x in loader:
        feats = gather_all(model(x))
        index = gather_all(index)
        bank[index] = feats


def gather_all(t):
    parts = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return torch.cat(parts)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def validate(model, val_set):
    sampler = DistributedSampler(val_set, shuffle=False)
    loader = DataLoader(val_set, batch_size=64, sampler=sampler)
    model.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            total += y.numel()
    stats = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(stats)
    return stats[0] / stats[1]
""",
            lines=(16,),
        ),
        Invalid(
            """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

loader = DataLoader(test_set, batch_size=32, sampler=DistributedSampler(test_set))
model.eval()
for images, labels in loader:
    with torch.no_grad():
        preds = model(images).argmax(1)
    out = [torch.zeros_like(preds) for _ in range(dist.get_world_size())]
    dist.all_gather(out, preds)
    all_preds.extend(out)
""",
            lines=(12,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        self._reported: set[cst.Call] = set()
        loops = [
            (loop, sampler)
            for loop, expr in facts.data_loops()
            if evaluates(facts, loop) and (sampler := padding_sampler(facts, expr, loop)) is not None
        ]
        if not loops:
            return
        combined = [(call, value) for call in facts.calls if (value := combined_value(facts, call)) is not None]
        for loop, sampler in loops:
            if self._stored_by_gathered_index(loop, combined):
                continue
            for call, value in combined:
                if call not in self._reported and self._from_loop(call, value, loop) and not self._cut_later(call):
                    self._reported.add(call)
                    self._report(call, sampler)

    def _stored_by_gathered_index(self, loop: cst.For, combined: list) -> bool:
        """The loop writes its results into a table at the gathered sample indices (``idx = all_gather(idx)``,
        then ``bank[idx] = feats``): a repeated sample overwrites its own row, and nothing is counted twice."""
        facts = self.facts
        gathered = {call for call, _ in combined if facts.is_within(call, loop.body)}
        for statement in facts.within(loop.body, cst.Assign):
            for target in statement.targets:
                if not isinstance(target.target, cst.Subscript):
                    continue
                for key in facts.within(target.target.slice[0], cst.Name) if target.target.slice else ():
                    for binding in facts.bindings(key.value, statement):
                        if any(call is binding.value or facts.is_within(call, binding.value) for call in gathered):
                            return True
        return False

    def _from_loop(self, call: cst.Call, value: cst.BaseExpression, loop: cst.For) -> bool:
        """The value comes from the loop's batches: sent inside the loop from its batch values, or accumulated
        there and sent after it, in the same function."""
        facts = self.facts
        if facts.enclosing_function(call) is not facts.enclosing_function(loop):
            return False
        if facts.is_within(call, loop.body):
            return mentions(facts, value, batch_derived(facts, loop))
        return facts.index.order(call) > facts.index.order(loop) and accumulated_in(facts, value, loop, call)

    def _cut_later(self, call: cst.Call) -> bool:
        """Some ``x[:n]`` after the collective in its function: the results cut back to the dataset's length."""
        facts = self.facts
        scope = facts.enclosing_function(call) or facts.index.module
        order = facts.index.order(call)
        return any(first_rows_cut(s) and facts.index.order(s) > order for s in facts.within(scope, cst.Subscript))

    def _report(self, call: cst.Call, sampler: cst.Call) -> None:
        facts = self.facts
        where = facts.where(sampler)
        if not facts.is_instance_of(sampler, SAMPLER_CLASSES):  # a helper of another module builds it
            where = f"returned by `{get_full_name_for_node(sampler.func)}` at {where}"
        message = (
            f"these evaluation results come from a loader whose DistributedSampler ({where}) pads every rank to "
            "the same count by repeating samples (drop_last=False), and nothing cuts them back to `len(dataset)`: "
            "the metric counts up to world_size-1 samples twice; gather per-sample results and keep the first "
            "`len(dataset)` in the sampler's interleaved order, or evaluate the remainder apart"
        )
        self.report(call, message)
