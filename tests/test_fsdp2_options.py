"""What FSDP2 makes of FSDP1 options (``lintdist.fsdp2_options``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.engine import apply_text_edits
from lintdist.facts import PythonFacts
from lintdist.fsdp import fsdp_config_settings
from lintdist.fsdp2_options import judge_launch_options, judge_plugin, repair_all, unreadable_option
from lintdist.model import Severity
from lintdist.names import NameResolver
from lintdist.sources import parse_config
from lintdist.syntax import SyntaxIndex


def _plugin(code: str) -> tuple[PythonFacts, cst.Call]:
    text = textwrap.dedent(code)
    index = SyntaxIndex(cst.parse_module(text))
    facts = PythonFacts(index, NameResolver(index))
    return facts, next(c for c in facts.calls if "Plugin" in index.module.code_for_node(c.func))


def _judged(options: dict[str, object], *, yaml: bool = True) -> dict[str, object]:
    return {p.name: p for p in judge_launch_options(options, str, yaml=yaml)}


def test_ignored_launch_options_are_removed_and_no_prefetch_is_fine():
    found = _judged({"fsdp_use_orig_params": True, "fsdp_backward_prefetch": "NO_PREFETCH", "fsdp_version": 2})
    assert list(found) == ["fsdp_use_orig_params"]
    assert found["fsdp_use_orig_params"].remove and found["fsdp_use_orig_params"].severity is Severity.WARNING


def test_sync_module_states_false_raises_only_with_cpu_ram_efficient_loading_on():
    assert _judged({"fsdp_sync_module_states": False})["fsdp_sync_module_states"].severity is Severity.ERROR
    off = {"fsdp_sync_module_states": False, "fsdp_cpu_ram_efficient_loading": False}
    assert _judged(off)["fsdp_sync_module_states"].severity is Severity.WARNING


def test_a_strategy_maps_to_reshard_after_forward_unsafely_when_false():
    grad_op = _judged({"fsdp_sharding_strategy": "SHARD_GRAD_OP"})["fsdp_sharding_strategy"]
    assert (grad_op.value, grad_op.rename, grad_op.safe) == (False, "fsdp_reshard_after_forward", False)
    full = _judged({"fsdp_sharding_strategy": 1})["fsdp_sharding_strategy"]
    assert (full.value, full.safe) == (True, True)
    beside = _judged({"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_reshard_after_forward": True})
    assert beside["fsdp_sharding_strategy"].remove


def test_reshard_after_forward_from_the_shell_is_uncertain():
    assert not _judged({"fsdp_reshard_after_forward": "$R"}, yaml=False)["fsdp_reshard_after_forward"].certain
    strategy = _judged({"fsdp_reshard_after_forward": "FULL_SHARD"})["fsdp_reshard_after_forward"]
    assert strategy.certain and strategy.value is True
    assert _judged({"fsdp_reshard_after_forward": "false"}) == {}


def test_plugin_keywords():
    facts, call = _plugin(
        """\
        from accelerate import FullyShardedDataParallelPlugin
        from torch.distributed.fsdp import CPUOffload
        FullyShardedDataParallelPlugin(
            fsdp_version=2, use_orig_params=None, forward_prefetch=False, sharding_strategy="SHARD_GRAD_OP",
            cpu_offload=CPUOffload(offload_params=True), backward_prefetch="NO_PREFETCH",
        )
        """
    )
    found = {p.arg.keyword.value: p for p in judge_plugin(facts, call)}
    assert sorted(found) == ["cpu_offload", "forward_prefetch", "sharding_strategy"]
    assert found["sharding_strategy"].replacement.keyword.value == "reshard_after_forward"
    assert facts.index.module.code_for_node(found["cpu_offload"].replacement.value) == "True"
    assert found["forward_prefetch"].replacement is None and found["forward_prefetch"].fixable


def test_unreadable_options_are_those_whose_values_fsdp2_checks():
    facts, call = _plugin(
        """\
        from accelerate import FullyShardedDataParallelPlugin
        FullyShardedDataParallelPlugin(sharding_strategy=args.s, use_orig_params=args.u, cpu_offload=None)
        """
    )
    assert [unreadable_option(facts, a) for a in call.args] == [True, False, False]


def test_repair_all_repairs_every_problem_or_none():
    text = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_use_orig_params: true\n"
    settings = fsdp_config_settings(parse_config(text), "c.yaml")
    options = {name: s.value for name, s in settings.items()}
    edits = repair_all(text, options, settings, str, yaml=True)
    assert apply_text_edits(text, edits) == "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
    assert repair_all(text, {"fsdp_version": 2}, settings, str, yaml=True) == []
    # a problem said by no setting here (another file's key) has no repair
    assert repair_all(text, {**options, "fsdp_sync_module_states": True}, settings, str, yaml=True) is None
    # nor has one that cannot be repaired (LOCAL_STATE_DICT)
    assert repair_all(text, {**options, "fsdp_state_dict_type": "LOCAL_STATE_DICT"}, settings, str, yaml=True) is None
