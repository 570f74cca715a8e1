"""Edits of one launch setting in its own spelling: YAML keys, launch flags, environment variables, keywords."""

from __future__ import annotations

import libcst as cst

from lintdist.edits import with_arg_changes, with_keyword
from lintdist.engine import apply_text_edits
from lintdist.launch import (
    LaunchSettings,
    add_setting,
    command_settings,
    config_settings,
    edit_setting,
    setting_place,
    setting_span,
    top_key_setting,
)
from lintdist.model import Span
from lintdist.sources import parse_config, parse_launch

CONFIG = """\
# FSDP2 run on 8 GPUs
distributed_type: FSDP   # chosen by hand
fsdp_config:
  version: 2  # short keys get the fsdp_ prefix
  fsdp_sharding_strategy: "SHARD_GRAD_OP"  # from the FSDP1 config
  fsdp_use_orig_params: true
parallelism_config:
  parallelism_config_cp_size: 2
num_processes: 8
"""


def _yaml(text: str) -> dict:
    return {s.name: s for s in config_settings(parse_config(text), "config.yaml")}


def _edit(text, setting, **change):
    return apply_text_edits(text, list(edit_setting(text, setting, **change)))


def test_yaml_names_follow_the_launcher():
    settings = _yaml(CONFIG)
    assert settings["fsdp_version"].value == 2
    assert settings["fsdp_version"].raw == "version"
    assert settings["parallelism_config_cp_size"].value == 2
    assert settings["parallelism_config_cp_size"].keys == ("parallelism_config", "parallelism_config_cp_size")
    assert (settings["num_processes"].line, settings["num_processes"].column) == (9, 1)


def test_yaml_remove_keeps_comments_order_and_quoting():
    fixed = _edit(CONFIG, _yaml(CONFIG)["fsdp_use_orig_params"], remove=True)
    assert fixed == CONFIG.replace("  fsdp_use_orig_params: true\n", "")


