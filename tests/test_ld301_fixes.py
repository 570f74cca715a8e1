"""LD301 and LD302 end to end: their YAML and shell fixes, and configs handed to accelerate itself.

tests/test_fixtures.py proves the fixes of ``.py``/``.ipynb`` fixtures one file at a time, and runs the
default rules only. Here each config/launch scenario folder is copied whole (a launch line names its
config), fixed through the CLI and compared with its ``*.fixed.*`` files (LD301) or ``*.unsafe.fixed.*``
files (LD302, off by default, with its expectations in ``*.ld302.expected``). The fixed configs and launch
lines are then parsed by accelerate's own launcher, and the ``FullyShardedDataParallelPlugin`` the script
would build from the exported environment must come up without an error or an FSDP2 deprecation warning.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
TEXT_SUFFIXES = {".yaml", ".yml", ".sh", ".md"}


def _sources(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.iterdir() if p.is_file() and ".fixed." not in p.name and p.suffix in {".py", *TEXT_SUFFIXES}
    )


def _scenarios(code: str) -> list[Path]:
    return sorted(p for p in (FIXTURES / code).iterdir() if p.is_dir())


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / folder.name
    target.mkdir()
    for source in [*_sources(folder), *folder.glob("requirements*.txt")]:  # the pinned versions travel too
        shutil.copy(source, target / source.name)
    return target


def _expected_text(source: Path, marker: str) -> bytes:
    fixed = source.with_name(f"{source.stem}{marker}{source.suffix}")
    return fixed.read_bytes() if fixed.exists() else source.read_bytes()


def _assert_well_formed(path: Path) -> None:
    if path.suffix in {".yaml", ".yml"}:
        assert isinstance(yaml.safe_load(path.read_text()), dict)
    elif path.suffix == ".sh":
        subprocess.run(["bash", "-n", str(path)], check=True)


@pytest.mark.parametrize("folder", _scenarios("ld301"), ids=lambda p: p.name)
def test_ld301_fixes_whole_scenarios(folder, tmp_path, lintdist):
    copy = _copy(folder, tmp_path)
    diff = lintdist("check", "--diff", "--no-cache", "--select", "LD301", str(copy))
    assert all((copy / s.name).read_bytes() == s.read_bytes() for s in _sources(folder)), "--diff must write nothing"
    lintdist("check", "--fix", "--no-cache", "--select", "LD301", str(copy))
    for source in _sources(folder):
        assert (copy / source.name).read_bytes() == _expected_text(source, ".fixed"), source.name
        _assert_well_formed(copy / source.name)
    if any(folder.glob("*.fixed.*")):
        assert diff.output.startswith("---"), diff.output
    second = lintdist("check", "--fix", "--no-cache", "--select", "LD301", "--output-format", "json", str(copy))
    for source in _sources(folder):
        assert (copy / source.name).read_bytes() == _expected_text(source, ".fixed"), "a second --fix changes nothing"
    assert '"applicability": "safe"' not in second.output, "every safe fix was applied"

    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "LD301", str(copy))
    for source in _sources(folder):
        expected = _expected_text(source, ".unsafe.fixed")
        if expected == source.read_bytes():
            expected = _expected_text(source, ".fixed")
        assert (copy / source.name).read_bytes() == expected, f"{source.name} with --unsafe-fixes"


@pytest.mark.parametrize("folder", [*_scenarios("ld302"), FIXTURES / "ld302"], ids=lambda p: p.name)
def test_ld302_converts_and_leaves_ld301_nothing_to_say(folder, tmp_path, lintdist):
    copy = _copy(folder, tmp_path)
    found = lintdist("check", "--no-cache", "--select", "LD301,LD302", "--output-format", "concise", str(copy))
    for source in _sources(folder):
        expectation = source.with_name(f"{source.stem}.ld302.expected")
        expected = expectation.read_text().split() if expectation.exists() else []
        reported = [
            line.split(f"{source.name}:", 1)[1].split(" [")[0].split()
            for line in found.output.splitlines()
            if f"/{source.name}:" in line
        ]
        assert [part for entry in reported for part in entry] == expected, source.name

    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "LD301,LD302", str(copy))
    for source in _sources(folder):
        assert (copy / source.name).read_bytes() == _expected_text(source, ".unsafe.fixed"), source.name
        _assert_well_formed(copy / source.name)
    after = lintdist("check", "--no-cache", "--select", "LD301,LD302", "--output-format", "json", str(copy))
    assert '"LD301"' not in after.output, "LD302's conversion must leave LD301 nothing to report"
    assert '"applicability"' not in after.output, "whatever LD302 still reports has no fix"


# -- accelerate itself reads the configs -----------------------------------------------------------


def _plugin_from_launch(argv: list[str], cwd: Path, monkeypatch, caplog, shell_env: dict[str, str] | None = None):
    """Run accelerate's launcher preparation on ``argv`` (the words after ``accelerate launch``), then build the
    plugin the script would build from that environment. Returns (plugin, FSDP2 deprecation warning logged)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    monkeypatch.chdir(cwd)
    for name in [n for n in os.environ if n.startswith(("FSDP_", "ACCELERATE_"))]:
        monkeypatch.delenv(name)
    if shell_env is not None:
        environment = shell_env
    else:
        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
        environment = prepare_multi_gpu_env(args)
    for name, value in environment.items():
        if name.startswith("FSDP_"):
            monkeypatch.setenv(name, value)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plugin = FullyShardedDataParallelPlugin()
    return plugin, "FSDP2" in caplog.text


