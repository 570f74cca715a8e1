"""LD706 accelerator-dataloader-keywords: data-loader options passed to `Accelerator(...)` itself, which accelerate
1.x ignores (`split_batches`) or rejects (`dispatch_batches`, `even_batches`, `use_seedable_sampler`)."""

from __future__ import annotations

import libcst as cst

from lintdist.accelerators import dataloader_keys_in_kwargs, loose_dataloader_keywords
from lintdist.facts import ACCELERATOR_CLASSES, argument_of, string_value
from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

HOME = "accelerate.utils"
CONFIG = "DataLoaderConfiguration"
# accelerate 0.28 moved the four options into `DataLoaderConfiguration` and deprecated the keywords (#2441);
# 1.0 removed them (#3098): `split_batches` stays a parameter whose sentinel default nothing reads.
MOVED_IN = "0.28"
REMOVED_IN = "1.0"


class AcceleratorDataloaderKeywords(Rule):
    """
    ## What it does
    Reports `Accelerator(...)` calls given `split_batches=`,
    `dispatch_batches=`, `even_batches=` or `use_seedable_sampler=` as
    keywords of their own, instead of inside
    `dataloader_config=DataLoaderConfiguration(...)`. The report is at the
    first such keyword. A dict of the file unpacked into the call
    (`kwargs = dict(dispatch_batches=...)`, `{"even_batches": ...}`, then
    `Accelerator(**kwargs)`) is reported at its key; keys stored one by one
    (`kwargs["dispatch_batches"] = ...`) are not, since scripts guard those by
    the installed signature. The severity follows the accelerate versions the
    project declares (requirements, `pyproject.toml`, `setup.py`, as LD301
    reads them): an error where accelerate 1.x is allowed (or nothing is
    declared), information where only 0.28 to 0.x is, and nothing where every
    allowed version predates 0.28.

    ## Why is this bad?
    accelerate 0.28 moved the four data-loader options into
    `DataLoaderConfiguration` and kept the old keywords with a FutureWarning;
    accelerate 1.0 removed them. In accelerate 1.15, `Accelerator.__init__`
    has no `dispatch_batches`, `even_batches` or `use_seedable_sampler`
    parameter, so the script stops with `TypeError: Accelerator.__init__()
    got an unexpected keyword argument 'dispatch_batches'` (a
    `create_accelerator_and_postprocess` copied from an older `Trainer` is
    the usual place). `split_batches` is still accepted, but its default is
    a sentinel that nothing reads: `Accelerator(split_batches=True)
    .split_batches` is `False`. The batches are not split, each process draws
    a full batch, the global batch is `num_processes` times what the script
    computed, and scheduler and step arithmetic built on the split are off by
    that factor, with no warning.

    ## Example
    ```python
    from accelerate import Accelerator

    accelerator = Accelerator(split_batches=True, even_batches=False)
    ```

    ## Use instead
    ```python
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=True, even_batches=False)
    )
    ```

    ## Fix safety
    The fix moves the keywords, with their values as written, into
    `dataloader_config=DataLoaderConfiguration(...)` at the place of the
    first one, and imports `DataLoaderConfiguration` from `accelerate.utils`
    (there since 0.28). It is safe where the call cannot run as written
    (`dispatch_batches`, `even_batches`, `use_seedable_sampler` under
    accelerate 1.x) or where only 0.28 to 0.x is allowed (those versions map
    the keywords onto the same configuration). It is unsafe where
    `split_batches` is among them under accelerate 1.x: the program ran
    before, and from now on each process draws a slice of the batch, so the
    per-process batch, the step count per epoch and what was tuned for them
    change (to what the script asked for). No fix when the call already
    passes `dataloader_config=`, or where the option comes through `**kwargs`.

    ## References
    - accelerate 1.15 `accelerate/accelerator.py::Accelerator.__init__` (the `_split_batches` sentinel, the
      `split_batches` property reading `dataloader_config`), `accelerate/utils/dataclasses.py::
      DataLoaderConfiguration`; accelerate PR #2441 (0.28, the deprecation) and PR #3098 (1.0, the removal)
    - [huggingface/accelerate#3177](https://github.com/huggingface/accelerate/issues/3177): `Accelerator(
      split_batches=True)` silently ignored in 1.x
    - [LLaVA-VL/LLaVA-NeXT#388](https://github.com/LLaVA-VL/LLaVA-NeXT/issues/388) and
      [OpenGVLab/InternVL#806](https://github.com/OpenGVLab/InternVL/issues/806): a Trainer subclass's
      `create_accelerator_and_postprocess` passes `dispatch_batches=` and stops with a TypeError under
      accelerate 1.x
    - Proof: none needed on several processes; `tests/test_ld706_accelerator_dataloader_keywords.py` builds
      `Accelerator(...)` with each keyword in the installed accelerate and checks the TypeError, the ignored
      `split_batches`, and that the fixed call sets the option
    """

    code = "LD706"
    name = "accelerator-dataloader-keywords"
    severity = Severity.ERROR
    fix_kind = "safe"
    # the common word first: other rules test it too, so a file without it is passed over at no cost
    triggers = ("Accelerator",)
    also_triggers = (("split_batches", "dispatch_batches", "even_batches", "use_seedable_sampler"),)

    VALID = (
        Valid(
            "from accelerate import Accelerator\nfrom accelerate.utils import DataLoaderConfiguration\n\n"
            "accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True))\n"
        ),
        Valid("from transformers import TrainingArguments\n\nargs = TrainingArguments('out', split_batches=True)\n"),
        Valid(
            "from accelerate import Accelerator\n\naccelerator = Accelerator(dispatch_batches=False)\n",
            project={"requirements.txt": "accelerate==0.25.0\n"},
        ),
        Valid(
            "from accelerate import Accelerator\n\naccelerator = Accelerator()\n"
            "with accelerator.join_uneven_inputs([model], even_batches=False):\n    pass\n"
        ),
        Valid(
            "import inspect\n\nfrom accelerate import Accelerator\n\nkwargs = {}\n"
            "if 'dispatch_batches' in inspect.signature(Accelerator).parameters:\n"
            "    kwargs['dispatch_batches'] = False\naccelerator = Accelerator(**kwargs)\n"
        ),
    )
    INVALID = (
        Invalid(
            "from accelerate import Accelerator\n\naccelerator = Accelerator(split_batches=True, mixed_precision='bf16')\n",
            lines=(3,),
            unsafe_fixed=(
                "from accelerate import Accelerator\nfrom accelerate.utils import DataLoaderConfiguration\n\n"
                "accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=True), "
                "mixed_precision='bf16')\n"
            ),
        ),
        Invalid(
            """\
from accelerate import Accelerator


class MyTrainer(Trainer):
    def create_accelerator_and_postprocess(self):
        self.accelerator = Accelerator(
            deepspeed_plugin=self.args.deepspeed_plugin,
            dispatch_batches=self.args.dispatch_batches,
            even_batches=False,
        )
""",
            lines=(8,),
            fixed="""\
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration


class MyTrainer(Trainer):
    def create_accelerator_and_postprocess(self):
        self.accelerator = Accelerator(
            deepspeed_plugin=self.args.deepspeed_plugin,
            dataloader_config=DataLoaderConfiguration(dispatch_batches=self.args.dispatch_batches, even_batches=False),
        )
""",
        ),
        Invalid(
            "import accelerate\n\naccelerator = accelerate.Accelerator(use_seedable_sampler=True)\n",
            lines=(3,),
            fixed=(
                "import accelerate\nfrom accelerate.utils import DataLoaderConfiguration\n\n"
                "accelerator = accelerate.Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))\n"
            ),
            project={"requirements.txt": "accelerate>=0.30,<1\n"},
        ),
        Invalid(
            "from accelerate import Accelerator\n\n"
            "kwargs = dict(mixed_precision='bf16', dispatch_batches=args.dispatch_batches)\n"
            "accelerator = Accelerator(**kwargs)\n",
            lines=(3,),
        ),
    )

    def finish(self) -> None:
        if self.versions.allows("accelerate", f">={MOVED_IN}") is False:
            return  # every accelerate the project allows takes the keywords as they are
        modern = self.versions.allows("accelerate", f">={REMOVED_IN}") is not False
        seen: set[int] = set()
        for call in self.facts.calls:
            if not self.facts.callee_is(call, ACCELERATOR_CLASSES):
                continue
            loose = loose_dataloader_keywords(call)
            if loose:
                self._report(call, [arg.keyword.value for arg in loose], modern, loose)
            for key in dataloader_keys_in_kwargs(self.facts, call):  # `Accelerator(**kwargs)`: no fix
                if id(key) not in seen:
                    seen.add(id(key))
                    name = key.keyword.value if isinstance(key, cst.Arg) else string_value(key)
                    self._report(call, [name], modern, [], at=key)

    def _report(self, call: cst.Call, names: list[str], modern: bool, loose: list[cst.Arg], at=None) -> None:
        spelled = _listed(names)
        rejected = [name for name in names if name != "split_batches"]
        if not modern:
            severity = Severity.INFO
            message = (
                f"{spelled} given to `Accelerator(...)` is deprecated since accelerate {MOVED_IN} and removed in "
                f"{REMOVED_IN}; pass `dataloader_config={CONFIG}(...)`"
            )
        else:
            severity = Severity.ERROR if rejected else Severity.WARNING
            parts = []
            if rejected:
                parts.append(f"{_listed(rejected)} raise{'s' if len(rejected) == 1 else ''} TypeError")
            if "split_batches" in names:
                parts.append("`split_batches=` is accepted and ignored (batches are not split)")
            message = (
                f"In accelerate >= {REMOVED_IN}, `Accelerator(...)` takes data-loader options only through "
                f"`dataloader_config={CONFIG}(...)`: {'; '.join(parts)}"
            )
        fix = None
        if not loose:
            message += " (given through `**kwargs`: no fix)"
        elif argument_of(call, "dataloader_config", None) is not None:
            message += " (the call already passes `dataloader_config=`: no fix)"
        else:
            unsafe = modern and "split_batches" in names
            fix = _fix(call, loose, Applicability.UNSAFE if unsafe else Applicability.SAFE)
        self.report(at if at is not None else loose[0], message, fix=fix, severity=severity)


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{name}=`" for name in names)


def _fix(call: cst.Call, loose: list[cst.Arg], applicability: Applicability) -> Fix:
    inner = [arg.with_changes(comma=cst.MaybeSentinel.DEFAULT) for arg in loose]
    config = cst.Arg(
        keyword=cst.Name("dataloader_config"),
        value=cst.Call(func=cst.Name(CONFIG), args=inner),
        equal=loose[0].equal,
        comma=loose[0].comma,
        whitespace_after_arg=loose[0].whitespace_after_arg,
    )
    args = []
    for arg in call.args:
        if arg is loose[0]:
            args.append(config)
        elif not any(arg is other for other in loose):
            args.append(arg)
    if args and loose[-1] is call.args[-1]:  # the last argument went: the new last one keeps the old ending
        args[-1] = args[-1].with_changes(comma=loose[-1].comma)
    return Fix(
        applicability,
        f"Move them into `dataloader_config={CONFIG}(...)`",
        replacements=((call, call.with_changes(args=args)),),
        imports=((HOME, CONFIG),),
    )
