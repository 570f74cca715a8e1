"""What FSDP a plugin, an accelerate config, launch flags or the environment set up (``lintdist.fsdp``)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.fsdp import (
    config_options,
    config_version,
    fsdp_config_settings,
    fsdp_section,
    given_plugins,
    is_local_state_dict,
    launch_line_options,
    launch_settings,
    launched_fsdp,
    normalised_key,
    plugin_version,
    runs_fsdp,
    section_options,
    strategy_name,
)
from lintdist.launch import LaunchSettings, Setting
from lintdist.names import NameResolver
from lintdist.sources import parse_config, parse_launch
from lintdist.syntax import SyntaxIndex

CONFIG = """\
distributed_type: FSDP
fsdp_config:
  version: 2
  fsdp_use_orig_params: true
"""


def _plugin(code: str) -> tuple[PythonFacts, cst.Call, str]:
    text = textwrap.dedent(code)
    index = SyntaxIndex(cst.parse_module(text))
    facts = PythonFacts(index, NameResolver(index))
    call = next(c for c in facts.calls if "Plugin" in index.module.code_for_node(c.func))
    return facts, call, text


def test_strategy_names_by_word_number_and_string_number():
    assert [strategy_name(v) for v in ("shard_grad_op", 2, " 4 ", "HYBRID_SHARD_ZERO2")] == [
        "SHARD_GRAD_OP",
        "SHARD_GRAD_OP",
        "HYBRID_SHARD",
        "HYBRID_SHARD_ZERO2",
    ]
    assert [strategy_name(v) for v in (True, 0, 6, "FULL", None)] == [None] * 5


def test_local_state_dict_spellings():
    assert is_local_state_dict("local_state_dict") and is_local_state_dict(2)
    assert is_local_state_dict("StateDictType.LOCAL_STATE_DICT")
    assert not is_local_state_dict("SHARDED_STATE_DICT")


def test_config_options_by_the_launchers_names():
    document = parse_config(CONFIG)
    assert runs_fsdp(document)
    assert normalised_key("version") == "fsdp_version" and normalised_key("fsdp_version") == "fsdp_version"
    assert config_options(document) == {"fsdp_version": 2, "fsdp_use_orig_params": True}
    assert config_version(fsdp_section(document)) == 2
    assert section_options(None) == {}
    assert sorted(fsdp_config_settings(document, "c.yaml")) == ["fsdp_use_orig_params", "fsdp_version"]


def test_a_config_that_does_not_run_fsdp_sets_no_fsdp_options():
    for text in (
        CONFIG.replace("FSDP", "MULTI_GPU", 1),
        CONFIG.split("\n", 1)[1],
        "fsdp_config: 3\ndistributed_type: FSDP\n",
    ):
        document = parse_config(text)
        assert fsdp_section(document) is None and config_options(document) == {}
    assert not runs_fsdp(None)


def test_launch_settings_of_a_line_and_of_exports_alone():
    text = "export FSDP_VERSION=2\naccelerate launch --use_fsdp --fsdp-use-orig-params true train.py\n"
    launch = parse_launch(text)
    line = {(s.name, s.spelling) for s in launch_settings(text, launch, launch.commands[0], "run.sh")}
    assert {("fsdp_version", "env"), ("fsdp_use_orig_params", "flag")} <= line
    alone = launch_settings(text, launch, None, "run.sh")
    assert [(s.name, s.spelling) for s in alone] == [("fsdp_version", "env")]


def test_plugin_version_from_the_keyword_or_the_first_argument():
    assert plugin_version(*_plugin("FullyShardedDataParallelPlugin(fsdp_version=2)\n")[:2], None, "")[0] == 2
    assert plugin_version(*_plugin("v = 1\nFullyShardedDataParallelPlugin(v)\n")[:2], None, "")[0] == 1
    assert plugin_version(*_plugin("FullyShardedDataParallelPlugin(fsdp_version=args.v)\n")[:2], None, "")[0] is None


def test_plugin_version_without_a_keyword_comes_from_the_launch():
    facts, call, text = _plugin("FullyShardedDataParallelPlugin(use_orig_params=True)\n")
    assert plugin_version(facts, call, None, text) == (1, None)  # nothing launched: accelerate's default
    settings = LaunchSettings()
    settings.set(Setting("distributed_type", "FSDP", "c.yaml", 1, 1, "yaml"))
    settings.set(Setting("fsdp_version", 2, "c.yaml", 3, 3, "yaml"))
    version, setting = plugin_version(facts, call, settings, text)
    assert version == 2 and setting.path == "c.yaml"
    facts, call, text = _plugin("FullyShardedDataParallelPlugin(**options)\n")
    assert plugin_version(facts, call, settings, text) == (None, None)
    facts, call, text = _plugin('os.environ["FSDP_VERSION"] = "2"\nFullyShardedDataParallelPlugin()\n')
    assert plugin_version(facts, call, settings, text) == (None, None)


def test_launched_fsdp_defaults_to_version_one():
    settings = LaunchSettings()
    assert launched_fsdp(settings) is None
    settings.set(Setting("distributed_type", "FSDP", "c.yaml", 1, 1, "yaml"))
    assert launched_fsdp(settings)[0] == 1
    settings.set(Setting("fsdp_version", "2", "c.yaml", 3, 3, "yaml"))
    version, setting = launched_fsdp(settings)
    assert (version, setting.line) == (2, 3)


def test_given_plugins():
    facts, _call, text = _plugin(
        """\
        from accelerate import Accelerator, FullyShardedDataParallelPlugin
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if big else None
        Accelerator(fsdp_plugin=plugin)
        """
    )
    accelerator = facts.accelerator_constructions[0]
    found = given_plugins(facts, accelerator, None, text)
    assert sorted(str(p[1]) if p else "none" for p in found) == ["2", "none"]
    assert given_plugins(facts, cst.parse_expression("Accelerator()"), None, text) == []
    assert given_plugins(facts, cst.parse_expression("Accelerator(fsdp_plugin=make())"), None, text) is None


def test_a_launch_lines_fsdp_options_are_its_configs_overridden_by_its_flags():
    document = parse_config("distributed_type: FSDP\nfsdp_config:\n  version: 1\n  fsdp_use_orig_params: true\n")
    (command,) = parse_launch(
        "accelerate launch --config_file c.yaml --fsdp-version 2 --num_processes 2 train.py --fsdp_x 1\n"
    ).commands
    assert launch_line_options(command, document) == {"fsdp_version": "2", "fsdp_use_orig_params": True}
    assert launch_line_options(command, None) == {"fsdp_version": "2"}
    other = parse_config("distributed_type: MULTI_GPU\nfsdp_config:\n  fsdp_version: 2\n")
    assert launch_line_options(command, other) == {"fsdp_version": "2"}  # a config that runs no FSDP gives none