def _launch_words(script: Path) -> list[str]:
    """The words after ``accelerate launch`` on the script's launch line."""
    words = shlex.split(script.read_text().replace("\\\n", " "), comments=True)
    start = next(i for i in range(len(words) - 1) if words[i : i + 2] == ["accelerate", "launch"])
    return words[start + 2 :]


@pytest.mark.parametrize(
    ("folder", "reshard"),
    [("yaml_v2_orig_params", False), ("yaml_v2_raises", False), ("launch_flags", True), ("launch_dashes", False)],
)
def test_accelerate_accepts_the_fixed_ld301_scenarios(folder, reshard, monkeypatch, caplog):
    scenario = FIXTURES / "ld301" / folder
    # The complete repair: with --unsafe-fixes where a scenario has one.
    fixed = next(scenario.glob("*.unsafe.fixed.*"), None) or next(scenario.glob("*.fixed.*"))
    argv = ["--config_file", str(fixed), "train.py"] if fixed.suffix == ".yaml" else _launch_words(fixed)
    plugin, warned = _plugin_from_launch(argv, scenario, monkeypatch, caplog)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is reshard and not warned


def test_the_original_ld301_scenarios_fail_or_warn(monkeypatch, caplog):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    scenario = FIXTURES / "ld301"
    args, _, _ = _validate_launch_command(
        launch_command_parser().parse_args(["--config_file", str(scenario / "yaml_v2_raises" / "config.yaml"), "t.py"])
    )
    with pytest.raises(ValueError, match="sync_module_states"):
        prepare_multi_gpu_env(args)
    argv = ["--config_file", str(scenario / "yaml_v2_orig_params" / "config.yaml"), "train.py"]
    plugin, warned = _plugin_from_launch(argv, scenario / "yaml_v2_orig_params", monkeypatch, caplog)
    assert warned and plugin.reshard_after_forward is True, "SHARD_GRAD_OP silently became a full reshard"
    with pytest.raises(ValueError, match="invalid truth value"):
        _plugin_from_launch(
            _launch_words(scenario / "launch_dashes" / "launch.sh"), scenario / "launch_dashes", monkeypatch, caplog
        )


def test_accelerate_accepts_the_fixed_environment(monkeypatch, caplog):
    from lintdist.sources import parse_launch

    fixed = FIXTURES / "ld301" / "env_torchrun" / "launch.unsafe.fixed.sh"
    launch = parse_launch(fixed.read_text())
    environment = {name: value for name, value, _ in [*launch.exports, *launch.commands[0].env]}
    plugin, warned = _plugin_from_launch([], fixed.parent, monkeypatch, caplog, shell_env=environment)
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is False and not warned


