"""What says a launcher starts a script and hands it its environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...).

The script's own code may say it (it reads a variable only a launcher sets, leaves ``init_process_group()`` to read
them, builds an ``Accelerator``), or its launch does (a ``torchrun``/``accelerate launch``/``deepspeed`` line that
names it, a launch file's settings). The answer is in words, for a message; None when nothing says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from lintdist.collectives import ACCELERATE_OBJECTS
from lintdist.devices import INIT_PROCESS_GROUP
from lintdist.environment import environment_key, environment_writes, reads_environment, spells_environment
from lintdist.facts import argument_of, string_value

if TYPE_CHECKING:
    from lintdist.facts import PythonFacts
    from lintdist.launch import Launch, LaunchSettings

# Variables torchrun (`torch/distributed/elastic/agent/server/local_elastic_agent.py::_start_workers`) and
# `accelerate launch` (through torchrun, or `prepare_simple_launcher_cmd_env`) set for every worker.
LAUNCHER_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"})


def environment_initialised(facts: PythonFacts, call: cst.Call) -> bool:
    """``call`` is an ``init_process_group()`` that takes its rank and world size from the environment: no ``rank``,
    ``world_size`` or ``store``, at most two positional arguments, and no ``tcp://``/``file://`` address."""
    if facts.method_name(call) != "init_process_group" or not facts.callee_is(call, INIT_PROCESS_GROUP):
        return False
    given = {a.keyword.value for a in call.args if a.keyword is not None}
    positional = sum(1 for a in call.args if a.keyword is None)
    method = string_value(argument_of(call, "init_method", 1))
    return (
        not given & {"rank", "world_size", "store"}
        and positional <= 2
        and not (method or "").startswith(("tcp://", "file://"))
    )


def launcher_evidence(
    facts: PythonFacts, launch: Launch, settings: LaunchSettings | None, near: cst.CSTNode | None = None
) -> str | None:
    """What says a launcher starts the script, in words: a read of one of ``LAUNCHER_VARIABLES``, an
    ``init_process_group()`` that reads the environment, an ``Accelerator``/``PartialState``, the launch line that
    starts it (``launch``, when its launcher sets the rendezvous) or a launch file's ``settings``; None when nothing
    does. In a documentation page, only the code of ``near``'s block speaks for it (another block is another
    program: a notebook's emulated launcher beside a script the ``deepspeed`` launcher runs)."""

    def same_program(node: cst.CSTNode) -> bool:
        return near is None or facts.block_of is None or facts.block_of(node) == facts.block_of(near)

    for node in facts.index.nodes(cst.Subscript):
        key = environment_key(facts, node)
        if key in LAUNCHER_VARIABLES and not isinstance(facts.parent(node), cst.AssignTarget) and same_program(node):
            return f'it reads `os.environ["{key}"]`'
    for call in facts.calls:
        if not same_program(call):
            continue
        name = facts.method_name(call)
        if name in {"get", "getenv"}:
            variable = environment_key(facts, call)
            if variable in LAUNCHER_VARIABLES:
                return f"it reads `{variable}` from the environment"
        elif environment_initialised(facts, call):
            return "`init_process_group()` takes its rank and world size from the environment"
        elif name in {"Accelerator", "PartialState"} and facts.callee_is(call, ACCELERATE_OBJECTS):
            return f"`{name}()` reads the environment `accelerate launch` sets"
    if launch.rendezvous is not None and launch.rendezvous.value is True:
        return f"{launch.launcher.where()} starts it"
    if settings is not None and any(s.spelling in {"flag", "yaml"} for s in settings.values.values()):
        return "a launch file starts it"
    return None


def own_group(facts: PythonFacts, call: cst.Call) -> bool:
    """``init_process_group`` given its rank and world size from anything but the launcher's environment (a
    one-process group in a test, ``world_size=1, rank=0``)."""
    rank = argument_of(call, "rank", 4)
    size = argument_of(call, "world_size", 3)
    return (
        rank is not None
        and size is not None
        and not reads_environment(facts, rank)
        and not reads_environment(facts, size)
    )


def emulates_launcher(facts: PythonFacts, near: cst.CSTNode) -> bool:
    """The program writes a launcher's own variables (``os.environ["RANK"] = "0"``, ``WORLD_SIZE``...) itself: it
    emulates a launcher (DeepSpeed in a notebook), so no launcher starts it. In a documentation page, only ``near``'s
    block counts."""
    return any(
        set(write.keys) & LAUNCHER_VARIABLES
        and (facts.block_of is None or facts.block_of(write.node) == facts.block_of(near))
        for write in environment_writes(facts)
    )


# Addresses of this machine: a rendezvous there admits no process of another node.
LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "0.0.0.0", "::1"})


def meets_on_this_machine(facts: PythonFacts, call: cst.Call) -> bool:
    """The process group ``call`` (an ``init_process_group``) starts meets on this machine: its ``init_method`` is
    ``tcp://localhost:port`` (``127.0.0.1``...), or its function (or the module, for a call at the top) writes
    ``MASTER_ADDR`` as such an address, unless under a test of the environment (a fallback). A one-node group by
    construction."""
    from lintdist.surrounding_tests import surrounding_tests
    from lintdist.values import string_of

    method = string_of(facts, argument_of(call, "init_method", 1), call)
    if method is not None and method.startswith("tcp://"):
        return method[len("tcp://") :].rsplit(":", 1)[0].strip("[]") in LOCAL_ADDRESSES
    scope = facts.enclosing_function(call)
    for write in environment_writes(facts):
        if "MASTER_ADDR" not in write.keys or write.how != "store" or facts.enclosing_function(write.node) is not scope:
            continue
        tests = surrounding_tests(facts, write.node, kinds=(cst.If,), scopes=(cst.FunctionDef, cst.ClassDef))
        if string_value(write.value) in LOCAL_ADDRESSES and not any(spells_environment(facts, t.test) for t in tests):
            return True
    return False
