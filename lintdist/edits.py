"""Fix-building helpers that several rules share: source edits that keep the layout and comments of the code.

Each helper returns new nodes (or replacements for a ``Fix``) and None where the edit cannot be made cleanly;
the rule decides whether to offer a fix at all.
"""

from __future__ import annotations

import io
import tokenize

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts
from lintdist.loop import Division

Replacements = tuple[tuple[cst.CSTNode, cst.CSTNode], ...]
_UNCLEAN = "the division cannot be deleted on its own"


def has_comment(code: str) -> bool:
    """The source of a node holds a comment (a ``#`` inside a string literal is not one)."""
    if "#" not in code:
        return False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return True  # cannot tell: as if it held one, so that no fix deletes it
    return any(token.type == tokenize.COMMENT for token in tokens)


def without_argument(call: cst.Call, dropped: cst.Arg) -> cst.Call | None:
    """``call`` without one argument, keeping the layout: the last argument hands its comma (and the
    whitespace before the closing parenthesis) to the one before it. None when a comment would be lost."""
    args = list(call.args)
    index = args.index(dropped)
    del args[index]
    if index == len(args) and args:
        previous = args[-1]
        if isinstance(dropped.comma, cst.Comma):
            comma = dropped.comma
            before = previous.comma.whitespace_after if isinstance(previous.comma, cst.Comma) else None
            after = comma.whitespace_after
            if isinstance(before, cst.ParenthesizedWhitespace) and isinstance(after, cst.ParenthesizedWhitespace):
                # keep the previous line's own comment, end the line as the dropped argument's did
                comma = comma.with_changes(
                    whitespace_after=before.with_changes(indent=after.indent, last_line=after.last_line)
                )
            args[-1] = previous.with_changes(comma=comma)
        else:
            if isinstance(previous.comma, cst.Comma) and has_comment(cst.Module([]).code_for_node(previous.comma)):
                return None
            args[-1] = previous.with_changes(
                comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=dropped.whitespace_after_arg
            )
    return call.with_changes(args=args)


# -- deleting a division of the loss ----------------------------------------------------------------


def with_arg_changes(call: cst.Call, changes: dict[int, cst.Arg | None]) -> cst.Call:
    """The call with some arguments replaced (by id) or dropped (None), keeping the comma layout."""
    args = []
    for arg in call.args:
        if id(arg) in changes:
            if changes[id(arg)] is not None:
                args.append(changes[id(arg)])
        else:
            args.append(arg)
    if args and call.args and changes.get(id(call.args[-1]), call.args[-1]) is None:
        # the last argument went: its comma (or the lack of one) moves to the new last argument
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)


def with_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with a new keyword argument ``name=value`` first, spaced as the call's arguments are."""
    return with_arg_first(call, keyword_arg(name, value))


def with_keyword_last(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """``call`` with a new keyword argument ``name=value`` after its arguments, separated as its other arguments
    are (a trailing comma moves to the new argument, with its line break)."""
    new_arg = cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )
    args = list(call.args)
    if not args:
        return call.with_changes(args=(new_arg,))
    last = args[-1]
    new_arg = new_arg.with_changes(comma=last.comma)
    if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
        separator = args[-2].comma
    elif isinstance(last.comma, cst.Comma):
        separator = last.comma  # a lone argument with a trailing comma: keep its layout
    else:
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    args[-1] = last.with_changes(comma=separator)
    return call.with_changes(args=(*args, new_arg))


def remove_division(
    facts: PythonFacts, division: Division, site: cst.Call, new_call: cst.Call | None = None
) -> tuple[Replacements | None, str]:
    """The replacements that delete the division (and, with ``new_call``, replace the backward call ``site`` in
    the same edit), or None and why not: the division is not ``x / k`` or ``x /= k`` written in the backward's
    function, or the divided value is read elsewhere (deleting it would change that read too)."""
    term = division.term
    node = facts.parent(term.expr)
    statement = next((a for a in facts.ancestors(term.expr) if isinstance(a, cst.BaseSmallStatement)), None)
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
    if target is not None and not _read_only_by(facts, target, statement, site):
        return None, "the divided loss is also read elsewhere, whose value would change"
    if removed is None:
        return _combine(facts, ((node, _keep_parens(node.left, node)),), site, new_call), ""
    replacements = _remove_statement(facts, removed, site, new_call)
    return replacements, "" if replacements is not None else _UNCLEAN


def _remove_statement(
    facts: PythonFacts, removed: cst.BaseSmallStatement, site: cst.Call, new_call: cst.Call | None
) -> Replacements | None:
    """Delete a small statement; its line's comments move to the next statement of the block."""
    line = facts.parent(removed)
    if not isinstance(line, cst.SimpleStatementLine):
        return None
    if len(line.body) > 1:
        kept = [s for s in line.body if s is not removed]
        kept[-1] = kept[-1].with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return _combine(facts, ((line, line.with_changes(body=kept)),), site, new_call)
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
    return _combine(facts, ((block, block.with_changes(body=body)),), site, new_call)


