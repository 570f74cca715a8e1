"""Engine behaviour no shipped rule exercises yet, proven with small rules defined here:
unsafe fixes, fixes that would break the file, text-edit fixes and suppressions in YAML and
shell files, launch settings reaching a script, and a crashing rule."""

from __future__ import annotations

import re

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lintdist.config
import lintdist.registry
import lintdist.report
from lintdist.model import Applicability, Fix, Severity, Span, TextEdit
from lintdist.rule import Pattern, Rule, words


class RenameFoo(Rule):
    code, name, severity, fix_kind, triggers = "LD901", "rename-foo", Severity.WARNING, "unsafe", ("foo",)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "foo":
            fix = Fix(Applicability.UNSAFE, "Call `bar`", replacements=((node.func, cst.Name("bar")),))
            self.report(node, "`foo` is deprecated", fix=fix)


class BreakBaz(Rule):
    code, name, severity, fix_kind, triggers = "LD902", "break-baz", Severity.ERROR, "safe", ("baz",)

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name) and node.func.value == "baz":
            self.report(
                node, "baz", fix=Fix(Applicability.SAFE, "Rename", replacements=((node.func, cst.Name("for")),))
            )


class OrigParamsKey(Rule):
    code, name, severity, fix_kind = "LD903", "orig-params-key", Severity.WARNING, "safe"
    kinds, triggers = frozenset({"config", "launch"}), ("use_orig_params",)

    def finish(self) -> None:
        text = self.context.text
        start = text.find("fsdp_use_orig_params")
        if start < 0:
            return
        if self.context.kind == "config":
            line_start, line_end = text.rfind("\n", 0, start) + 1, text.index("\n", start) + 1
            edit = TextEdit(line_start, line_end, "")
        else:
            end = text.index(" ", text.index(" ", start) + 1) + 1
            edit = TextEdit(start - 2, end, "")
        line = text.count("\n", 0, start) + 1
        fix = Fix(Applicability.SAFE, "Remove the option", edits=(edit,))
        self.report(None, "ignored under FSDP2", fix=fix, span=Span(line, 1, line, 2))


class ShowSettings(Rule):
    code, name, severity, triggers = "LD904", "show-settings", Severity.INFO, ("LocalSGD",)

    def finish(self) -> None:
        settings = self.context.settings
        if settings is not None and settings.distributed_type is not None:
            backend = settings.distributed_type
            self.report(self.context.module, f"backend {backend.value} from {backend.path}:{backend.line}")


class Crash(Rule):
    code, name, severity, triggers = "LD905", "crash", Severity.ERROR, ("crash_me",)

    def finish(self) -> None:
        raise ZeroDivisionError("boom")


@pytest.fixture(autouse=True)
def synthetic_rules(monkeypatch):
    rules = (*lintdist.registry.all_rules(), RenameFoo, BreakBaz, OrigParamsKey, ShowSettings, Crash)
    for module in (lintdist.registry, lintdist.report):
        monkeypatch.setattr(module, "all_rules", lambda: rules)
    infos = tuple(lintdist.registry.RuleInfo(**entry) for entry in lintdist.registry.manifest_entries(rules))
    for module in (lintdist.registry, lintdist.config):
        monkeypatch.setattr(module, "manifest", lambda: infos)


def test_unsafe_fixes_need_opting_in(tmp_path, lintdist):
    path = tmp_path / "t.py"
    path.write_text("import torch\nfoo(1)  # keep me\n")
    result = lintdist("check", "--fix", "--no-cache", str(path))
    assert result.exit_code == 1 and path.read_text() == "import torch\nfoo(1)  # keep me\n"
    assert "1 more fixable with --unsafe-fixes." in result.output
    assert lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", str(path)).exit_code == 0
    assert path.read_text() == "import torch\nbar(1)  # keep me\n"
    path.write_text("import torch\nfoo(1)\n")
    (tmp_path / "lintdist.toml").write_text("unsafe-fixes = true\n")
    assert lintdist("check", "--fix", "--no-cache", str(path)).exit_code == 0
    assert path.read_text() == "import torch\nbar(1)\n"


