"""LD108 double-loss-scaling: a loss divided by the accumulation steps before `accelerator.backward`, which divides again."""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import ACCELERATOR_CLASSES, argument_of
from lintdist.loop import GA_PLUGIN_CLASSES, Term, integer_literal
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

SCALE_METHODS = frozenset({"scale_mean", "scale_sum"})
MAX_WALK = 12
_UNCLEAN = "the division cannot be deleted on its own"


@dataclass(frozen=True)
class Accumulation:
    """What lintdist knows of an Accelerator's gradient accumulation steps.

    ``state`` is "configured" (the code, its plugin or the launch sets more than one step), "unknown" (nothing sets
    it, but the script opens ``accumulate`` blocks: ``accelerate launch`` may set it) or "none" (one step).
    ``value`` is the number when a literal says it; ``expr`` the expression the code configures it with.
    """

    state: str
    value: int | None = None
    expr: cst.BaseExpression | None = None


@dataclass(frozen=True)
class Division:
    """A division of the loss by the accumulation steps: the divisor ``term`` and whether it is
    ``accelerator.gradient_accumulation_steps`` itself (then it is exactly what accelerate divides by)."""

    term: Term
    exact: bool


def accumulation(rule: Rule, accelerator: cst.BaseExpression | None, at: cst.CSTNode) -> Accumulation:
    """The accumulation of the Accelerator behind ``accelerator`` (the file's only one when it cannot be named).

    The launch wins over the code, as in accelerate: ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` (set by
    ``accelerate launch --gradient_accumulation_steps``) overrides the keyword, and a DeepSpeed config's value
    overrides both.
    """
    loop, facts = rule.loop, rule.facts
    calls: list[cst.Call] = []
    if accelerator is not None:
        calls = [
            o.node
            for o in facts.origins(accelerator, at)
            if isinstance(o.node, cst.Call) and facts.callee_is(o.node, ACCELERATOR_CLASSES)
        ]
    if not calls and len(loop.accelerators) == 1:
        calls = list(loop.accelerators)
    setting = rule.context.settings.get("gradient_accumulation_steps") if rule.context.settings else None
    if setting is not None and str(setting.value).strip().isdigit():
        value = int(str(setting.value).strip())
        return Accumulation("configured", value) if value > 1 else Accumulation("none")
    if setting is not None:
        return Accumulation("unknown")
    for call in calls:
        steps = loop.configured_accumulation(call)
        if steps is not None:
            return Accumulation("configured", integer_literal(steps, facts, call), steps)
    if calls and all(_one_step(rule, call) for call in calls):
        return Accumulation("none")
    blocks = [b for b in loop.accumulate_blocks if accelerator is None or _same(b.accelerator, accelerator)]
    return Accumulation("unknown") if blocks else Accumulation("none")


def _one_step(rule: Rule, call: cst.Call) -> bool:
    """``Accelerator(gradient_accumulation_steps=1)``, or a plugin with ``num_steps=1`` or without ``num_steps``
    (accelerate then keeps 1). An Accelerator built with neither is not: the launch may set the steps."""
    facts = rule.facts
    steps = argument_of(call, "gradient_accumulation_steps", None)
    plugin = argument_of(call, "gradient_accumulation_plugin", None)
    if steps is not None:
        return isinstance(steps, cst.Integer) and int(steps.value) == 1
    if plugin is None:
        return False
    for origin in facts.origins(plugin, call):
        node = origin.node
        if isinstance(node, cst.Call) and facts.callee_is(node, GA_PLUGIN_CLASSES):
            if any(arg.star for arg in node.args):
                return False
            num = argument_of(node, "num_steps", 0)
            return num is None or (isinstance(num, cst.Integer) and int(num.value) == 1)
    return False