def _blank(line: cst.EmptyLine) -> bool:
    return line.comment is None


def _combine(facts: PythonFacts, replacements: Replacements, site: cst.Call, new_call: cst.Call | None) -> Replacements:
    """Add the backward call's replacement to the division's, nested into it when one holds the other."""
    if new_call is None:
        return replacements
    ((old, new),) = replacements
    if old is site:
        return ((site, new_call),)
    if facts.is_within(site, old):
        return ((old, new.deep_replace(site, new_call)),)
    if facts.is_within(old, site):
        return ((site, new_call.deep_replace(old, new)),)
    return ((old, new), (site, new_call))


def _keep_parens(expr: cst.BaseExpression, around: cst.BinaryOperation) -> cst.BaseExpression:
    """The left operand in place of ``(left / k)``: the parentheses stay only where the operand needs them."""
    if around.lpar and not expr.lpar and not isinstance(expr, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return expr.with_changes(lpar=around.lpar, rpar=around.rpar)
    return expr


def _read_only_by(facts: PythonFacts, target: cst.BaseExpression, statement: cst.CSTNode, site: cst.Call) -> bool:
    """Between the division and the next assignment of ``target``, the divided value is read by ``site`` alone
    (a loss also logged, summed for a report or returned would change its value)."""
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


def _assigned(facts: PythonFacts, node: cst.CSTNode) -> bool:
    parent = facts.parent(node)
    return isinstance(parent, (cst.AssignTarget, cst.AugAssign)) and parent.target is node


def _same(a: cst.BaseExpression, b: cst.BaseExpression) -> bool:
    return get_full_name_for_node(a) == get_full_name_for_node(b) and get_full_name_for_node(a) is not None


class _ReplaceNodes(cst.CSTTransformer):
    def __init__(self, replacements: dict[int, cst.CSTNode]) -> None:
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        return self.replacements.get(id(original_node), updated_node)


def replace_nodes(tree: cst.CSTNode, replacements) -> cst.CSTNode:
    """``tree`` with each ``(old, new)`` pair applied in one pass, ``old`` found by identity (a node of ``tree``).

    How the engine applies a fix's replacements; a rule uses it to make several edits inside one node it
    replaces (``deep_replace`` copies the tree, so a second original node would no longer be found)."""
    return tree.visit(_ReplaceNodes({id(old): new for old, new in replacements}))


def guarded_call(
    facts: PythonFacts, call: cst.Call, test: str, new_call: cst.Call | None = None
) -> tuple[cst.CSTNode, cst.CSTNode] | None:
    """The replacement that puts ``call`` (as ``new_call`` when given) under ``if <test>:``, when the call is its
    line's only statement and its result is not kept; None otherwise."""
    expression = facts.parent(call)
    line = facts.parent(expression)
    if not (isinstance(expression, cst.Expr) and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
        return None
    value = new_call if new_call is not None else call
    inner = line.with_changes(
        leading_lines=(), body=(expression.with_changes(value=value, semicolon=cst.MaybeSentinel.DEFAULT),)
    )
    guard = cst.If(
        test=cst.parse_expression(test), body=cst.IndentedBlock(body=(inner,)), leading_lines=line.leading_lines
    )
    return line, guard


def unparenthesized(expr: cst.BaseExpression) -> cst.BaseExpression:
    """The expression without its own parentheses, as an argument needs none."""
    return expr.with_changes(lpar=(), rpar=()) if getattr(expr, "lpar", None) else expr


def receiver_as_argument(call: cst.Call, receiver: cst.BaseExpression, callee: str) -> cst.Call | None:
    """``<callee>(x, **kw)`` in place of ``x.method(**kw)``, where ``receiver`` is ``x``; None when the call passes
    a positional argument (it would no longer go to the same parameter)."""
    if any(arg.keyword is None for arg in call.args):
        return None
    first = cst.Arg(value=unparenthesized(receiver))
    if call.args:
        first = first.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(func=cst.parse_expression(callee), args=(first, *call.args))


def module_import(module_bindings: list, module: str) -> tuple[tuple[str, None], ...] | None:
    """The import a fix that spells ``module.x`` needs, given the module-level bindings of that name: none when a
    plain ``import module`` binds it, ``((module, None),)`` when nothing does, None when the name is something else."""
    if not module_bindings:
        return ((module, None),)
    plain = all(
        isinstance(b.node, cst.Import)
        and b.alias is not None
        and b.alias.asname is None
        and get_full_name_for_node(b.alias.name) == module
        for b in module_bindings
    )
    return () if plain else None


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """A keyword argument ``name=value`` written without spaces around ``=``."""
    return cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def with_last_item(node: cst.Call | cst.List | cst.Set, item: cst.Arg | cst.Element):
    """A call, list or set with ``item`` (an ``Arg`` or ``Element``) after its others: the last one takes the
    separator of the two before it (``", "`` after a lone one) and ``item`` takes a trailing comma."""
    field = "args" if isinstance(node, cst.Call) else "elements"
    items = list(getattr(node, field))
    if not items:
        return node.with_changes(**{field: [item]})
    last = items[-1]
    between = items[-2].comma if len(items) > 1 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    items[-1] = last.with_changes(comma=between)
    trailing = last.comma if isinstance(last.comma, cst.Comma) else cst.MaybeSentinel.DEFAULT
    return node.with_changes(**{field: [*items, item.with_changes(comma=trailing)]})


# Tensor methods a fix may repeat (`labels.to(device)` twice gives the same tensor twice).
REPEATABLE_METHODS = frozenset({"to", "cuda", "cpu", "long", "contiguous"})


def repeatable(expr: cst.BaseExpression) -> bool:
    """An expression a fix may write twice: names, attributes, subscripts by literals, names and slices, and
    ``REPEATABLE_METHODS`` calls on those."""
    if isinstance(expr, cst.Name):
        return True
    if isinstance(expr, cst.Attribute):
        return repeatable(expr.value)
    if isinstance(expr, cst.Subscript):
        return repeatable(expr.value) and all(_repeatable_slice(element.slice) for element in expr.slice)
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in REPEATABLE_METHODS
    ):
        return repeatable(expr.func.value) and all(not arg.star and _repeatable_index(arg.value) for arg in expr.args)
    return False


def _repeatable_slice(part: cst.BaseSlice) -> bool:
    if isinstance(part, cst.Index):
        return _repeatable_index(part.value)
    return all(bound is None or _repeatable_index(bound) for bound in (part.lower, part.upper, part.step))


def _repeatable_index(expr: cst.BaseExpression) -> bool:
    if isinstance(expr, (cst.SimpleString, cst.Integer, cst.Ellipsis)):
        return True
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return repeatable(expr)
    return (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
    )


def with_arg_appended(call: cst.Call, added: cst.Arg) -> cst.Call:
    """``call`` with ``added`` after its last argument: after ``", "``, or on a line of its own when the arguments
    are one per line with a trailing comma (the last argument keeps its comment; ``added`` takes the trailing
    comma)."""
    args = list(call.args)
    if not args:
        return call.with_changes(args=[added])
    last = args[-1]
    if not isinstance(last.comma, cst.Comma):
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return call.with_changes(args=[*args, added])
    after = last.comma.whitespace_after
    indent = call.whitespace_before_args
    if isinstance(after, cst.ParenthesizedWhitespace) and isinstance(indent, cst.ParenthesizedWhitespace):
        between = after.with_changes(empty_lines=[], last_line=indent.last_line)
        closing = after.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=[])
        args[-1] = last.with_changes(comma=last.comma.with_changes(whitespace_after=between))
        return call.with_changes(args=[*args, added.with_changes(comma=cst.Comma(whitespace_after=closing))])
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, added.with_changes(comma=last.comma)])