def test_a_fix_that_breaks_the_file_is_dropped_and_reported(tmp_path, lintdist):
    path = tmp_path / "t.py"
    path.write_text("import torch\nbaz(1)\n")
    result = lintdist("check", "--fix", "--no-cache", str(path))
    assert result.exit_code == 1
    assert path.read_text() == "import torch\nbaz(1)\n"
    assert "LD902 fix at line 2 dropped: its result does not parse" in result.output


def test_yaml_fix_keeps_comments_and_suppression_works_in_yaml_and_shell(tmp_path, lintdist):
    config = tmp_path / "fsdp.yaml"
    config.write_text(
        "# FSDP2 run\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2  # new API\n  fsdp_use_orig_params: true\n  fsdp_offload_params: false\n"
    )
    launch = tmp_path / "run.sh"
    launch.write_text(
        "accelerate launch --fsdp_use_orig_params true --num_processes 2 train.py  # lintdist: ignore[LD903]\n"
    )
    result = lintdist("check", "--fix", "--no-cache", "--ignore", "LD309", str(tmp_path))  # no wrap policy here
    assert (
        config.read_text()
        == "# FSDP2 run\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2  # new API\n  fsdp_offload_params: false\n"
    )
    assert "LD903" not in result.output and result.exit_code == 0

    config.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_use_orig_params: true  # noqa: LD903\n")
    launch.write_text(
        "torchrun \\\n  --nproc_per_node 2 train.py\naccelerate launch --fsdp_use_orig_params true --num_processes 2 train.py\n"
    )
    result = lintdist("check", "--no-cache", "--output-format", "concise", str(tmp_path))
    assert result.output.count("LD903") == 1 and "run.sh:3:1: LD903" in result.output
    lintdist("check", "--fix", "--no-cache", str(tmp_path))
    assert (
        launch.read_text()
        == "torchrun \\\n  --nproc_per_node 2 train.py\naccelerate launch --num_processes 2 train.py\n"
    )


def test_launch_settings_reach_the_script_through_worker_processes(tmp_path, lintdist):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "ds.yaml").write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\n")
    (tmp_path / "run.sh").write_text("accelerate launch --config_file configs/ds.yaml train.py --lr 1e-4\n")
    (tmp_path / "train.py").write_text("from accelerate.local_sgd import LocalSGD\n")
    for index in range(10):  # enough files for the worker pool
        (tmp_path / f"other_{index}.py").write_text("import torch\n")
    result = lintdist(
        "check", "--no-cache", "--jobs", "2", "--select", "LD904", "--output-format", "concise", str(tmp_path)
    )
    assert f"train.py:1:1: LD904 [info] backend DEEPSPEED from {tmp_path / 'configs' / 'ds.yaml'}:2" in result.output

    (tmp_path / "run.sh").write_text("accelerate launch --config_file configs/ds.yaml --use_fsdp train.py\n")
    result = lintdist("check", "--no-cache", "--select", "LD904", "--output-format", "concise", str(tmp_path))
    assert f"backend FSDP from {tmp_path / 'run.sh'}:1" in result.output, "a launch flag wins over the YAML"


def test_accelerate_config_setting_and_a_single_config_beside_the_script(tmp_path, lintdist):
    (tmp_path / "train.py").write_text("from accelerate.local_sgd import LocalSGD\n")
    (tmp_path / "xla.yaml").write_text("distributed_type: XLA\n")
    result = lintdist("check", "--no-cache", "--select", "LD904", str(tmp_path / "train.py"))
    assert "backend XLA" in result.output, "the single accelerate config beside the script is assumed"
    (tmp_path / "ds.yaml").write_text("distributed_type: DEEPSPEED\n")
    assert "backend" not in lintdist("check", "--no-cache", "--select", "LD904", str(tmp_path)).output, (
        "two configs: ambiguous"
    )
    (tmp_path / "lintdist.toml").write_text('accelerate-config = ["ds.yaml"]\n')
    assert "backend DEEPSPEED" in lintdist("check", "--no-cache", "--select", "LD904", str(tmp_path)).output