def _same(a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
    return get_full_name_for_node(a) == get_full_name_for_node(b) and get_full_name_for_node(a) is not None


def accumulation_division(rule: Rule, loss: cst.BaseExpression, at: cst.CSTNode, acc: Accumulation) -> Division | None:
    """The division of ``loss`` by the accumulation steps, if the loss has one and no factor that undoes it
    (the token-loss recipe multiplies by the steps on purpose: ``loss * GA * world / tokens``)."""
    num: list[Term] = []
    den: list[Term] = []
    _factors(rule, loss, at, 1, num, den, 0)
    if any(_window(rule, term.expr) for term in num):
        return None
    divisions = [t for t in den if _is_steps(rule, t, acc)]
    if not divisions or any(_is_steps(rule, t, acc) for t in num):
        return None
    term = divisions[0]
    return Division(term, _exact(rule, term.expr))


def _factors(rule: Rule, expr: cst.BaseExpression, at: cst.CSTNode, sign: int, num: list, den: list, depth: int):
    """Split a loss into the factors it is multiplied (``num``) and divided (``den``) by, through the assignments
    of its names in the same function (``loss = loss / k``, ``loss /= k``). Unlike ``TrainingLoop.chain`` it needs no
    recognised base: a custom criterion's loss divided by the steps is divided all the same."""
    if depth > MAX_WALK:
        return
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide)):
        _factors(rule, expr.left, at, sign, num, den, depth + 1)
        inverse = isinstance(expr.operator, cst.Divide)
        _factors(rule, expr.right, at, -sign if inverse else sign, num, den, depth + 1)
        return
    if isinstance(expr, (cst.Name, cst.Attribute)) and sign > 0:  # a divisor stays the name it is divided by
        binding = binding_before(rule, expr, at)
        if isinstance(binding, cst.AugAssign) and isinstance(binding.operator, (cst.DivideAssign, cst.MultiplyAssign)):
            _factors(rule, binding.target, binding, sign, num, den, depth + 1)
            inverse = isinstance(binding.operator, cst.DivideAssign)
            _factors(rule, binding.value, binding, -sign if inverse else sign, num, den, depth + 1)
            return
        if isinstance(binding, tuple) and not binding[1] and isinstance(binding[0], cst.Assign):
            _factors(rule, binding[0].value, binding[0], sign, num, den, depth + 1)
            return
    if isinstance(expr, cst.Call):
        returns = [r for f in rule.facts.local_functions(expr) for r in rule.facts.returns.get(f, ())]
        if len(returns) == 1:  # a helper of this file that returns the loss
            _factors(rule, returns[0], returns[0], sign, num, den, depth + 1)
            return
    (num if sign > 0 else den).append(Term(expr, at))


def binding_before(rule: Rule, expr: cst.BaseExpression, at: cst.CSTNode):
    """``TrainingLoop.binding_before``, except that an assignment in the other branch of an ``if`` than ``at``
    (``if a: loss /= k; loss.backward()`` / ``else: accelerator.backward(loss)``) does not reach it: None then."""
    binding = rule.loop.binding_before(expr, at)
    node = binding if isinstance(binding, cst.AugAssign) else binding[0] if binding is not None else None
    if node is not None and exclusive(rule.facts, node, at):
        return None
    return binding


