"""LD202 sampler-with-shuffle: a DataLoader given both `shuffle=True` and a sampler, which raises when it is built."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.arguments import passed_arg, values_passed
from lintdist.edits import has_comment, without_argument
from lintdist.invariance import read_keys
from lintdist.loaders import builds_dataloader
from lintdist.loop_bounds import full_names
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.samplers import keeps_order, sampler_kinds
from lintdist.values import constant_truth, truth

# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, ...): positions of the arguments read here.
SHUFFLE, SAMPLER, BATCH_SAMPLER = 2, 3, 4


class SamplerWithShuffle(Rule):
    """
    ## What it does
    Reports `shuffle=True` (or any value that is certainly true) given to a
    `torch.utils.data.DataLoader` together with a `sampler=` or a
    `batch_sampler=` that is not `None`, and a `shuffle=` expression that can
    be true (`shuffle=(split == "train")`, an error; `shuffle=args.shuffle`, a
    warning) beside a sampler that can be set. The report points at the
    `shuffle` argument. Aliases (`import torch.utils.data as tud`,
    `from torch.utils.data import DataLoader as DL`), values passed through
    variables and helper parameters, and subclasses of `DataLoader` defined in
    the file without their own `__init__` are followed.

    ## Why is this bad?
    `DataLoader.__init__` raises `ValueError: sampler option is mutually
    exclusive with shuffle` (with a `batch_sampler`: `batch_sampler option is
    mutually exclusive with batch_size, shuffle, sampler, and drop_last`),
    whatever the sampler: a `DistributedSampler(..., shuffle=False)` raises
    just the same. The order comes from the sampler, so `shuffle` can only be
    false there. In a script that picks `DistributedSampler(...) if
    distributed else None` the crash happens only in the distributed run,
    typically on the cluster, after the job waited in the queue. Reported as a
    warning when the sampler is a helper's parameter that defaults to `None`
    and has no caller in the file. Not reported: a flag computed from the
    sampler or from the test that sets it (`shuffle=(sampler is None)`,
    `shuffle = is_train and sampler is None`, `shuffle=not distributed` beside
    `DistributedSampler(ds) if distributed else None`, a sampler built only
    under `if not shuffle_flag:`, a branch that builds the sampler and sets
    the flag to `False`), a helper's `shuffle`
    and `sampler` parameters that none of its calls in the file passes
    together (and that no visible call passes at all), a sampler that may come
    in through `**kwargs`, and loaders of other libraries.

    ## Example
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, sampler=sampler)
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(dataset)  # shuffles by default; call set_epoch every epoch
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    ```

    ## Fix safety
    Safe: the call always raised, and the sampler decides the order either way.
    When every sampler the call can get is built in sight (a class such as
    `DistributedSampler(...)` instantiated in this file), the fix deletes
    `shuffle=True` (a positional `True` becomes `False`). When the sampler may
    be `None` (a conditional, a parameter, a helper of another module) and is a
    plain name, the fix writes `shuffle=sampler is None` instead, which keeps
    the shuffling of the run without a sampler. There is no fix when the
    sampler itself says it keeps the order (`DistributedSampler(...,
    shuffle=False)`, `SequentialSampler`): the call asks for both orders, and
    only its author knows which one was meant; nor when `shuffle` comes in
    through a parameter (callers out of sight may pass `False`), nor when a
    comment sits on the `shuffle` argument.

    For a `shuffle=` expression that can be true: beside a conditional
    sampler the fix keeps single-process shuffling,
    `shuffle=(<expr>) and <sampler> is None` (safe: the same loader without a
    sampler, no error with one); beside a sampler that is always set it drops
    `shuffle` (safe: where the flag was true the call raised).

    ## References
    - `torch/utils/data/dataloader.py`, `DataLoader.__init__`: "sampler option
      is mutually exclusive with shuffle"
    - `torch.utils.data.distributed.DistributedSampler` (`shuffle=True` by default)
    """

    code = "LD202"
    name = "sampler-with-shuffle"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("DataLoader",)
    also_triggers = (("ampler",),)

    VALID = (
        Valid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
"""
        ),
        Valid(
            """\
import torch.utils.data

sampler = torch.utils.data.DistributedSampler(dataset) if distributed else None
loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=(sampler is None), sampler=sampler)
"""
        ),
        Valid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset) if args.distributed else None
loader = DataLoader(dataset, shuffle=not args.distributed, sampler=sampler)
val_loader = DataLoader(val_set, shuffle=False, sampler=DistributedSampler(val_set, shuffle=False))
"""
        ),
        Valid(
            """\
from torch.utils.data import DataLoader


def build(dataset, sampler=None, shuffle=True):
    return DataLoader(dataset, sampler=sampler, shuffle=shuffle)


train = build(train_set)
"""
        ),
        Valid(
            """\
from torch.utils.data import DataLoader

loader = DataLoader(dataset, shuffle=True, sampler=None, **loader_options)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, shuffle=True, sampler=sampler)
""",
            lines=(4,),
            fixed="""\
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
""",
        ),
        Invalid(
            """\
import torch.utils.data as tud

loader = tud.DataLoader(
    dataset,
    batch_size=32,
    sampler=tud.distributed.DistributedSampler(dataset),  # one shard per rank
    shuffle=True,
)
""",
            lines=(7,),
            fixed="""\
import torch.utils.data as tud

loader = tud.DataLoader(
    dataset,
    batch_size=32,
    sampler=tud.distributed.DistributedSampler(dataset),  # one shard per rank
)
""",
        ),
        Invalid(
            """\
from torch.utils.data import DataLoader as DL
from torch.utils.data.distributed import DistributedSampler

train_sampler = DistributedSampler(train_set) if args.distributed else None
loader = DL(train_set, args.batch_size, True, train_sampler, num_workers=4)
""",
            lines=(5,),
            fixed="""\
from torch.utils.data import DataLoader as DL
from torch.utils.data.distributed import DistributedSampler

train_sampler = DistributedSampler(train_set) if args.distributed else None
loader = DL(train_set, args.batch_size, train_sampler is None, train_sampler, num_workers=4)
""",
        ),
        Invalid(
            """\
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

SHUFFLE = True
batches = BatchSampler(RandomSampler(dataset), batch_size=16, drop_last=True)
loader = DataLoader(dataset, batch_sampler=batches, shuffle=SHUFFLE)
""",
            lines=(5,),
            fixed="""\
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

SHUFFLE = True
batches = BatchSampler(RandomSampler(dataset), batch_size=16, drop_last=True)
loader = DataLoader(dataset, batch_sampler=batches)
""",
        ),
        Invalid(
            """\
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(dataset, shuffle=True, sampler=DistributedSampler(dataset, shuffle=False))
""",
            lines=(3,),
        ),
        Invalid(
            """\
from torch.utils.data import DataLoader


def make_loader(dataset, sampler, shuffle=True):
    return DataLoader(dataset, batch_size=8, shuffle=shuffle, sampler=sampler)


loader = make_loader(dataset, sampler)
""",
            lines=(5,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not builds_dataloader(facts, call):
                continue
            shuffle = passed_arg(call, "shuffle", SHUFFLE)
            flag = truth(facts, shuffle.value, call) if shuffle is not None else False
            if flag is False:
                continue
            for keyword, position in (("sampler", SAMPLER), ("batch_sampler", BATCH_SAMPLER)):
                given = passed_arg(call, keyword, position)
                if given is None:
                    continue
                kinds = sampler_kinds(facts, given.value, call)
                if not kinds - {"none"}:
                    continue
                if flag is True:
                    self._report(call, shuffle, given, keyword, kinds)
                elif not self._coordinated(shuffle.value, given.value, call) and self._together(
                    shuffle.value, given.value, call
                ):
                    self._report_maybe(call, shuffle, given, keyword, kinds)
                break

    # -- whether the two can arrive together ---------------------------------------------------

    def _coordinated(self, shuffle: cst.BaseExpression, sampler: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``shuffle=`` is computed from the sampler or from the test that sets it (``shuffle=sampler is None``,
        ``shuffle = is_train and sampler is None`` then ``shuffle=shuffle``, ``shuffle=world == 1`` beside
        ``sampler = DistributedSampler(ds) if world > 1 else None``, ``if not is_shuffle: sampler = ...``, or
        ``sampler = ...`` beside ``shuffle = False`` in one branch): the author keeps the two apart, and
        lintdist does not try to prove it."""
        facts = self.facts
        values = [shuffle, *(o.node for o in facts.origins(shuffle, at) if isinstance(o.node, cst.BaseExpression))]
        names = {n.value for v in values for n in [*facts.within(v, cst.Name), v] if isinstance(n, cst.Name)}
        sampler_name = get_full_name_for_node(sampler) if isinstance(sampler, (cst.Name, cst.Attribute)) else None
        if sampler_name and any(sampler_name in full_names(facts, v) for v in values):
            return True
        dotted = set().union(*(read_keys(facts, v) for v in values))
        off = [b for name in names for b in facts.bindings(name, at) if constant_truth(b.value) is False]
        for origin in facts.origins(sampler, at):
            parent = facts.parent(origin.node)
            if isinstance(parent, cst.IfExp) and full_names(facts, parent.test) & names:
                return True
            if not isinstance(origin.node, cst.Call):
                continue
            # `if not is_shuffle: sampler = DistributedSampler(ds)`, or `sampler = ...` and `shuffle = False` in one block
            for ancestor in facts.ancestors(origin.node):
                if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                    break
                if isinstance(ancestor, cst.If) and read_keys(facts, ancestor.test) & dotted:
                    return True
                branch = isinstance(ancestor, cst.IndentedBlock) and isinstance(
                    facts.parent(ancestor), (cst.If, cst.Else)
                )
                if branch and any(facts.is_within(b.statement, ancestor) for b in off):
                    return True
        return False

    def _together(self, shuffle: cst.BaseExpression, sampler: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """A true ``shuffle`` and a set sampler can arrive together. Both parameters of one function
        (``def build(ds, shuffle=True, sampler=None)``): only if one of its calls in this file passes both, and
        never when its callers are out of sight (keeping them apart is then the callers' contract)."""
        if not (isinstance(shuffle, cst.Name) and isinstance(sampler, cst.Name)):
            return True
        calls = values_passed(self.facts, [shuffle.value, sampler.value], at)
        return calls is None or any(
            constant_truth(flag) is not False and not (isinstance(given, cst.Name) and given.value == "None")
            for flag, given in calls
        )

    # -- the report and its fix -------------------------------------------------------------

    def _report_maybe(self, call: cst.Call, shuffle: cst.Arg, given: cst.Arg, keyword: str, kinds: set[str]) -> None:
        """``shuffle=<an expression that can be true>`` beside a sampler that can be set."""
        code = self.context.module.code_for_node
        shuffle_text = code(shuffle.value)
        sampler_text = code(given.value)
        conditional = bool(kinds & {"none", "maybe"})
        computed = isinstance(shuffle.value, (cst.Comparison, cst.BooleanOperation, cst.UnaryOperation))
        if conditional and isinstance(given.value, (cst.Name, cst.Attribute)):
            bare = isinstance(shuffle.value, (cst.Name, cst.Attribute)) or getattr(shuffle.value, "lpar", ())
            test = f"{shuffle_text if bare else f'({shuffle_text})'} and {sampler_text} is None"
            advice = f"shuffle only when there is no sampler: `shuffle={test}`"
            fix = _shuffle_without_sampler(shuffle, test)
        elif not conditional and shuffle.keyword is not None and keyword == "sampler":
            advice = "the sampler decides the order (a `DistributedSampler` shuffles by default), so drop `shuffle`"
            fix = _drop_shuffle(call, shuffle)
        else:
            advice = "pass `shuffle` only when there is no sampler"
            fix = None
        error = _error(keyword)
        message = (
            f"`shuffle={shuffle_text}` can be true while the `{keyword}` is set"
            + (" (the distributed run)" if conditional else "")
            + f", and then `DataLoader` raises ValueError ('{error}'); {advice}"
        )
        self.report(shuffle, message, fix=fix, severity=None if computed else Severity.WARNING)

    def _report(self, call: cst.Call, shuffle: cst.Arg, given: cst.Arg, keyword: str, kinds: set[str]) -> None:
        shuffle_text = self.context.module.code_for_node(shuffle.value)
        batched = keyword == "batch_sampler"
        error = _error(keyword)
        may_be_none = bool(kinds & {"none", "maybe"})
        when = " whenever the sampler is not None (the distributed run)" if may_be_none else ""
        ordered = keeps_order(self.facts, given.value, call, batched)
        if ordered:
            advice = (
                "the sampler keeps a fixed order while `shuffle` asks for a random one: drop `shuffle` to keep "
                "the order, or make the sampler shuffle"
            )
        elif may_be_none:
            name = get_full_name_for_node(given.value) if isinstance(given.value, (cst.Name, cst.Attribute)) else None
            advice = f"shuffle only when there is no sampler (`shuffle={name or '<sampler>'} is None`)"
        elif shuffle.keyword is None:
            advice = "the sampler decides the order, so pass `False` for `shuffle`"
        else:
            advice = "the sampler decides the order, so drop `shuffle`"
        message = (
            f"`shuffle={shuffle_text}` with a `{keyword}` makes `DataLoader` raise ValueError ('{error}'){when}; "
            f"{advice}"
        )
        fix = None if ordered else self._fix(call, shuffle, given, kinds)
        severity = None if kinds & {"sampler", "unknown"} else Severity.WARNING
        self.report(shuffle, message, fix=fix, severity=severity)

    def _fix(self, call: cst.Call, shuffle: cst.Arg, given: cst.Arg, kinds: set[str]) -> Fix | None:
        if has_comment(self.context.module.code_for_node(shuffle)):
            return None
        if truth(self.facts, shuffle.value, call, parameters=False) is not True:
            return None  # `shuffle` comes in through a parameter: callers out of sight may pass False
        if kinds != {"sampler"}:
            if not isinstance(given.value, (cst.Name, cst.Attribute)):
                return None
            return _shuffle_without_sampler(shuffle, f"{get_full_name_for_node(given.value)} is None")
        if shuffle.keyword is None:
            return Fix(
                Applicability.SAFE,
                "Pass `False` for `shuffle`: the sampler decides the order",
                replacements=((shuffle.value, cst.Name("False")),),
            )
        return _drop_shuffle(call, shuffle)


def _drop_shuffle(call: cst.Call, shuffle: cst.Arg) -> Fix | None:
    new_call = without_argument(call, shuffle)
    if new_call is None:
        return None
    return Fix(Applicability.SAFE, "Drop `shuffle`: the sampler decides the order", replacements=((call, new_call),))


def _shuffle_without_sampler(shuffle: cst.Arg, test: str) -> Fix:
    """``shuffle=<test>``, a test that is false whenever the sampler is set."""
    return Fix(
        Applicability.SAFE,
        f"Shuffle only without a sampler: `{test}`",
        replacements=((shuffle.value, cst.parse_expression(test)),),
    )


def _error(keyword: str) -> str:
    """The ValueError ``DataLoader.__init__`` raises for ``shuffle`` beside a sampler or a batch sampler."""
    if keyword == "batch_sampler":
        return "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last"
    return "sampler option is mutually exclusive with shuffle"
