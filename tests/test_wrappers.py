"""How a model is wrapped (lintdist/wrappers.py): DDP, FSDP1, FSDP2, and the module a forward runs."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.project import Project, reset_process_project
from lintdist.syntax import SyntaxIndex
from lintdist.wrappers import (
    forward_of,
    forward_run,
    forward_target,
    inner_module_forwards,
    is_wrapped,
    module_wrapper_kinds,
    names_bound_to_wrapped,
    never_shards,
    runs_wrapped,
    wrapped_parameters_run,
    wrapper_calls,
    wrapper_kind,
    wrapper_kinds,
    wraps_elsewhere,
)


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _use(facts: PythonFacts) -> cst.Call:
    return next(c for c in facts.index.nodes(cst.Call) if isinstance(c.func, cst.Name) and c.func.value == "use")


SOURCE = """
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy, fully_shard

ddp = DDP(net)
sharded = FSDP(net)
replicated = FSDP(net, sharding_strategy=ShardingStrategy.NO_SHARD)
fully_shard(block)
either = DDP(net) if flag else net
use(ddp, sharded, replicated, either, block, net)
"""


def test_wrapper_kinds_per_origin():
    facts = _facts(SOURCE)
    use = _use(facts)
    kinds = [wrapper_kinds(facts, arg.value, use) for arg in use.args]
    assert kinds[:4] == [{"ddp"}, {"fsdp1"}, {"fsdp1"}, {"ddp", "unknown"}]
    assert kinds[5] in ({"unknown"}, set())  # an unbound name: nothing known


def test_wrapper_calls_and_is_wrapped_by_kind():
    facts = _facts(SOURCE)
    use = _use(facts)
    ddp, sharded, _, either, _, net = (arg.value for arg in use.args)
    assert len(wrapper_calls(facts, ddp, use)) == 1
    assert wrapper_calls(facts, sharded, use) == []
    assert len(wrapper_calls(facts, sharded, use, "fsdp1")) == 1
    assert is_wrapped(facts, either, use)
    assert not is_wrapped(facts, net, use)


def test_module_wrapper_kinds_and_the_kind_of_one_call():
    facts = _facts(SOURCE)
    assert module_wrapper_kinds(facts) == {"ddp", "fsdp1", "fsdp2"}
    calls = {facts.index.module.code_for_node(c.func): c for c in facts.wrapped_models()}
    assert wrapper_kind(facts, calls["fully_shard"]) == "fsdp2"
    assert wrapper_kind(facts, _use(facts)) is None
    assert module_wrapper_kinds(_facts("model = DistributedDataParallel(net)\n")) == {"ddp"}  # a snippet's name
    assert (
        module_wrapper_kinds(_facts("from mylib import DistributedDataParallel\nDistributedDataParallel(net)\n"))
        == set()
    )


def test_never_shards_reads_the_sharding_strategy():
    facts = _facts(SOURCE)
    module = facts.index.module
    fsdp = [c for c in facts.wrapped_models() if wrapper_kind(facts, c) == "fsdp1"]
    assert [never_shards(c, module) for c in fsdp] == [False, True]
    positional = cst.parse_expression("FSDP(net, None, ShardingStrategy.NO_SHARD)")
    assert never_shards(positional, module)


def test_forward_target():
    code = cst.Module([]).code_for_node
    assert code(forward_target(cst.parse_expression("model(x)"))) == "model"
    assert code(forward_target(cst.parse_expression("self.model.forward(x)"))) == "self.model"
    assert code(forward_target(cst.parse_expression("model.generate(x)"))) == "model.generate"


def test_forward_of_names_the_counted_module():
    models = frozenset({"model", "self.disc"})
    assert forward_of(cst.parse_expression("model(x)"), models) == "model"
    assert forward_of(cst.parse_expression("self.disc.forward(x)"), models) == "self.disc"
    assert forward_of(cst.parse_expression("model.generate(x)"), models) is None
    assert forward_of(cst.parse_expression("teacher(x)"), models) is None
    assert forward_of(cst.parse_expression("build()(x)"), models) is None


def test_runs_wrapped_and_inner_module_forwards():
    facts = _facts(
        """
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(net)


        def helper(batch):
            return ddp.module(batch)


        ddp(x)
        ddp.forward(x)
        net(x)
        ddp.module(x)
        helper(x)
        """
    )
    calls = [s.body[0].value for s in facts.index.module.body[-5:]]
    assert [runs_wrapped(facts, call) for call in calls] == [True, True, False, False, False]
    assert not runs_wrapped(facts, calls[0], "fsdp1")
    code = facts.index.module.code_for_node
    assert [code(c) for c in inner_module_forwards(facts, facts.index.module.body[-1])] == ["ddp.module(batch)"]
    assert [code(c) for c in inner_module_forwards(facts, facts.index.module.body[-2])] == ["ddp.module(x)"]
    assert inner_module_forwards(facts, facts.index.module.body[-4]) == []


RUN = """
from torch.nn.parallel import DistributedDataParallel as DDP