@pytest.mark.parametrize("folder", ["yaml_accelerate_template", "yaml_explicit_v1", "yaml_no_fsdp_config"])
def test_accelerate_accepts_ld302_conversions(folder, monkeypatch, caplog):
    scenario = FIXTURES / "ld302" / folder
    argv = ["--config_file", str(scenario / "config.unsafe.fixed.yaml"), "train.py"]
    plugin, warned = _plugin_from_launch(argv, scenario, monkeypatch, caplog)
    assert plugin.fsdp_version == 2 and not warned


# -- the project pass: a plugin built in code inherits the launch's version -------------------------

TRAIN = """\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(use_orig_params=True, state_dict_type="SHARDED_STATE_DICT")
accelerator = Accelerator(fsdp_plugin=plugin)
"""
TRAIN_FIXED = """\
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

plugin = FullyShardedDataParallelPlugin(state_dict_type="SHARDED_STATE_DICT")
accelerator = Accelerator(fsdp_plugin=plugin)
"""
V2_CONFIG = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\nnum_processes: 2\n"


def test_plugin_inherits_fsdp2_from_the_config_beside_it(tmp_path, lintdist):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "config.yaml").write_text(V2_CONFIG)
    result = lintdist("check", "--no-cache", "--select", "LD301", "--output-format", "concise", str(tmp_path))
    assert "train.py:4:41: LD301 [warning] `use_orig_params` is ignored under FSDP2" in result.output
    assert "FSDP2 comes from " in result.output and "config.yaml:3" in result.output
    lintdist("check", "--fix", "--no-cache", "--select", "LD301", str(tmp_path))
    assert (tmp_path / "train.py").read_text() == TRAIN_FIXED


@pytest.mark.parametrize(
    ("launch", "reported"),
    [
        ("accelerate launch --use_fsdp --fsdp_version 2 train.py\n", True),
        ("export FSDP_VERSION=2\ntorchrun --nproc_per_node 2 train.py\n", True),
        # the launcher re-exports FSDP_VERSION (1 by default) when it runs FSDP itself
        ("export FSDP_VERSION=2\naccelerate launch --use_fsdp train.py\n", False),
        # no FSDP on the launch line: the launcher exports no FSDP_* variable
        ("accelerate launch --fsdp_version 2 train.py\n", False),
        ("accelerate launch --use_fsdp train.py\n", False),
    ],
)
def test_plugin_version_follows_the_launch_line(launch, reported, tmp_path, lintdist):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "run.sh").write_text(launch)
    result = lintdist("check", "--no-cache", "--select", "LD301", "--output-format", "concise", str(tmp_path))
    assert ("train.py:4:41: LD301" in result.output) is reported, result.output


def test_ld302_converts_config_and_plugin_together_without_ld301(tmp_path, lintdist):
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "config.yaml").write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_use_orig_params: true\n")
    result = lintdist("check", "--no-cache", "--select", "LD301,LD302", "--output-format", "concise", str(tmp_path))
    assert result.output.count("LD302") == 2 and "LD301" not in result.output
    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "LD301,LD302", str(tmp_path))
    assert (tmp_path / "config.yaml").read_text() == "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n"
    assert "FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=" in (tmp_path / "train.py").read_text()
    after = lintdist("check", "--no-cache", "--select", "LD301,LD302", str(tmp_path))
    assert after.exit_code == 0, after.output


def test_suppressions_in_yaml_and_shell(tmp_path, lintdist):
    (tmp_path / "config.yaml").write_text(
        V2_CONFIG.replace("fsdp_version: 2\n", "fsdp_version: 2\n  fsdp_use_orig_params: true  # noqa: LD301\n")
    )
    (tmp_path / "run.sh").write_text(
        "export FSDP_VERSION=2\nexport FSDP_USE_ORIG_PARAMS=true  # lintdist: ignore[LD301]\ntorchrun train.py\n"
    )
    result = lintdist("check", "--no-cache", "--select", "LD301", str(tmp_path))
    assert result.exit_code == 0, result.output
