"""How a script names a class a fix adds (``lintdist.spelling.class_spelling``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import SAMPLER_CLASSES, PythonFacts
from lintdist.names import NameResolver
from lintdist.spelling import binding_import, class_spelling, import_reads, name_taken, unused_name
from lintdist.syntax import SyntaxIndex

MODULES = frozenset({"torch.utils.data", "torch.utils.data.distributed"})


def _spelling(code: str):
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return class_spelling(PythonFacts(index, NameResolver(index)), SAMPLER_CLASSES, MODULES, "torch.utils.data")


def test_an_import_of_the_class_keeps_its_alias():
    assert _spelling("from torch.utils.data.distributed import DistributedSampler as DS\n") == ("DS", ())


def test_an_import_of_its_module():
    assert _spelling("import torch.utils.data as tud\n") == ("tud.DistributedSampler", ())


def test_a_dotted_use_already_there():
    code = "import torch\ns = torch.utils.data.distributed.DistributedSampler(ds)\n"
    assert _spelling(code) == ("torch.utils.data.distributed.DistributedSampler", ())


def test_imports_inside_functions_do_not_count():
    code = "def f():\n    from torch.utils.data import DistributedSampler\n"
    assert _spelling(code) == (None, ())  # the bare name is a variable of the script's there


def test_a_new_import_unless_the_name_is_taken():
    assert _spelling("import os\n") == ("DistributedSampler", (("torch.utils.data", "DistributedSampler"),))
    assert _spelling("DistributedSampler = make_sampler\n") == (None, ())


def test_unused_name_in_a_scope():
    index = SyntaxIndex(cst.parse_module("def f():\n    token_windows = 1\n"))
    facts = PythonFacts(index, NameResolver(index))
    function = index.nodes(cst.FunctionDef)[0]
    assert unused_name(facts, function, ("token_windows", "loss_windows")) == "loss_windows"
    assert unused_name(facts, function, ("token_windows",)) is None


def test_main_process_test_spelled_as_the_script_would() -> None:
    from lintdist.spelling import main_process_test

    def facts_of(code: str) -> PythonFacts:
        index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
        return PythonFacts(index, NameResolver(index))

    accelerate = facts_of("from accelerate import Accelerator\naccelerator = Accelerator()\nsave()\n")
    assert main_process_test(accelerate, accelerate.calls[-1]) == "accelerator.is_main_process"
    assert main_process_test(accelerate, accelerate.calls[-1], "self.acc") == "self.acc.is_main_process"
    raw = facts_of("import torch.distributed as dist\nsave()\n")
    assert main_process_test(raw, raw.calls[-1]) == "not dist.is_initialized() or dist.get_rank() == 0"
    assert main_process_test(facts_of("save()\n"), facts_of("save()\n").calls[-1]) is None


def test_variable_spelled_counts_variables_and_functions_but_not_methods_or_attributes() -> None:
    from lintdist.spelling import variable_spelled

    def facts_of(code: str) -> PythonFacts:
        index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
        return PythonFacts(index, NameResolver(index))

    assert variable_spelled(facts_of("save = 1\n"), "save")
    assert variable_spelled(facts_of("def save():\n    pass\n"), "save")
    assert not variable_spelled(facts_of("class A:\n    def save(self):\n        pass\n"), "save")
    assert not variable_spelled(facts_of("torch.save(x, f=save)\n"), "load")
    assert not variable_spelled(facts_of("obj.save(save_dir=1)\n"), "save")


def test_a_name_taken_anywhere_but_by_an_allowed_import():
    index = SyntaxIndex(
        cst.parse_module(
            "from lintdist.runtime import shift_labels\ndef helper(param):\n    local = 1\nclass Model:\n    pass\n"
        )
    )
    facts = PythonFacts(index, NameResolver(index))
    for taken in ("helper", "param", "local", "Model", "shift_labels"):
        assert name_taken(facts, taken), taken
    assert not name_taken(facts, "shift_labels", frozenset({"lintdist.runtime"}))
    assert not name_taken(facts, "shifted_labels")


def test_the_import_that_binds_a_name_and_its_reads():
    index = SyntaxIndex(
        cst.parse_module(
            "import torch.cuda.amp as amp\nfrom torch.cuda.amp import autocast, GradScaler as GS\nfrom x import *\n"
            "with amp.autocast():\n    f(autocast=1, y=x.autocast)\nautocast()\nGS()\n"
        )
    )
    facts = PythonFacts(index, NameResolver(index))
    first, second, star = (line.body[0] for line in index.module.body[:3])
    assert binding_import(facts, "amp") is first
    assert binding_import(facts, "GS") is second
    assert binding_import(facts, "GradScaler") is None
    assert binding_import(facts, "torch") is None
    assert [index.module.code_for_node(facts.parent(n)) for n in import_reads(facts, first)] == ["amp.autocast"]
    assert sorted(n.value for n in import_reads(facts, second)) == ["GS", "autocast"]
    assert import_reads(facts, star) == []