def test_a_lone_config_beside_several_scripts_is_not_theirs(tmp_path, lintdist):
    """peft's seq2seq folder: a DeepSpeed config beside a DeepSpeed script and an FSDP script. The config is
    linked only to a folder's one entry script (helpers it imports do not count), or through a launch line."""
    (tmp_path / "ds.yaml").write_text("distributed_type: DEEPSPEED\n")
    (tmp_path / "train.py").write_text("import helpers\nfrom accelerate.local_sgd import LocalSGD\n")
    (tmp_path / "helpers.py").write_text("import torch\n")
    result = lintdist("check", "--no-cache", "--select", "LD904", str(tmp_path / "train.py"))
    assert "backend DEEPSPEED" in result.output, "one entry script and its helper: the config is the script's"
    (tmp_path / "fsdp_train.py").write_text("from accelerate.local_sgd import LocalSGD\n")
    result = lintdist("check", "--no-cache", "--select", "LD904", "--output-format", "concise", str(tmp_path))
    assert "backend" not in result.output, "two scripts beside one config: it may be meant for either"
    (tmp_path / "run.sh").write_text("accelerate launch --config_file ds.yaml train.py\n")
    result = lintdist("check", "--no-cache", "--select", "LD904", "--output-format", "concise", str(tmp_path))
    assert "train.py:1:1: LD904 [info] backend DEEPSPEED" in result.output and "fsdp_train.py" not in result.output


def test_a_crashing_rule_is_named_and_exits_2(tmp_path, lintdist):
    (tmp_path / "a.py").write_text("import torch\ncrash_me()\n")
    (tmp_path / "b.py").write_text("import torch\nfoo()\n")
    result = lintdist("check", "--no-cache", str(tmp_path))
    assert result.exit_code == 2
    assert "LD905 crashed on" in result.output and "ZeroDivisionError: boom" in result.output
    assert "LD901" in result.output, "the other files are still checked"


def test_a_rule_runs_only_where_every_trigger_group_matches():
    class Guarded(Rule):
        """Test rule: needs one word of each group."""

        code, name, severity, triggers = "LD906", "guarded", Severity.INFO, ("barrier",)
        also_triggers = (("rank", "is_main_process"),)

    assert Guarded.wanted("if rank == 0:\n    dist.barrier()\n")
    assert not Guarded.wanted("dist.barrier()\n")
    assert not Guarded.wanted("if rank == 0:\n    print(rank)\n")


def test_a_backwards_pattern_reads_the_text_from_its_end_and_survives_the_manifest():
    # `break`, then the `if` line above it naming `loss`: written for the reversed text
    pattern = Pattern(("break",), re.compile(r"kaerb[ \t]*\n[^\n]*:[^\n]*ssol[^\n]* fi"), backwards=True)

    class Backwards(Rule):
        """Test rule: a backwards pattern."""

        code, name, severity, triggers = "LD907", "backwards", Severity.INFO, (pattern,)

    text = "for batch in loader:\n    if loss.item() < 0.1:\n        break\n"
    assert Backwards.wanted(text)
    assert not Backwards.wanted(text.replace("loss", "step"))
    info = lintdist.registry.RuleInfo(**lintdist.registry.manifest_entries([Backwards])[0])
    assert info.wanted(text, "python") and not info.wanted(text.replace("loss", "step"), "python")
    forwards = Pattern(("break",), pattern.regex)  # the same regex read forwards finds nothing
    assert not forwards.search(text)


