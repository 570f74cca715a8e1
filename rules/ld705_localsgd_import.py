"""LD705 localsgd-import: `LocalSGD` imported from `accelerate` (or `accelerate.utils`), which do not export it."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.model import Applicability, Fix, Severity
from lintdist.rule import Invalid, Rule, Valid

# Packages that never exported `LocalSGD` (checked in accelerate's history from 0.20 to 1.15); it lives in
# `accelerate.local_sgd`.
WRONG_MODULES = frozenset({"accelerate", "accelerate.utils"})
HOME = "accelerate.local_sgd"
NAME = "LocalSGD"


class LocalSgdImport(Rule):
    """
    ## What it does
    Reports `from accelerate import LocalSGD` (and `from accelerate.utils
    import LocalSGD`, with or without `as`) and `accelerate.LocalSGD` read
    from the imported package. The report points at the imported name.

    ## Why is this bad?
    accelerate exports `LocalSGD` from `accelerate.local_sgd` only: neither
    `accelerate` nor `accelerate.utils` has it, in any release (checked from
    0.20 to 1.15), so the script stops with `ImportError: cannot import name
    'LocalSGD' from 'accelerate'` (or an `AttributeError` for
    `accelerate.LocalSGD`) before training starts, typically after the job
    has waited in a queue for its GPUs. The spelling is copied from notes and
    answers that show it.

    ## Example
    ```python
    from accelerate import Accelerator, LocalSGD
    ```

    ## Use instead
    ```python
    from accelerate import Accelerator
    from accelerate.local_sgd import LocalSGD
    ```

    ## Fix safety
    Safe: the import can only fail as written, and the fixed one binds the
    same name to the class the script meant. An import of `LocalSGD` alone has
    its module replaced (an `as` name is kept); an import of several names
    loses `LocalSGD` and gets a separate `from accelerate.local_sgd import
    LocalSGD`. A renamed `LocalSGD` among other names, and
    `accelerate.LocalSGD` read as an attribute, are reported without a fix.

    ## References
    - accelerate `accelerate/__init__.py` (what the package exports) and `accelerate/local_sgd.py`
    - [accelerate: Local SGD](https://huggingface.co/docs/accelerate/usage_guides/local_sgd)
    """

    code = "LD705"
    name = "localsgd-import"
    severity = Severity.ERROR
    fix_kind = "safe"
    triggers = ("LocalSGD",)

    VALID = (
        Valid("from accelerate.local_sgd import LocalSGD\nfrom accelerate import Accelerator\n"),
        Valid("import accelerate.local_sgd\n\nsgd_class = accelerate.local_sgd.LocalSGD\n"),
        Valid("from mylib import LocalSGD\n"),
    )
    INVALID = (
        Invalid(
            "from accelerate import LocalSGD\n",
            lines=(1,),
            fixed="from accelerate.local_sgd import LocalSGD\n",
        ),
        Invalid(
            "from accelerate import Accelerator, LocalSGD  # training helpers\n\naccelerator = Accelerator()\n",
            lines=(1,),
            fixed=(
                "from accelerate import Accelerator  # training helpers\n"
                "from accelerate.local_sgd import LocalSGD\n\naccelerator = Accelerator()\n"
            ),
        ),
        Invalid(
            "from accelerate.utils import LocalSGD as Averager\n",
            lines=(1,),
            fixed="from accelerate.local_sgd import LocalSGD as Averager\n",
        ),
        Invalid("import accelerate\n\nsgd = accelerate.LocalSGD(accelerator, model, 8)\n", lines=(3,)),
    )

    def finish(self) -> None:
        facts = self.facts
        for statement in facts.index.nodes(cst.ImportFrom):
            module = get_full_name_for_node(statement.module) if statement.module is not None else None
            if statement.relative or module not in WRONG_MODULES or isinstance(statement.names, cst.ImportStar):
                continue
            for alias in statement.names:
                if get_full_name_for_node(alias.name) == NAME:
                    message = (
                        f"`{module}` does not export `LocalSGD`: this import raises ImportError before training "
                        f"starts; import it from `{HOME}`"
                    )
                    self.report(alias, message, fix=_import_fix(statement, alias))
        for attribute in facts.index.nodes(cst.Attribute):
            if attribute.attr.value == NAME and any(
                name in {f"{m}.{NAME}" for m in WRONG_MODULES} for name in facts.qualified_names(attribute)
            ):
                message = (
                    f"`{get_full_name_for_node(attribute)}` raises AttributeError: accelerate exports `LocalSGD` "
                    f"from `{HOME}` only; `from {HOME} import LocalSGD`"
                )
                self.report(attribute, message)


def _import_fix(statement: cst.ImportFrom, alias: cst.ImportAlias) -> Fix | None:
    names = list(statement.names)
    if len(names) == 1:
        new = statement.with_changes(module=cst.parse_expression(HOME))
        return Fix(Applicability.SAFE, f"Import it from `{HOME}`", replacements=((statement, new),))
    if alias.asname is not None:
        return None  # the new import would have to keep the `as` name: left to the user
    index = names.index(alias)
    del names[index]
    if index == len(names):  # the last name went: the one before takes its comma (or its absence)
        names[-1] = names[-1].with_changes(comma=alias.comma)
    new = statement.with_changes(names=names)
    return Fix(
        Applicability.SAFE, f"Import it from `{HOME}`", replacements=((statement, new),), imports=((HOME, NAME),)
    )
