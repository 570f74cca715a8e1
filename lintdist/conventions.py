"""The conventional meaning of a name nothing binds: snippets, notebook cells and documentation leave imports out.

``dist.barrier()`` pasted without ``import torch.distributed as dist`` means ``torch.distributed.barrier``: the
name resolver (``lintdist.names``) gives an unbound name of this table its meaning here, and the pre-filter reads a
file as if it carried the imports these names stand for. Only names that are overwhelmingly used with one meaning in
training code belong here; names often used as variables (``model``, ``accelerator``, ``loader``, ``rank``) and
names with two common meanings (``Dataset``, ``Trainer``, ``pl``, ``autocast``) do not. Nor do transformers' classes
(``AutoTokenizer``): named in every docstring of transformers' own modules, they would admit those modules to rules
that skip them on purpose (a rule may want a real ``from transformers`` line).

This module imports nothing heavy: the pre-filter reads it before libcst is imported.
"""

from __future__ import annotations

import re
from functools import cache

# `import torch.distributed as dist`
CONVENTIONAL_MODULES: dict[str, str] = {
    "torch": "torch",
    "dist": "torch.distributed",
    "nn": "torch.nn",
    "F": "torch.nn.functional",
    "optim": "torch.optim",
    "mp": "torch.multiprocessing",
    "np": "numpy",
    "os": "os",
    "sys": "sys",
    "math": "math",
    "random": "random",
    "shutil": "shutil",
    "accelerate": "accelerate",
    "deepspeed": "deepspeed",
    "transformers": "transformers",
}
# `from torch.nn.parallel import DistributedDataParallel as DDP`
CONVENTIONAL_OBJECTS: dict[str, str] = {
    "DDP": "torch.nn.parallel.DistributedDataParallel",
    "DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "FSDP": "torch.distributed.fsdp.FullyShardedDataParallel",
    "FullyShardedDataParallel": "torch.distributed.fsdp.FullyShardedDataParallel",
    "fully_shard": "torch.distributed.fsdp.fully_shard",
    "DataLoader": "torch.utils.data.DataLoader",
    "DistributedSampler": "torch.utils.data.distributed.DistributedSampler",
    "Accelerator": "accelerate.Accelerator",
    "PartialState": "accelerate.PartialState",
    # a collective under either meaning (`accelerate.utils.gather_object`, `torch.distributed.gather_object`)
    "gather_object": "accelerate.utils.gather_object",
}
CONVENTIONAL_NAMES: dict[str, str] = {**CONVENTIONAL_MODULES, **CONVENTIONAL_OBJECTS}


def conventional_meaning(full_name: str) -> str | None:
    """``dist.barrier`` -> ``torch.distributed.barrier`` where the first part is a conventional name, else None."""
    root, dot, rest = full_name.partition(".")
    qualified = CONVENTIONAL_NAMES.get(root)
    if qualified is None:
        return None
    return f"{qualified}{dot}{rest}"


def implied_import(name: str) -> str:
    """The import statement a conventional name stands for: ``import torch.distributed as dist``, ``from
    torch.nn.parallel import DistributedDataParallel as DDP``, ``import os``."""
    qualified = CONVENTIONAL_NAMES[name]
    if name in CONVENTIONAL_OBJECTS:
        module, _, last = qualified.rpartition(".")
        return f"from {module} import {last}" + ("" if last == name else f" as {name}")
    return f"import {qualified}" if qualified == name else f"import {qualified} as {name}"


def implied_module(name: str) -> str:
    """The module a conventional name's import reads, as ``imported_modules`` records it (``from a.b import c``:
    ``a.b``)."""
    statement = implied_import(name)
    return statement.split()[1]


def trigger_text(text: str) -> str:
    """What a Python file's triggers are searched in: its text after the comment lines it opens with (a license
    header says "distributed" in nearly every library module, and no code is there), followed by the imports of
    the conventional names it uses (``text_with_implied_imports``)."""
    return text_with_implied_imports(text[_OPENING_COMMENTS.match(text).end() :])


# blank lines and comment lines at the start of a file: a shebang, an encoding line, a license header
_OPENING_COMMENTS = re.compile(r"(?:[ \t]*(?:#[^\n]*)?\n)*")


def text_with_implied_imports(text: str) -> str:
    """``text`` followed by the imports of the conventional names it uses, for the pre-filter: a snippet that calls
    ``dist.barrier()`` wants the rules a file with ``import torch.distributed as dist`` wants. Costs one substring
    search per name, and a literal-first pattern where the name occurs and its module's name does not (a file that
    names ``torch.distributed`` already satisfies what the import would: a library module is not scanned again)."""
    implied = [
        statement
        for name, statement, qualified, pattern in _entries()
        if name in text and qualified not in text and pattern.search(text)
    ]
    return text if not implied else "\n".join((text, *implied))


@cache
def _entries() -> tuple[tuple[str, str, str, re.Pattern[str]], ...]:
    # only the names whose import says more than the name itself: `import os` adds the word "import", and a rule
    # that wants a real import line of its module (not the module's name alone) should not get one made up
    return tuple(
        (name, implied_import(name), CONVENTIONAL_NAMES[name], _used(name))
        for name in CONVENTIONAL_NAMES
        if implied_import(name) != f"import {name}"
    )


def _used(name: str) -> re.Pattern[str]:
    # the name as a whole identifier, not an attribute (`x.dist`), used as code uses it: a module with an attribute
    # after it (`dist.`), a class or function called or passed (`DDP(`, `, DDP)`), not a word in prose ("wrap
    # it in FSDP first"); the literal first, for a fast scan
    escaped = re.escape(name)
    after = r"\." if name in CONVENTIONAL_MODULES else r"[.(),\]]"
    return re.compile(rf"{escaped}(?<![\w.]{escaped})(?={after})")