def with_arg_first(call: cst.Call, arg: cst.Arg) -> cst.Call:
    """``call`` with ``arg`` before its arguments, followed by ``", "`` (or the line break the call opens with)."""
    if call.args:
        spacing = call.whitespace_before_args
        after = spacing if isinstance(spacing, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" ")
        arg = arg.with_changes(comma=cst.Comma(whitespace_after=after))
    return call.with_changes(args=(arg, *call.args))


# Operators that bind at least as tightly as `+`: their operations need no parentheses as operands of a sum.
_PRODUCTS = (cst.Multiply, cst.Divide, cst.FloorDivide, cst.Modulo, cst.Power, cst.MatrixMultiply)


def summed(operands: list[cst.BaseExpression]) -> cst.BaseExpression:
    """``a + b + ...`` of the operands, each in parentheses where ``+`` would otherwise regroup it."""
    total = _operand(operands[0])
    for operand in operands[1:]:
        total = cst.BinaryOperation(total, cst.Add(), _operand(operand))
    return total


def _operand(expr: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript, cst.Integer, cst.Float, cst.Call)) or expr.lpar:
        return expr
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _PRODUCTS):
        return expr
    return expr.with_changes(lpar=(cst.LeftParen(),), rpar=(cst.RightParen(),))


def without_statements(statements: list[cst.BaseStatement], dropped: set[int]) -> list[cst.BaseStatement]:
    """``statements`` without those at the ``dropped`` indexes; their comments (the lines above them and the one
    at their end) move above the next statement kept."""
    kept: list[cst.BaseStatement] = []
    carried: list[cst.EmptyLine] = []
    for index, statement in enumerate(statements):
        if index in dropped:
            carried.extend(statement.leading_lines)
            comment = getattr(statement, "trailing_whitespace", None)
            if comment is not None and comment.comment is not None:
                carried.append(cst.EmptyLine(comment=comment.comment))
            continue
        if carried:
            statement = statement.with_changes(leading_lines=(*carried, *statement.leading_lines))
            carried = []
        kept.append(statement)
    return kept