def test_a_launch_file_of_plain_python_lines_is_read_only_for_rules_that_ask_for_them():
    from lintdist.engine import _worth_parsing

    class PlainLines(Rule):
        code, name, severity, kinds = "LD990", "plain-lines", Severity.WARNING, frozenset({"launch"})
        plain_python_launches = True

    class LauncherLines(Rule):
        code, name, severity, kinds = "LD991", "launcher-lines", Severity.WARNING, frozenset({"launch"})

    assert _worth_parsing("python train.py --lr 1\n", "launch", [PlainLines])
    assert not _worth_parsing("python train.py --lr 1\n", "launch", [LauncherLines])
    assert not _worth_parsing("echo done\n", "launch", [PlainLines])
    assert _worth_parsing("torchrun --nproc_per_node 2 train.py\n", "launch", [LauncherLines])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["rank", "local_rank", "get_rank", "is_main_process", "process_index", "gpu_id"]),
        min_size=1,
        max_size=6,
    ),
    st.lists(
        st.sampled_from(["rank", "local_", "get_", "process", "_index", "ranking", "x.rank", " ", "\n", "(", "main"]),
        max_size=12,
    ),
)
def test_words_grouped_under_stems_match_exactly_where_a_whole_name_occurs(names, pieces):
    text = "".join(pieces)
    found = words(*names).search(text)
    assert found == any(re.search(rf"(?<!\w){re.escape(n)}(?!\w)", text) for n in names)


def test_words_share_stems_of_four_characters_or_more():
    stems = dict(words("local_rank", "get_rank", "rank", "barrier", "monitored_barrier", "gpu_id")._stems)
    assert stems["rank"] == ("get_rank", "local_rank", "rank") and stems["barrier"] == ("barrier", "monitored_barrier")
    assert stems["gpu_id"] == ("gpu_id",), "a name that shares no stem is scanned for on its own"


def test_a_trigger_two_rules_share_is_searched_once_per_text():
    entries = [
        {"code": code, "default_enabled": True, "module": "m", "triggers": (("words", ("local_rank", "rank")),)}
        for code in ("LD991", "LD992")
    ]
    first, second = (lintdist.registry.RuleInfo(**entry) for entry in entries)
    seen: dict = {}
    assert first.wanted("if local_rank == 0:\n", "python", seen)
    shared = lintdist.registry._trigger(("words", ("local_rank", "rank")))
    assert seen[id(shared)] is True
    seen[id(shared)] = False  # the remembered answer is the one used
    assert not second.wanted("if local_rank == 0:\n", "python", seen)


def test_backward_and_device_map_triggers_skip_definitions_docstring_sessions_and_lone_keywords():
    from lintdist.registry import rule_by_code

    token_loss, device_map = rule_by_code("LD102"), rule_by_code("LD314")
    labels = "labels[labels == pad] = -100\n"
    assert token_loss.wanted(labels + "loss.backward()\n")
    assert token_loss.wanted(labels + "from torch.autograd import backward\nbackward(loss)\n")
    assert not token_loss.wanted(labels + "class F(Function):\n    def backward(ctx, grad):\n        return grad\n")
    assert not token_loss.wanted(labels + '"""\n    >>> loss.backward()\n"""\n# loss.backward()\n')
    assert not token_loss.wanted(labels + "num_training_steps = 10\n")
    assert token_loss.wanted(labels + "class T(Trainer):\n    def compute_loss(self, model, inputs):\n        pass\n")
    auto = 'model = AutoModel.from_pretrained("m", device_map="auto")\n'
    assert device_map.wanted(auto)
    assert not device_map.wanted('def load(device_map="auto"):\n    return device_map\n')


def test_triggers_are_searched_after_the_opening_comments_only():
    from lintdist.conventions import trigger_text
    from lintdist.registry import rule_by_code

    header = "#!/usr/bin/env python\n# Licensed under the Apache License: distributed on an AS IS basis.\n\n"
    assert trigger_text(header + "import os\n# distributed later\n") == "import os\n# distributed later\n"
    guarded = "if rank == 0:\n    dist.barrier()\n"
    collective_in_guard = rule_by_code("LD405")
    assert not collective_in_guard.wanted(trigger_text(header + "if rank == 0:\n    x.barrier()\n"))
    assert collective_in_guard.wanted(trigger_text(header + guarded)), "the implied import still counts"