def exclusive(facts, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """``a`` and ``b`` sit in different branches of one ``if``/``elif``/``else`` (or ``try``/``except``)."""
    for ancestor in facts.ancestors(a):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(ancestor, cst.If) and ancestor.orelse is not None:
            branches = (ancestor.body, ancestor.orelse)
        elif isinstance(ancestor, cst.Try):
            branches = (ancestor.body, *ancestor.handlers)
        else:
            continue
        where_a = [i for i, branch in enumerate(branches) if facts.is_within(a, branch)]
        where_b = [i for i, branch in enumerate(branches) if b is branch or facts.is_within(b, branch)]
        if where_a and where_b and where_a != where_b:
            return True
    return False


def _is_steps(rule: Rule, term: Term, acc: Accumulation) -> bool:
    """The factor is the accumulation steps: ``accelerator.gradient_accumulation_steps``, a name that says
    accumulation (``args.gradient_accumulation_steps``, ``accum_iter``), or the literal the Accelerator is built with."""
    if _exact(rule, term.expr) or (acc.expr is not None and _same(term.expr, acc.expr)):
        return True
    literal = integer_literal(term.expr, rule.facts, term.at)
    if literal is not None:
        return acc.value is not None and literal == acc.value and acc.value > 1
    if not _says_accumulation(rule, term.expr, term.at, 0):
        return False
    return rule.loop.factor(term).kind not in {"count", "world"}  # `tokens_per_accum_window` is a count


def _says_accumulation(rule: Rule, expr: cst.BaseExpression, at: cst.CSTNode, depth: int) -> bool:
    """A name read in ``expr`` (or in what a name of it was last assigned) says accumulation. Attribute names
    after a dot are not variables: ``outputs.loss`` does not read the variable ``loss``."""
    facts = rule.facts
    attributes = {id(a.attr) for a in facts.within(expr, cst.Attribute)}
    for node in facts.within(expr, cst.Name, cst.Attribute):
        if id(node) in attributes:
            continue
        name = (get_full_name_for_node(node) or "").lower()
        if "accum" in name or "gradient_accumulation" in name:
            return True
        if depth == 0 and isinstance(node, cst.Name):
            binding = binding_before(rule, node, at)
            if (
                isinstance(binding, tuple)
                and not binding[1]
                and _says_accumulation(rule, binding[0].value, binding[0], depth + 1)
            ):
                return True
    return False


def _exact(rule: Rule, expr: cst.BaseExpression) -> bool:
    """``<accelerator>.gradient_accumulation_steps``."""
    return (
        isinstance(expr, cst.Attribute)
        and expr.attr.value == "gradient_accumulation_steps"
        and _accelerator_like(rule, expr.value, expr)
    )


def _accelerator_like(rule: Rule, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
    if rule.facts.is_accelerator(expr, at):
        return True
    name = (get_full_name_for_node(expr) or "").rsplit(".", 1)[-1]
    return "accelerator" in name.lower()


def _window(rule: Rule, expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and rule.facts.method_name(expr) in SCALE_METHODS


def _operand_text(expr: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(expr)


# -- removing the division ------------------------------------------------------------------------


def division_removal(
    rule: Rule, division: Division, site: cst.Call, new_call: cst.Call | None = None
) -> tuple[tuple[tuple[cst.CSTNode, cst.CSTNode], ...] | None, str]:
    """The replacements that delete the division (and, with ``new_call``, replace the backward call ``site`` in
    the same edit), or None and why not: the division is not ``x / k`` or ``x /= k`` written in the backward's
    function, or the divided value is read elsewhere (deleting it would change that read too)."""
    facts = rule.facts
    term = division.term
    node = facts.parent(term.expr)
    statement = rule.loop.statement_of(term.expr)
    if statement is None or facts.enclosing_function(term.expr) is not facts.enclosing_function(site):
        return None, "the division is written in another function"
    removed: cst.BaseSmallStatement | None = None
    target: cst.BaseExpression | None = None
    if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.DivideAssign) and node.value is term.expr:
        removed, target = node, node.target
    elif isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Divide) and node.right is term.expr:
        if isinstance(statement, cst.Assign):
            if len(statement.targets) != 1:
                return None, _UNCLEAN
            target = statement.targets[0].target
            if statement.value is node and _same(target, node.left):
                removed = statement
        elif not facts.is_within(site, statement):
            return None, _UNCLEAN
    else:
        return None, _UNCLEAN
    if target is not None and not _read_only_by(rule, target, statement, site):
        return None, "the divided loss is also read elsewhere, whose value would change"
    if removed is None:
        return _combine(rule, ((node, _keep_parens(node.left, node)),), site, new_call), ""
    replacements = _remove_statement(rule, removed, site, new_call)
    return replacements, "" if replacements is not None else _UNCLEAN


def _remove_statement(
    rule: Rule, removed: cst.BaseSmallStatement, site: cst.Call, new_call: cst.Call | None
) -> tuple[tuple[cst.CSTNode, cst.CSTNode], ...] | None:
    """Delete a small statement; its line's comments move to the next statement of the block."""
    facts = rule.facts
    line = facts.parent(removed)
    if not isinstance(line, cst.SimpleStatementLine):
        return None
    if len(line.body) > 1:
        kept = [s for s in line.body if s is not removed]
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return _combine(rule, ((line, line.with_changes(body=kept)),), site, new_call)
    block = facts.parent(line)
    if not isinstance(block, (cst.IndentedBlock, cst.Module)) or len(block.body) == 1:
        return None
    body = list(block.body)
    index = next(i for i, s in enumerate(body) if s is line)
    carried = list(line.leading_lines)
    if line.trailing_whitespace.comment is not None:
        carried.append(cst.EmptyLine(comment=line.trailing_whitespace.comment))
    del body[index]
    if carried and index < len(body):
        following = list(body[index].leading_lines)
        if following and _blank(carried[-1]) and _blank(following[0]):
            carried.pop()  # one blank line where the deleted statement stood between two
        body[index] = body[index].with_changes(leading_lines=(*carried, *following))
    return _combine(rule, ((block, block.with_changes(body=body)),), site, new_call)


def _blank(line: cst.EmptyLine) -> bool:
    return line.comment is None


def _combine(rule: Rule, replacements, site: cst.Call, new_call: cst.Call | None):
    """Add the backward call's replacement to the division's, nested into it when one holds the other."""
    if new_call is None:
        return replacements
    ((old, new),) = replacements
    if old is site:
        return ((site, new_call),)
    if rule.facts.is_within(site, old):
        return ((old, new.deep_replace(site, new_call)),)
    if rule.facts.is_within(old, site):
        return ((site, new_call.deep_replace(old, new)),)
    return ((old, new), (site, new_call))


def _keep_parens(expr: cst.BaseExpression, around: cst.BinaryOperation) -> cst.BaseExpression:
    """The left operand in place of ``(left / k)``: the parentheses stay only where the operand needs them."""
    if around.lpar and not expr.lpar and not isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return expr.with_changes(lpar=around.lpar, rpar=around.rpar)
    return expr


def _read_only_by(rule: Rule, target: cst.BaseExpression, statement: cst.CSTNode, site: cst.Call) -> bool:
    """Between the division and the next assignment of ``target``, the divided value is read by ``site`` alone
    (a loss also logged, summed for a report or returned would change its value)."""
    facts = rule.facts
    key = get_full_name_for_node(target)
    if key is None:
        return False
    function = facts.enclosing_function(site)
    scope = function if function is not None else facts.index.module
    order, end_of = facts.index.order, facts.index.end
    # reads up to the first assignment after the backward (one before it would pass the divided value on)
    start, after = end_of(statement), end_of(site)
    end = min((order(b.statement) for b in facts.bindings(key, site) if order(b.statement) >= after), default=None)
    attributes = {id(a.attr) for a in facts.within(scope, cst.Attribute)}
    for node in facts.within(scope, cst.Name, cst.Attribute):
        position = order(node)
        if position < start or (end is not None and position >= end) or id(node) in attributes:
            continue
        if get_full_name_for_node(node) != key or facts.is_within(node, site) or _assigned(facts, node):
            continue
        return False
    return True


def _assigned(facts, node: cst.CSTNode) -> bool:
    parent = facts.parent(node)
    return isinstance(parent, (cst.AssignTarget, cst.AugAssign)) and parent.target is node


class DoubleLossScaling(Rule):
    """
    ## What it does
    Reports a loss divided by the gradient accumulation steps (`loss = loss /
    k` or `loss /= k`, also inline) that then goes through
    `accelerator.backward(loss)` while that Accelerator accumulates gradients:
    `Accelerator(gradient_accumulation_steps=k)`, a
    `GradientAccumulationPlugin(num_steps=k)`, a launch that sets
    `gradient_accumulation_steps`, or `accumulate` blocks with no setting in
    sight. The divisor must be the accumulation steps:
    `accelerator.gradient_accumulation_steps`, a name that says accumulation
    (`args.gradient_accumulation_steps`, `accum_iter`), or the literal the
    Accelerator is built with. The report points at the division. It is a
    warning, without a fix, when no setting of the steps is in sight.

    ## Why is this bad?
    `accelerator.backward` already divides every loss by
    `gradient_accumulation_steps` (under DeepSpeed the engine does, with the
    same value): a second division makes each optimizer step's gradient k
    times too small. Nothing fails; training is only slower, like a learning
    rate k times lower, and the clipping threshold and the warm-up no longer
    mean what they say. Not reported: a division by something else (a token
    count, the world size, a literal that is not the configured steps), the
    token-level recipe that multiplies by the steps on purpose (`loss *
    accelerator.gradient_accumulation_steps * accelerator.num_processes /
    num_tokens`), a loss scaled by `lintdist.runtime`'s `TokenLossWindow`, and
    an Accelerator that is built with one step and no `accumulate` block (the
    manual accumulation of accelerate's own `nlp_example.py` divides once,
    correctly).

    ## Example
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            loss = loss / args.gradient_accumulation_steps
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    Safe: the fix deletes the division (the whole statement for `loss = loss
    / k` and `loss /= k`, the `/ k` alone elsewhere), which restores the mean
    over the accumulation window that accelerate computes. It is offered when
    the Accelerator's steps are set in the code or the launch, or when the
    divisor is `accelerator.gradient_accumulation_steps` itself; not when the
    steps are unknown (no setting in sight: if the launch does not set them,
    the `accumulate` blocks do nothing and the division is the only scaling),
    nor when the divided loss is also read elsewhere (logged or summed: its
    value would change), nor when the division sits in another function.

    ## References
    - accelerate `Accelerator.backward`: `loss = loss / self.gradient_accumulation_steps`
      unless DeepSpeed, whose `engine.backward` scales by the same steps
    - accelerate guide "Performing gradient accumulation with Accelerate"
    """

    code = "LD108"
    name = "double-loss-scaling"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = (re.compile(r"backward\s*\("),)
    also_triggers = (("accelerat",), ("/",))

    VALID = (
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for step, batch in enumerate(loader):
    loss = model(**batch).loss
    loss = loss / gradient_accumulation_steps
    accelerator.backward(loss)
    if step % gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        num_items = accelerator.gather(batch["labels"].ne(-100).sum()).sum()
        loss = model(**batch).loss * batch["labels"].ne(-100).sum()
        loss = loss * accelerator.gradient_accumulation_steps * accelerator.num_processes / num_items
        accelerator.backward(loss)
        optimizer.step()
"""
        ),
        Valid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / 2
        accelerator.backward(loss)
        optimizer.step()
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        # average over the window
        loss = loss / args.gradient_accumulation_steps
        accelerator.backward(loss)
        optimizer.step()
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        # average over the window
        accelerator.backward(loss)
        optimizer.step()
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        loss /= 4
        accelerator.backward(loss)
""",
            lines=(7,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss
        accelerator.backward(loss)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        accelerator.backward(outputs.loss / accelerator.gradient_accumulation_steps)
""",
            lines=(7,),
            fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    with accelerator.accumulate(model):
        outputs = model(**batch)
        accelerator.backward(outputs.loss)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / args.grad_accum_steps
        accelerator.backward(loss)
""",
            lines=(6,),
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=8)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(**batch).loss / 8
        accelerator.backward(loss)
        total_loss += loss.detach()
""",
            lines=(6,),
        ),
    )

    def finish(self) -> None:
        seen: set[int] = set()
        for site in self.loop.backward_sites:
            if site.kind != "accelerator" or site.loss is None:
                continue
            statement = self.loop.statement_of(site.call)
            if statement is None:
                continue
            acc = accumulation(self, site.receiver, site.call)
            if acc.state == "none":
                continue
            division = accumulation_division(self, site.loss, statement, acc)
            if division is None or id(division.term.expr) in seen:
                continue
            seen.add(id(division.term.expr))
            self._report(site.call, site.receiver, division, acc)

    def _report(self, call: cst.Call, receiver: cst.BaseExpression, division: Division, acc: Accumulation) -> None:
        divisor = _operand_text(division.term.expr)
        accelerator = get_full_name_for_node(receiver) or "accelerator"
        where = self.facts.parent(division.term.expr)
        node = where if isinstance(where, (cst.BinaryOperation, cst.AugAssign)) else division.term.expr
        fix = None
        certain = acc.state == "configured" or division.exact
        if certain:
            replacements, why_not = division_removal(self, division, call)
            if replacements is not None:
                fix = Fix(Applicability.SAFE, f"Delete the division by `{divisor}`", replacements=replacements)
            message = (
                f"the loss is divided by `{divisor}` and `{accelerator}.backward` divides it by the "
                "accumulation steps again, so every optimizer step's gradient is that many times too small; "
                f"delete the division: `{accelerator}.backward` already averages over the accumulation window"
            )
            if fix is None:
                message += f" (not fixed automatically: {why_not})"
            self.report(node, message, fix=fix)
        else:
            message = (
                f"the loss is divided by `{divisor}`, and `{accelerator}.backward` divides by the Accelerator's "
                "accumulation steps as well, which nothing in sight sets (the `accumulate` blocks say they are "
                "meant to be more than 1, and `accelerate launch` may set them): if they are, the gradient is that "
                "many times too small; set the steps on the Accelerator "
                f"(`Accelerator(gradient_accumulation_steps={divisor})`) and delete the division"
            )
            self.report(node, message, severity=Severity.WARNING)