def test_yaml_rename_keeps_the_comment_and_the_mapping_style():
    settings = _yaml(CONFIG)
    fixed = _edit(CONFIG, settings["fsdp_sharding_strategy"], value=False, rename="fsdp_reshard_after_forward")
    assert "  fsdp_reshard_after_forward: false  # from the FSDP1 config\n" in fixed
    # an unprefixed key is renamed without the prefix, as the file writes its keys
    fixed = _edit(CONFIG, settings["fsdp_version"], value=1, rename="fsdp_version")
    assert "  version: 1  # short keys get the fsdp_ prefix\n" in fixed
    assert parse_config(fixed).data["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"


def test_yaml_add_in_the_mapping_with_its_indentation_and_line_endings():
    text = CONFIG.replace("\n", "\r\n")
    settings = _yaml(text)
    after = apply_text_edits(text, list(add_setting(text, settings["fsdp_use_orig_params"], "fsdp_cpu_offload", True)))
    assert "  fsdp_use_orig_params: true\r\n  fsdp_cpu_offload: true\r\nparallelism_config:" in after
    before = apply_text_edits(
        text, list(add_setting(text, settings["fsdp_version"], "fsdp_auto_wrap_policy", "X", before=True))
    )
    assert "fsdp_config:\r\n  auto_wrap_policy: X\r\n  version: 2" in before
    assert parse_config(before).data["fsdp_config"]["auto_wrap_policy"] == "X"


def test_yaml_flow_mapping_and_anchor_keys_are_not_edited():
    flow = "distributed_type: FSDP\nfsdp_config: {fsdp_version: 2, fsdp_use_orig_params: true}\n"
    assert edit_setting(flow, _yaml(flow)["fsdp_use_orig_params"], remove=True) == ()
    merged = (
        "base: &b\n  fsdp_use_orig_params: true\ndistributed_type: FSDP\nfsdp_config:\n  <<: *b\n  fsdp_version: 2\n"
    )
    settings = _yaml(merged)
    assert settings["fsdp_use_orig_params"].editable is False
    assert edit_setting(merged, settings["fsdp_use_orig_params"], remove=True) == ()


LAUNCH = """\
export FSDP_VERSION=2
export FSDP_USE_ORIG_PARAMS=true; echo start
FSDP_SYNC_MODULE_STATES=false accelerate launch \\
  --use_fsdp --fsdp-version 2 \\
  --fsdp-use-orig-params true \\
  --fsdp_reshard_after_forward=FULL_SHARD \\
  --num_processes 2 "my train.py" --lr 1e-4
"""


def _launch(text: str) -> dict:
    launch = parse_launch(text)
    return {(s.spelling, s.name): s for s in command_settings(launch.commands[0], launch, text, "launch.sh")}


def test_flag_remove_takes_its_continued_line():
    settings = _launch(LAUNCH)
    fixed = _edit(LAUNCH, settings["flag", "fsdp_use_orig_params"], remove=True)
    assert fixed == LAUNCH.replace("  --fsdp-use-orig-params true \\\n", "")
    assert parse_launch(fixed).commands[0].script.text == "my train.py"


def test_flag_values_and_names_in_their_own_style():
    settings = _launch(LAUNCH)
    fixed = _edit(LAUNCH, settings["flag", "fsdp_reshard_after_forward"], value=True)
    assert "  --fsdp_reshard_after_forward=true \\\n" in fixed
    fixed = _edit(LAUNCH, settings["flag", "fsdp_use_orig_params"], value=False, rename="fsdp_cpu_offload")
    assert "  --fsdp-cpu-offload false \\\n" in fixed
    added = apply_text_edits(
        LAUNCH, list(add_setting(LAUNCH, settings["flag", "use_fsdp"], "fsdp_state_dict_type", "FULL_STATE_DICT"))
    )
    assert "  --use_fsdp --fsdp_state_dict_type FULL_STATE_DICT --fsdp-version 2 \\\n" in added
    assert setting_span(LAUNCH, settings["flag", "fsdp_use_orig_params"]).line == 5


def test_environment_assignments():
    settings = _launch(LAUNCH)
    fixed = _edit(LAUNCH, settings["env", "fsdp_version"], remove=True)
    assert fixed.startswith("export FSDP_USE_ORIG_PARAMS=true; echo start\n")
    fixed = _edit(LAUNCH, settings["env", "fsdp_use_orig_params"], remove=True)
    assert "\necho start\n" in fixed and "export FSDP_USE" not in fixed
    fixed = _edit(LAUNCH, settings["env", "fsdp_sync_module_states"], remove=True)
    assert "\naccelerate launch \\\n" in fixed
    fixed = _edit(LAUNCH, settings["env", "fsdp_sync_module_states"], value=True)
    assert "FSDP_SYNC_MODULE_STATES=true accelerate launch" in fixed


def test_precedence_flag_over_environment_over_yaml():
    settings = LaunchSettings()
    for setting in _yaml(CONFIG).values():
        settings.set(setting)
    launch = parse_launch("FSDP_VERSION=1 accelerate launch --num_processes 4 train.py\n")
    for setting in command_settings(launch.commands[0], launch, "", "launch.sh"):
        settings.set(setting)
    assert (settings.get("num_processes").value, settings.get("num_processes").spelling) == ("4", "flag")
    assert (settings.get("fsdp_version").value, settings.get("fsdp_version").spelling) == ("1", "env")
    assert settings.get("parallelism_config_cp_size").spelling == "yaml"


def test_keyword_edits_keep_the_call_layout():
    module = cst.parse_module("plugin = Plugin(\n    use_orig_params=True,  # FSDP1\n    cpu_offload=False,\n)\n")
    call = module.body[0].body[0].value
    dropped = with_arg_changes(call, {id(call.args[0]): None})
    added = with_keyword(dropped, "fsdp_version", cst.Integer("2"))
    code = module.code_for_node(added)
    assert code == "Plugin(\n    fsdp_version=2,\n    cpu_offload=False,\n)"
    assert module.code_for_node(with_keyword(cst.parse_expression("Plugin()"), "fsdp_version", cst.Integer("2"))) == (
        "Plugin(fsdp_version=2)"
    )


CODE = """\
from accelerate import Accelerator, FullyShardedDataParallelPlugin as Plugin, ParallelismConfig
from accelerate.utils import DataLoaderConfiguration

CP = 2
plugin = Plugin(fsdp_version=2, auto_wrap_policy=None, reshard_after_forward=args.reshard)
accelerator = Accelerator(
    fsdp_plugin=plugin,
    parallelism_config=ParallelismConfig(cp_size=CP),
    gradient_accumulation_steps=4,
    dataloader_config=DataLoaderConfiguration(split_batches=True),
)
"""


def _in_force(source: str, launch: LaunchSettings | None = None) -> LaunchSettings:
    from lintdist.facts import PythonFacts
    from lintdist.launch import code_settings, in_force
    from lintdist.model import Span
    from lintdist.names import NameResolver
    from lintdist.syntax import SyntaxIndex

    module = cst.parse_module(source)
    index = SyntaxIndex(module)
    facts = PythonFacts(index, NameResolver(index))

    def span(node):  # the line is enough here
        return Span(source[: source.index(module.code_for_node(node))].count("\n") + 1, 1, 1, 1)

    return in_force(launch, code_settings(facts, span), "train.py")


def test_code_keywords_join_the_table_under_the_launchers_names():
    from lintdist.launch import number, switched_on, written

    settings = _in_force(CODE)
    assert number(settings.get("fsdp_version")) == 2
    assert number(settings.get("parallelism_config_cp_size")) == 2  # through the name CP
    assert switched_on(settings.get("split_batches"))
    assert settings.get("fsdp_auto_wrap_policy") is None  # an explicit None is accelerate's default
    assert number(settings.get("fsdp_reshard_after_forward")) is None  # args.reshard: unknown
    assert settings.distributed_type.value == "FSDP"
    assert written(settings.get("fsdp_version")) == "`fsdp_version=2` at train.py:5"
    assert written(settings.get("fsdp_reshard_after_forward")) == "`reshard_after_forward=...` at train.py:5"
    assert written(settings.get("fsdp_version"), where=False) == "`fsdp_version=2`"


def test_code_over_launch_except_where_accelerate_reads_the_environment_first():
    from lintdist.launch import number

    launch = LaunchSettings()
    text = (
        "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=8 accelerate launch --fsdp_version 1 --mixed_precision bf16 train.py\n"
    )
    parsed = parse_launch(text)
    for setting in command_settings(parsed.commands[0], parsed, text, "launch.sh"):
        launch.set(setting)
    settings = _in_force(CODE, launch)
    assert (number(settings.get("fsdp_version")), settings.get("fsdp_version").spelling) == (2, "python")
    # Accelerator.__init__: parse_choice_from_env("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", keyword)
    assert (
        number(settings.get("gradient_accumulation_steps")),
        settings.get("gradient_accumulation_steps").spelling,
    ) == (8, "env")
    assert settings.get("mixed_precision").spelling == "flag"
    # a plugin's `num_steps` is not read from the environment
    plugin = "from accelerate.utils import GradientAccumulationPlugin\np = GradientAccumulationPlugin(num_steps=2)\n"
    assert number(_in_force(plugin, launch).get("gradient_accumulation_steps")) == 2


def test_two_values_in_code_are_unknown():
    from lintdist.launch import number

    source = "from accelerate import Accelerator\nif fast:\n    a = Accelerator(gradient_accumulation_steps=1)\nelse:\n    a = Accelerator(gradient_accumulation_steps=4)\n"
    assert number(_in_force(source).get("gradient_accumulation_steps")) is None


def test_accelerator_split_batches_keyword_is_not_a_setting():
    # accelerate 1.15 binds Accelerator(split_batches=...) to a sentinel that nothing reads
    source = "from accelerate import Accelerator\naccelerator = Accelerator(split_batches=True)\n"
    assert _in_force(source).get("split_batches") is None


def test_the_launcher_exports_parallelism_settings_only_when_asked():
    from lintdist.launch import parallelism_exported

    def settings(config: str, line: str) -> LaunchSettings:
        table = LaunchSettings()
        for setting in config_settings(parse_config(config), "config.yaml") if config else ():
            table.set(setting)
        parsed = parse_launch(line)
        for setting in command_settings(parsed.commands[0], parsed, line, "launch.sh"):
            table.set(setting)
        return table

    section = "distributed_type: FSDP\nparallelism_config:\n  parallelism_config_cp_size: 2\n"
    assert parallelism_exported(settings(section, "accelerate launch train.py\n"))
    # a backend flag on the line keeps the launcher from taking use_parallelism_config from the config
    assert not parallelism_exported(settings(section, "accelerate launch --use_fsdp train.py\n"))
    assert not parallelism_exported(settings("", "accelerate launch --parallelism_config_cp_size 2 train.py\n"))
    flag = "accelerate launch --use_fsdp --use_parallelism_config --parallelism_config_cp_size 2 train.py\n"
    assert parallelism_exported(settings("", flag))


def test_a_top_level_key_is_a_setting_spanning_its_line():
    document = parse_config(CONFIG)
    backend = top_key_setting(document, "distributed_type", "config.yaml")
    assert (backend.line, backend.column, backend.value, backend.keys) == (2, 1, "FSDP", ("distributed_type",))
    assert setting_span(CONFIG, backend) == Span(2, 1, 2, 23)  # the key and its value, not the comment
    section = top_key_setting(document, "fsdp_config", "config.yaml")
    assert setting_span(CONFIG, section) == Span(3, 1, 3, 12)  # a mapping: the key alone
    assert top_key_setting(document, "use_cpu", "config.yaml") is None
    merged = parse_config("base: &b\n  distributed_type: FSDP\n<<: *b\nnum_processes: 2\n")
    assert top_key_setting(merged, "distributed_type", "c.yaml") is None


def test_a_setting_is_placed_by_its_file_name_and_line():
    settings = {s.name: s for s in config_settings(parse_config(CONFIG), "configs/fsdp/config.yaml")}
    assert setting_place(settings["num_processes"]) == "config.yaml:9"
    assert setting_place(settings["fsdp_version"]) == "config.yaml:4"
