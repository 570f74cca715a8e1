"""New items in a bracket (call arguments, dict elements), laid out as the bracket's own items are.

A fix that adds ``sync_each_batch=True`` to a call written one argument per line must add it on a line of
its own, with the same indentation, and keep a trailing comma trailing; one written on one line stays on one
line. These edits build the new item list; the caller puts it back with ``with_changes``.
"""

from __future__ import annotations

import libcst as cst


def equal_like(arg: cst.Arg) -> cst.AssignEqual | cst.MaybeSentinel:
    """The ``=`` of a keyword argument, for a new keyword spaced the same way."""
    return arg.equal if isinstance(arg.equal, cst.AssignEqual) else cst.MaybeSentinel.DEFAULT


def item_indent(opening: cst.BaseParenthesizableWhitespace, items) -> cst.SimpleWhitespace | None:
    """The indentation of the items of a bracket written one per line; None when they sit on one line."""
    if isinstance(opening, cst.ParenthesizedWhitespace):
        return opening.last_line
    for item in items[:-1]:
        comma = item.comma
        if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
            return comma.whitespace_after.last_line
    return None


def appended(items, new, opening: cst.BaseParenthesizableWhitespace) -> list:
    """``items`` (call arguments or dict elements) with ``new`` after the last one, in the bracket's layout;
    ``opening`` is the whitespace after the opening bracket."""
    items = list(items)
    if not items:
        return [new]
    last = items[-1]
    indent = item_indent(opening, items)
    closing = getattr(last, "whitespace_after_arg", None)
    if isinstance(last.comma, cst.Comma):  # a trailing comma stays trailing
        after = last.comma.whitespace_after
        if indent is not None and isinstance(after, cst.ParenthesizedWhitespace):
            between = cst.Comma(
                whitespace_before=last.comma.whitespace_before,
                whitespace_after=after.with_changes(last_line=indent),
            )
            trailing = cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(last_line=after.last_line))
            return [*items[:-1], last.with_changes(comma=between), new.with_changes(comma=trailing)]
        between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        return [*items[:-1], last.with_changes(comma=between), new.with_changes(comma=last.comma)]
    if indent is not None and isinstance(closing, cst.ParenthesizedWhitespace):
        between = cst.Comma(whitespace_after=closing.with_changes(last_line=indent))
        moved = last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
        return [*items[:-1], moved, new.with_changes(whitespace_after_arg=closing)]
    if indent is not None and closing is None:  # a dict one per line: the break before `}` belongs to the brace
        between = cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(last_line=indent))
        return [*items[:-1], last.with_changes(comma=between), new]
    between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    if closing is not None:
        moved = last.with_changes(comma=between, whitespace_after_arg=cst.SimpleWhitespace(""))
        return [*items[:-1], moved, new.with_changes(whitespace_after_arg=closing)]
    return [*items[:-1], last.with_changes(comma=between), new]


def inserted_after(args, index: int, new: cst.Arg, opening: cst.BaseParenthesizableWhitespace) -> list:
    """Call arguments with ``new`` right after ``args[index]``, in the call's layout."""
    args = list(args)
    if index == len(args) - 1:
        return appended(args, new, opening)
    before = args[index]
    comma = before.comma
    if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
        # the comment after `before` stays on its line; the new argument gets a plain line break
        comma_new = comma.with_changes(
            whitespace_after=comma.whitespace_after.with_changes(first_line=cst.TrailingWhitespace())
        )
        return [*args[: index + 1], new.with_changes(comma=comma_new), *args[index + 1 :]]
    return [*args[: index + 1], new.with_changes(comma=comma), *args[index + 1 :]]
