"""lintdist/launcher_signs.py: what says a launcher starts a script and hands it its environment."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.facts import PythonFacts
from lintdist.launch import Launch, LaunchSettings, Said, Setting
from lintdist.launcher_signs import emulates_launcher, environment_initialised, launcher_evidence
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ('import os\nrank = int(os.environ["RANK"])\n', 'it reads `os.environ["RANK"]`'),
        ('import os\nos.environ["RANK"] = "0"\n', None),  # written, not read
        ('import os\nsize = os.getenv("WORLD_SIZE")\n', "it reads `WORLD_SIZE` from the environment"),
        (
            "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
            "`init_process_group()` takes its rank and world size from the environment",
        ),
        ("import torch.distributed as dist\ndist.init_process_group('nccl', rank=0, world_size=1)\n", None),
        (
            "from accelerate import Accelerator\nAccelerator()\n",
            "`Accelerator()` reads the environment `accelerate launch` sets",
        ),
        ("print('hello')\n", None),
    ],
)
def test_the_script_itself_says_it(code: str, expected: str | None) -> None:
    assert launcher_evidence(_facts(code), Launch(), None) == expected


def test_a_launch_line_or_a_launch_file_says_it() -> None:
    facts = _facts("print('hello')\n")
    line = Said("torchrun", "run.sh", 3, "torchrun")
    torchrun = Launch(launcher=line, rendezvous=Said(True, "run.sh", 3, "torchrun"))
    assert launcher_evidence(facts, torchrun, None) == "`torchrun` at run.sh:3 starts it"
    python = Launch(launcher=Said("python", "run.sh", 4, "python"), rendezvous=Said(False, "run.sh", 4, "python"))
    assert launcher_evidence(facts, python, None) is None
    settings = LaunchSettings()
    settings.set(Setting("num_processes", 8, "run.sh", 2, 1, "flag"))
    assert launcher_evidence(facts, Launch(), settings) == "a launch file starts it"


def test_environment_initialised_wants_no_rank_size_store_or_address() -> None:
    facts = _facts(
        """
        import torch.distributed as dist
        dist.init_process_group("nccl")
        dist.init_process_group("nccl", init_method="env://")
        dist.init_process_group("nccl", init_method="tcp://10.0.0.1:23456")
        dist.init_process_group("gloo", store=store, rank=0, world_size=2)
        other.init_process_group("nccl")
        """
    )
    assert [environment_initialised(facts, call) for call in facts.calls] == [True, True, False, False, False]


def test_own_group_gives_rank_and_size_not_read_from_the_environment() -> None:
    from lintdist.launcher_signs import own_group

    facts = _facts(
        """
        import os
        import torch.distributed as dist
        dist.init_process_group("gloo", rank=0, world_size=1)
        dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=2)
        dist.init_process_group("nccl", rank=0)
        """
    )
    assert [own_group(facts, call) for call in facts.calls if facts.method_name(call) == "init_process_group"] == [
        True,
        False,
        False,
    ]


def test_code_that_writes_the_launcher_variables_emulates_a_launcher():
    emulated = _facts(
        """
        import os
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["RANK"] = "0"
        os.environ["WORLD_SIZE"] = "1"
        """
    )
    plain = _facts('import os\nos.environ["MASTER_ADDR"] = "localhost"\nrank = int(os.environ["RANK"])\n')
    first = emulated.index.module.body[1]
    assert emulates_launcher(emulated, first)
    assert not emulates_launcher(plain, plain.index.module.body[1])  # RANK is read, not written


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ('dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500", rank=r, world_size=2)', True),
        ('dist.init_process_group("gloo", init_method="tcp://10.0.0.5:29500", rank=r, world_size=2)', False),
        ('os.environ["MASTER_ADDR"] = "localhost"\ndist.init_process_group("gloo", rank=r, world_size=2)', True),
        ('os.environ["MASTER_ADDR"] = "node0"\ndist.init_process_group("gloo", rank=r, world_size=2)', False),
        (
            (
                'if "MASTER_ADDR" not in os.environ:\n    os.environ["MASTER_ADDR"] = "localhost"\n'
                'dist.init_process_group("gloo", rank=r, world_size=2)'
            ),
            False,  # a fallback: the launcher's address wins
        ),
        ('dist.init_process_group("gloo", rank=r, world_size=2)', False),
    ],
)
def test_a_group_meets_on_this_machine(code: str, expected: bool) -> None:
    from lintdist.launcher_signs import meets_on_this_machine

    facts = _facts("import os\nimport torch.distributed as dist\n" + code + "\n")
    call = next(c for c in facts.calls if facts.method_name(c) == "init_process_group")
    assert meets_on_this_machine(facts, call) is expected


def test_a_local_address_written_in_another_function_does_not_count() -> None:
    from lintdist.launcher_signs import meets_on_this_machine

    facts = _facts(
        """
        import os
        import torch.distributed as dist

        def local():
            os.environ["MASTER_ADDR"] = "localhost"

        def setup(r):
            dist.init_process_group("gloo", rank=r, world_size=2)
        """
    )
    call = next(c for c in facts.calls if facts.method_name(c) == "init_process_group")
    assert meets_on_this_machine(facts, call) is False
