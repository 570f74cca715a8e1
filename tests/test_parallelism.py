"""The parallelism sizes in force and the context-parallel regions of a script (lintdist/parallelism.py)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.launch import LaunchSettings, Setting
from lintdist.names import NameResolver
from lintdist.parallelism import (
    Size,
    accelerator_configs,
    buffer_lists,
    context_parallel_call,
    launch_size,
    mesh_accelerator,
    model_parallel,
    parallelism_size,
    sequence_dim_like,
)
from lintdist.syntax import SyntaxIndex


def _facts(source: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(source)))
    return PythonFacts(index, NameResolver(index))


def _line(node: cst.CSTNode) -> int:
    return 7  # a stand-in: the tests read the words, not the positions


def _settings(*settings: Setting) -> LaunchSettings:
    return LaunchSettings({s.name: s for s in settings})


def test_a_literal_above_one_wins_and_an_expression_is_unknown():
    facts = _facts(
        """
        from accelerate import ParallelismConfig
        a = ParallelismConfig(dp_shard_size=2, cp_size=1)
        b = ParallelismConfig(cp_size=args.cp)
        c = ParallelismConfig(1, 2, 1, 4)
        """
    )
    assert parallelism_size(facts, None, _line, "cp") == Size(4, "`ParallelismConfig(cp_size=4)` at line 7")
    configs = [call for call in facts.calls if facts.method_name(call) == "ParallelismConfig"]
    assert parallelism_size(facts, None, _line, "cp", configs[:2]).value is None
    assert parallelism_size(facts, None, _line, "sp") == Size(
        1, "`ParallelismConfig` at line 7 reads `PARALLELISM_CONFIG_SP_SIZE`"
    )


def test_the_launch_says_the_size_only_when_it_exports_it():
    flag = Setting("parallelism_config_cp_size", "4", "run.sh", 3, 1, "flag")
    switch = Setting("use_parallelism_config", "true", "run.sh", 3, 1, "flag")
    assert launch_size(_settings(flag), "cp") is None
    assert launch_size(_settings(flag, switch), "cp") == Size(4, "`--parallelism_config_cp_size 4` at run.sh:3")
    env = Setting("parallelism_config_cp_size", "n", "job/env.sh", 2, 1, "env")
    assert launch_size(_settings(env), "cp") == Size(None, "env.sh:2")
    facts = _facts("from accelerate import ParallelismConfig\nconfig = ParallelismConfig(dp_shard_size=2)\n")
    assert parallelism_size(facts, _settings(flag, switch), _line, "cp").value == 4
    assert parallelism_size(_facts("x = 1\n"), None, _line, "cp") is None


def test_the_configs_an_accelerator_is_given():
    facts = _facts(
        """
        from accelerate import Accelerator, ParallelismConfig
        config = ParallelismConfig(cp_size=2)
        accelerator = Accelerator(parallelism_config=config)
        plain = Accelerator()
        done()
        """
    )
    code = facts.index.module.code_for_node
    (given,) = accelerator_configs(facts, cst.Name("accelerator"), facts.calls[-1])
    assert code(given) == "ParallelismConfig(cp_size=2)"
    assert accelerator_configs(facts, cst.Name("plain"), facts.calls[-1]) == []
    assert accelerator_configs(facts, cst.Name("unknown"), facts.calls[-1]) is None


def test_context_parallel_calls_by_accelerator_torch_or_a_bound_name():
    facts = _facts(
        """
        from torch.distributed.tensor.experimental import context_parallel
        from accelerate import Accelerator
        accelerator = Accelerator()
        region = accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1])
        with region:
            pass
        with context_parallel(mesh, buffers=[ids]):
            pass
        with torch.no_grad():
            pass
        """
    )
    blocks = facts.index.nodes(cst.With)
    found = [context_parallel_call(facts, block.items[0].item, block) for block in blocks]
    code = facts.index.module.code_for_node
    assert [code(call.func) if call is not None else None for call in found] == [
        "accelerator.maybe_context_parallel",
        "context_parallel",
        None,
    ]


def test_mesh_accelerator_follows_the_mesh_back_to_its_accelerator():
    facts = _facts(
        """\
        from accelerate import Accelerator
        accelerator = Accelerator()
        mesh = accelerator.torch_device_mesh
        mesh["sp"]
        accelerator.state.device_mesh["dp"]
        other.device_mesh["sp"]
        """
    )
    code = facts.index.module.code_for_node
    found = [mesh_accelerator(facts, s.value, s) for s in facts.index.nodes(cst.Subscript)]
    assert [code(f[0]) if f else None for f in found] == ["accelerator", "accelerator", None]
    assert code(found[0][1]) == "accelerator.torch_device_mesh"


def test_model_parallelism_named_in_the_text_or_set_at_launch():
    assert model_parallel("config = ParallelismConfig(tp_size=2)", None)
    assert model_parallel("model = parallelize(model, plan={'x': SequenceParallel()})", None)
    assert not model_parallel("accelerator = Accelerator()", None)
    assert model_parallel("", _settings(Setting("parallelism_config_cp_size", 2, "cfg.yaml", 3, 0, "yaml")))
    assert not model_parallel("", _settings(Setting("mixed_precision", "bf16", "cfg.yaml", 3, 0, "yaml")))


def test_sequence_dim_like_the_tensor_the_input_ids_or_the_shared_one():
    code = cst.Module([]).code_for_node

    def dim(buffers: str, dims: str, tensor: str) -> str | None:
        found = sequence_dim_like(cst.parse_expression(buffers), cst.parse_expression(dims), tensor, code)
        return None if found is None else code(found)

    assert dim("[ids, labels, pos]", "[1, 2, 0]", "labels") == "2"
    assert dim('[batch["input_ids"], mask]', "[1, 0]", 'batch["labels"]') == "1"
    assert dim("[inputs, mask]", "[seq, 0]", "labels") == "seq"
    assert dim("[a, b]", "[1, 1]", "labels") == "1"
    assert dim("[a, b]", "[1, 0]", "labels") is None


def test_buffer_lists_in_the_call_or_bound_before_the_block_and_what_adding_one_changes():
    facts = _facts(
        """
        for batch in loader:
            buffers = [batch["input_ids"], batch["labels"]]
            with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1], no_restore_buffers={x}):
                pass
            with accelerator.maybe_context_parallel(buffers=[a, *rest], buffer_seq_dims=[1, 1]):
                pass
            with accelerator.maybe_context_parallel(buffers=[a], buffer_seq_dims=[1, 1]):
                pass
            with cp_context:
                pass
        """
    )
    code = facts.index.module.code_for_node
    blocks = facts.index.nodes(cst.With)
    contexts = [b.items[0].item for b in blocks]
    lists = buffer_lists(facts, contexts[0], blocks[0])
    assert code(lists.buffers) == '[batch["input_ids"], batch["labels"]]' and code(lists.dims) == "[1, 1]"
    assert lists.buffers_line is not None and lists.dims_line is None and code(lists.keep) == "{x}"
    changed = {code(old): code(new) for old, new in lists.adding(cst.parse_expression("s"), cst.Integer("1"))}
    assert changed == {
        "{x}": "{x, s}",
        'buffers = [batch["input_ids"], batch["labels"]]\n': 'buffers = [batch["input_ids"], batch["labels"], s]\n',
        "[1, 1]": "[1, 1, 1]",
    }
    assert buffer_lists(facts, contexts[1], blocks[1]) is None  # starred
    assert buffer_lists(facts, contexts[2], blocks[2]) is None  # lengths differ
