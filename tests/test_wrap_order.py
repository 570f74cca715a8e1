"""Whether a model went through a data-parallel wrapper before a point, or goes through one after it
(lintdist/wrap_order.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex
from lintdist.wrap_order import model_key, wrap_kind, wrapped_after, wrapped_before

HEAD = """
import deepspeed
from accelerate import Accelerator
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP
"""


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(HEAD + textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _use(facts: PythonFacts) -> cst.Call:
    return next(c for c in facts.calls if isinstance(c.func, cst.Name) and c.func.value == "use")


def _before(source: str) -> str | None:
    facts = _facts(source)
    use = _use(facts)
    found = wrapped_before(facts, use.args[0].value, use)
    return found.kind if found is not None else None


def _after(source: str) -> str | None:
    facts = _facts(source)
    use = _use(facts)
    found = wrapped_after(facts, use.args[0].value, use)
    return found.kind if found is not None else None


def test_the_name_holds_a_wrapper():
    assert _before("model = DDP(model)\nmodel = use(model)\n") == "ddp"
    assert _before("model = FSDP(model)\nuse(model)\n") == "fsdp1"
    assert _before("engine, opt, _, _ = deepspeed.initialize(model=model)\nuse(engine)\n") == "deepspeed"
    assert _before("accelerator = Accelerator()\nmodel, opt = accelerator.prepare(model, opt)\nuse(model)\n") == "prepare"


def test_the_bare_model_a_wrapper_took():
    assert _before("ddp = DDP(model)\nuse(model)\n") == "ddp"
    assert _before("fully_shard(model)\nuse(model)\n") == "fsdp2"
    assert _before("ddp = DDP(model)\nmodel = build()\nuse(model)\n") is None  # bound again: another object


def test_through_module_and_unwrap_model():
    assert _before("model = DDP(model)\nuse(model.module)\n") == "ddp"
    source = "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\nuse(accelerator.unwrap_model(model))\n"
    assert _before(source) == "prepare"


def test_order_and_branches():
    assert _before("use(model)\nmodel = DDP(model)\n") is None
    assert _before("if flag:\n    use(model)\nelse:\n    model = DDP(model)\n") is None
    assert _before("if world_size > 1:\n    model = DDP(model)\nuse(model)\n") == "ddp"
    # another function's wrap: the order of the two calls is not known
    assert _before("def wrap(model):\n    return DDP(model)\ndef peft(model):\n    use(model)\n") is None


def test_wrapped_after():
    assert _after("use(model)\nmodel = FSDP(model)\n") == "fsdp1"
    assert _after("use(model)\nfully_shard(model)\n") == "fsdp2"
    assert _after("use(model)\nmodel = build()\nmodel = FSDP(model)\n") is None  # another model by then
    assert _after("model = FSDP(model)\nuse(model)\n") is None


def test_model_key_and_wrap_kind():
    facts = _facts("accelerator = Accelerator()\nuse(accelerator.unwrap_model(ddp.module), accelerator.prepare(m))\n")
    use = _use(facts)
    assert model_key(facts, use.args[0].value) == "ddp"
    assert wrap_kind(facts, use.args[1].value) == "prepare"
    assert wrap_kind(facts, use) is None


def test_a_submodule_of_a_wrapped_model():
    assert _before("model = DDP(model)\nuse(model.module.unet)\n") == "ddp"
    assert _before("use(model.unet)\n") is None


def test_moving_the_model_keeps_it():
    assert _after("use(model)\nmodel = model.to(rank)\nmodel = FSDP(model)\n") == "fsdp1"
    assert _before("model = DDP(model)\nmodel = model.cuda()\nuse(model)\n") == "ddp"
