"""LD105 localsgd-step-missing: a `with LocalSGD(...)` block that never calls the object's `step()`."""

from __future__ import annotations

import libcst as cst

from lintdist.context_objects import entered_construction, entered_names, method_called_or_escapes
from lintdist.facts import argument_of
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

LOCAL_SGD = frozenset({"accelerate.local_sgd.LocalSGD"})
STEP = "step"
# The name the fix gives an anonymous `with LocalSGD(...)`.
DEFAULT_NAME = "local_sgd"


class LocalSgdStepMissing(Rule):
    """
    ## What it does
    Reports a `with LocalSGD(...)` block (accelerate's
    `accelerate.local_sgd.LocalSGD`) whose body never calls the object's
    `step()`, neither directly nor through a function of the same file that the
    block calls. A `with LocalSGD(...):` that binds no name (no `as`) is
    reported too: nothing can call its `step()`. The report points at what the
    `with` enters: the `LocalSGD(...)` call, or the name it was bound to.

    ## Why is this bad?
    Entering the block puts the model under DDP's `no_sync()`: from then on the
    ranks never all-reduce gradients and train independent copies of the model.
    `LocalSGD` brings them back together by averaging the parameters every
    `local_sgd_steps` calls of `step()`, and once more when the block exits.
    Without `step()` the only averaging is the one at exit: for the whole block
    (often a whole epoch, or the whole run) every rank trains its own model on
    its own shard, and the averaged result of models that drifted apart is what
    survives. Nothing warns: the loss goes down on every rank.

    Not reported: a block that trains nothing (no backward pass and no
    optimizer step in it, nor in the helpers it calls), which only averages the
    parameters once, at exit; a `step()` reached through a helper function of the file (the
    object passed as an argument, or read as `self.local_sgd`), a block whose
    object escapes into code lintdist cannot see (passed to a function of
    another module, or stored in a container), and `LocalSGD(...,
    enabled=False)`, which does nothing.

    ## Example
    ```python
    from accelerate.local_sgd import LocalSGD

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    from accelerate.local_sgd import LocalSGD

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
    ```
    `step()` counts its calls, not optimizer updates. Called inside
    `accelerator.accumulate(model)` (as accelerate's own `local_sgd.py`
    example does), it counts micro-batches: with 4 accumulation steps and
    `local_sgd_steps=8`, parameters are averaged every 2 optimizer updates.
    Called after an `if`-gated `optimizer.step()`, inside the gate, it counts
    updates. Both are valid; choose `local_sgd_steps` accordingly.

    ## Fix safety
    Safe. The fix inserts `<name>.step()` right after the last optimizer step
    (`optimizer.step()`, or `scaler.step(optimizer)`) of the loop inside the
    block, in the same statement block: inside an `accumulate` block or an
    `if` gate when the optimizer step is there. This is the call the block was
    written for; the parameters are then averaged every `local_sgd_steps`
    calls, as documented. A block with no `as` name gets `as local_sgd` as well,
    when that name is free in the file. No fix when the optimizer step is not
    written in a loop of the block itself (it sits in a helper function, or the
    block is entered once per batch), when it is not a statement of its own,
    or when no optimizer step can be found: there, where `step()` belongs is
    the author's decision.

    ## References
    - accelerate `accelerate/local_sgd.py`: `LocalSGD.__enter__` (enters
      `model.no_sync()`), `step` (averages every `local_sgd_steps` calls) and
      `__exit__` (averages once more)
    - accelerate `examples/by_feature/local_sgd.py`
    - accelerate documentation, "Using Local SGD with 🤗 Accelerate"
    """

    code = "LD105"
    name = "localsgd-step-missing"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("LocalSGD",)

    VALID = (
        Valid(
            """\
from accelerate.local_sgd import LocalSGD

with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
"""
        ),
        Valid(
            """\
from accelerate.local_sgd import LocalSGD


def train_step(batch, sync):
    accelerator.backward(model(**batch).loss)
    optimizer.step()
    optimizer.zero_grad()
    sync.step()


with LocalSGD(accelerator, model, 4) as sync:
    for batch in loader:
        train_step(batch, sync)
"""
        ),
        Valid(
            """\
from accelerate.local_sgd import LocalSGD

with LocalSGD(accelerator, model, 4, enabled=False):
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
"""
        ),
        Valid(
            """\
from accelerate.local_sgd import LocalSGD
from mytrainer import run_epoch

with LocalSGD(accelerator, model, 4) as local_sgd:
    run_epoch(model, loader, optimizer, local_sgd)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate.local_sgd import LocalSGD

with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()  # update
        optimizer.zero_grad()
""",
            lines=(3,),
            fixed="""\
from accelerate.local_sgd import LocalSGD

with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()  # update
        local_sgd.step()
        optimizer.zero_grad()
""",
        ),
        Invalid(
            """\
import accelerate.local_sgd as lsgd

for epoch in range(3):
    with lsgd.LocalSGD(accelerator, model, 4):
        for step, batch in enumerate(loader):
            accelerator.backward(model(**batch).loss / 2)
            if step % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
""",
            lines=(4,),
            fixed="""\
import accelerate.local_sgd as lsgd

for epoch in range(3):
    with lsgd.LocalSGD(accelerator, model, 4) as local_sgd:
        for step, batch in enumerate(loader):
            accelerator.backward(model(**batch).loss / 2)
            if step % 2 == 1:
                optimizer.step()
                local_sgd.step()
                optimizer.zero_grad()
""",
        ),
        Invalid(
            """\
from accelerate.local_sgd import LocalSGD as LSGD


def train_epoch(loader):
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()


with LSGD(accelerator, model, 4) as local_sgd:
    train_epoch(loader)
""",
            lines=(10,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for with_node in facts.index.nodes(cst.With):
            for position, item in enumerate(with_node.items):
                call = entered_construction(facts, item, with_node, LOCAL_SGD)
                if call is None or _disabled(call) or not self._trains(with_node):
                    continue
                handles = entered_names(item)
                if handles is None or method_called_or_escapes(facts, with_node, call, handles, STEP):
                    continue
                self._report(with_node, position, item.item, handles)

    # -- what the block is, and what it does with the object ------------------------------------

    def _trains(self, with_node: cst.With) -> bool:
        """The block runs a backward pass or an optimizer step (directly or in a helper); a block that trains
        nothing only averages the parameters once, at exit, which is a use of its own."""
        facts = self.facts
        return facts.trains(with_node.body) or any(
            self._is_optimizer_step(call) for call in facts.reachable_calls(with_node.body)
        )

    # -- the report and its fix ---------------------------------------------------------------------

    def _report(self, with_node: cst.With, position: int, entered: cst.BaseExpression, handles: set[str]) -> None:
        handle = min(handles, key=len) if handles else None
        if handle is None:
            message = (
                "this `with LocalSGD(...)` binds no name, so nothing calls its `step()`: the ranks train "
                "independent copies of the model (gradients are not synchronized inside the block) and are "
                "averaged only when the block exits; write `as local_sgd` and call `local_sgd.step()` after "
                "each optimizer step"
            )
        else:
            message = (
                f"`{handle}.step()` is never called in this `with LocalSGD(...)` block, so the ranks train "
                "independent copies of the model (gradients are not synchronized inside the block) and are "
                f"averaged only when the block exits; call `{handle}.step()` after each optimizer step"
            )
        self.report(entered, message, fix=self._fix(with_node, position, handle))

    def _fix(self, with_node: cst.With, position: int, handle: str | None) -> Fix | None:
        facts = self.facts
        anchor = self._last_optimizer_step(with_node)
        if anchor is None:
            return None
        line = facts.parent(facts.parent(anchor))
        block = facts.parent(line)
        if not isinstance(line, cst.SimpleStatementLine) or not isinstance(block, cst.IndentedBlock):
            return None
        name = handle
        if name is None:
            if not self._name_free(DEFAULT_NAME):
                return None
            name = DEFAULT_NAME
        statement = cst.parse_statement(f"{name}.step()\n")
        at = next(i for i, s in enumerate(block.body) if s is line)
        new_block = block.with_changes(body=(*block.body[: at + 1], statement, *block.body[at + 1 :]))
        if handle is not None:
            return Fix(
                Applicability.SAFE,
                f"Call `{name}.step()` after the optimizer step",
                replacements=((block, new_block),),
            )
        new_with = with_node.deep_replace(block, new_block)
        items = list(new_with.items)
        items[position] = items[position].with_changes(asname=cst.AsName(name=cst.Name(name)))
        return Fix(
            Applicability.SAFE,
            f"Bind the block to `{name}` and call `{name}.step()` after the optimizer step",
            replacements=((with_node, new_with.with_changes(items=items)),),
        )

    def _name_free(self, name: str) -> bool:
        """No variable, parameter, function or import of the file is called ``name`` (``x.name`` and
        ``import a.name`` do not count)."""
        facts = self.facts
        for node in facts.index.nodes(cst.Name):
            if node.value == name and facts.is_variable(node):
                return False
        return True

    def _last_optimizer_step(self, with_node: cst.With) -> cst.Call | None:
        """The last optimizer step written in a loop inside the block (same function), as its own statement."""
        facts = self.facts
        function = facts.enclosing_function(with_node)
        found = None
        for call in facts.calls_within(with_node.body):
            if facts.enclosing_function(call) is not function or not self._is_optimizer_step(call):
                continue
            loop = facts.enclosing_loop(call)
            if loop is None or not facts.is_within(loop, with_node.body):
                continue
            expression = facts.parent(call)
            if isinstance(expression, cst.Expr):
                found = call
        return found

    def _is_optimizer_step(self, call: cst.Call) -> bool:
        """``optimizer.step()``, or ``scaler.step(optimizer)`` (a GradScaler steps the optimizer it is given)."""
        return any(step.call is call and step.kind == "optimizer" for step in self.loop.steps)


def _disabled(call: cst.Call) -> bool:
    """``LocalSGD(..., enabled=False)``: ``step()`` and the block do nothing."""
    enabled = argument_of(call, "enabled", 3)
    return isinstance(enabled, cst.Name) and enabled.value == "False"