model = DDP(net)


def compute(m, batch):
    return m(batch).sum()


for x in loader:
    x = x.to(device)
    out = model(x)
    with autocast():
        loss = out.sum()
        loss.backward()
    loss = compute(model, x)
    loss.backward()
"""


def _backwards(facts: PythonFacts) -> list[cst.Call]:
    calls = facts.index.nodes(cst.Call)
    return [c for c in calls if isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"]


def _heads(facts: PythonFacts, statements: list[cst.BaseStatement]) -> list[str]:
    return [facts.index.module.code_for_node(s).strip().splitlines()[0] for s in statements]


def test_forward_run_from_the_forward_to_the_node():
    facts = _facts(RUN)
    inside, after = _backwards(facts)
    statements, model = forward_run(facts, inside)  # out through the `with` block
    assert _heads(facts, statements) == ["out = model(x)", "with autocast():"]
    assert facts.index.module.code_for_node(model) == "model"
    statements, model = forward_run(facts, after)
    assert _heads(facts, statements) == [
        "out = model(x)",
        "with autocast():",
        "loss = compute(model, x)",
        "loss.backward()",
    ]
    assert forward_run(facts, inside, "fsdp1") is None


def test_forward_run_through_a_helper_and_with_two_models():
    helper = _facts(RUN.replace("    out = model(x)\n", ""))
    statements, model = forward_run(helper, _backwards(helper)[1])
    assert _heads(helper, statements) == ["loss = compute(model, x)", "loss.backward()"]
    assert helper.index.module.code_for_node(model) == "model"  # what the run passes to the helper
    assert forward_run(helper, _backwards(helper)[0]) is None  # no forward before it in sight
    two = _facts(
        RUN.replace("model = DDP(net)", "model = DDP(net)\nother = DDP(net)").replace("(model, x)", "(other, x)")
    )
    assert forward_run(two, _backwards(two)[1]) is None  # which of two models to name is unclear


@pytest.fixture
def project_files(tmp_path):
    reset_process_project()
    files = {
        "lib/__init__.py": "",
        "lib/dist.py": (
            "from torch.nn.parallel import DistributedDataParallel\n\n\n"
            "def wrap(model):\n    return DistributedDataParallel(model)\n"
        ),
        "lib/steps.py": "def train_step(ddp_model, batch):\n    ddp_model(batch).backward()\n",
        "train.py": "from lib.dist import wrap\n\nmodel = wrap(net)\n",
        "main.py": (
            "from torch.nn.parallel import DistributedDataParallel\n\nfrom lib.steps import train_step\n\n"
            "train_step(DistributedDataParallel(net), batch)\n"
        ),
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    yield Project(), tmp_path
    reset_process_project()


def test_wraps_elsewhere_follows_the_project_helper(project_files):
    project, root = project_files
    train = project.facts((root / "train.py").resolve())
    assert wraps_elsewhere(train)
    assert not wraps_elsewhere(train, "fsdp1")
    assert not wraps_elsewhere(project.facts((root / "lib/steps.py").resolve()))
    assert not wraps_elsewhere(_facts("from lib.dist import wrap\nmodel = wrap(net)\n"))  # no project in sight


def test_wrapped_parameters_run_by_a_helper_module(project_files):
    project, root = project_files
    assert wrapped_parameters_run(project.facts((root / "lib/steps.py").resolve()))
    assert not wrapped_parameters_run(project.facts((root / "lib/steps.py").resolve()), "fsdp2")
    assert not wrapped_parameters_run(project.facts((root / "lib/dist.py").resolve()))


def test_names_bound_to_wrapped() -> None:
    facts = _facts(
        """
        import deepspeed
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(net)
        self.student = DDP(student)
        engine, optimizer, _, _ = deepspeed.initialize(model=net2)
        other = build(net3)
        """
    )
    initialize = frozenset({"deepspeed.initialize"})
    found = names_bound_to_wrapped(facts, lambda call: facts.callee_is(call, initialize))
    assert found == {"model", "self", "student", "engine", "optimizer", "_"}
    assert names_bound_to_wrapped(facts, lambda call: False) == {"model", "self", "student"}
