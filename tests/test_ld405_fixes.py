"""LD405's unsafe fix end to end: the collective leaves the main-process guard, the rank-0 work stays under it.

tests/test_fixtures.py runs ``--fix`` only, which leaves LD405's unsafe fix alone. Here each fixture with a
``*.unsafe.fixed.py`` is fixed with ``--unsafe-fixes`` and compared; the fixed file parses, keeps every comment,
has no LD405 finding left for the fixed block and a second pass changes nothing. Then fixed snippets run with a
fake accelerator: a non-main rank now reaches the collective (and only that), the main process runs the same
calls in the same order as before the fix.
"""

from __future__ import annotations

import io
import json
import shutil
import tokenize
from pathlib import Path

import libcst as cst
import pytest

from lintdist.engine import fix_text
from lintdist.rules import ld405_collective_in_rank_guard as ld405

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ld405"
FIXED = sorted(FIXTURES.rglob("*.unsafe.fixed.py"))
RULE = ld405.CollectiveInRankGuard


def _source(fixed: Path) -> Path:
    return fixed.with_name(fixed.name.replace(".unsafe.fixed.py", ".py"))


def _comments(text: str) -> list[str]:
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return sorted(t.string for t in tokens if t.type == tokenize.COMMENT)


def _lines(path: Path) -> list[int]:
    expected = path.with_name(path.name.replace(".py", ".expected"))
    if not expected.exists():
        return []
    return [int(line.split(":")[0]) for line in expected.read_text().splitlines() if line.endswith("LD405")]


@pytest.mark.parametrize("fixed", FIXED, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_unsafe_fix_gives_expected_output(fixed, tmp_path, lintdist):
    source = _source(fixed)
    folder = tmp_path / source.parent.name
    shutil.copytree(source.parent, folder, ignore=shutil.ignore_patterns("*.fixed.*"))
    target = folder / source.name
    lintdist("check", "--fix", "--no-cache", "--select", "LD405", str(target))
    assert target.read_bytes() == source.read_bytes(), "an unsafe fix must wait for --unsafe-fixes"
    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "LD405", str(target))
    assert target.read_text() == fixed.read_text()
    cst.parse_module(target.read_text())
    assert _comments(target.read_text()) == _comments(source.read_text()), "every comment is kept"
    after = lintdist("check", "--no-cache", "--select", "LD405", "--output-format", "json", str(target))
    assert [f["line"] for f in json.loads(after.output)] == _lines(fixed), "the fix removes the finding"
    lintdist("check", "--fix", "--unsafe-fixes", "--no-cache", "--select", "ALL", str(target))
    assert target.read_text() == fixed.read_text(), "a second pass changes nothing"


def _fix(code: str, tmp_path: Path) -> tuple[str, list]:
    path = tmp_path / "train.py"
    path.write_text(code)
    before = fix_text(code, path=path, display="train.py", kind="python", rules=[RULE], unsafe=False)
    outcome = fix_text(code, path=path, display="train.py", kind="python", rules=[RULE], unsafe=True)
    assert before.text == code
    return outcome.text, outcome.findings


class FakeAccelerator:
    """Records what a rank calls; ``save_state`` and friends are the collectives."""

    def __init__(self, main: bool, calls: list) -> None:
        self.is_main_process = main
        self.is_local_main_process = main
        self.process_index = 0 if main else 1
        self.distributed_type = "FSDP"
        self.calls = calls

    def save_state(self, path):
        self.calls.append(("save_state", path))

    def wait_for_everyone(self):
        self.calls.append(("wait_for_everyone",))

    def get_state_dict(self, model):
        self.calls.append(("get_state_dict", model))
        return {"weights": model}

    def unwrap_model(self, model):
        return model

    def save(self, obj, path):
        self.calls.append(("save", path))


class Args:
    output_dir = "out"
    checkpointing_steps = 2
    checkpoints_total_limit = 1
    export = True


CHECKPOINT = """\
import os

from accelerate import Accelerator


def step_end(accelerator, args, global_step, log):
    if accelerator.is_main_process:
        if global_step % args.checkpointing_steps == 0:
            # rotate first
            if args.checkpoints_total_limit is not None:
                log.append("rotate")
            save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
            accelerator.save_state(save_path)
            log.append(f"saved {save_path}")  # rank 0 only


if __name__ == "__main__":
    step_end(Accelerator(), parse_args(), 0, [])
"""

EXPORT = """\
from accelerate import Accelerator


def end_of_epoch(accelerator, model, args, log):
    if accelerator.is_local_main_process:
        accelerator.wait_for_everyone()
        if args.export:
            weights = accelerator.get_state_dict(model)
            accelerator.save(weights, f"{args.output_dir}/final.bin")
            log.append("exported")


if __name__ == "__main__":
    end_of_epoch(Accelerator(), build_model(), parse_args(), [])
"""


def _run(code: str, function: str, main: bool, *args) -> list:
    namespace: dict = {}
    exec(compile(code, "train.py", "exec"), namespace)  # noqa: S102 - the snippet is this test's own code
    calls: list = []
    namespace[function](FakeAccelerator(main, calls), *args, calls)
    return calls


BARRIER = ("wait_for_everyone",)


@pytest.mark.parametrize(
    ("code", "function", "args"), [(CHECKPOINT, "step_end", (Args(), 4)), (EXPORT, "end_of_epoch", ("m", Args()))]
)
def test_fixed_code_runs_the_collective_on_every_rank(code, function, args, tmp_path):
    fixed, findings = _fix(code, tmp_path)
    assert [f for f in findings if f.code == "LD405"] == []
    # the main process does what it did before, in the same order, but for the barrier the fix adds after the
    # rank-0 work that precedes a save (CHECKPOINT's rotation; EXPORT's collectives come first)
    main_before = _run(code, function, True, *args)
    main_after = _run(fixed, function, True, *args)
    added = BARRIER in main_after and BARRIER not in main_before
    assert added == (code is CHECKPOINT)
    if added:
        main_after.remove(BARRIER)
    assert main_after == main_before
    # another rank skipped the collective before the fix, and reaches it (and nothing of rank 0's work) after
    before = _run(code, function, False, *args)
    after = _run(fixed, function, False, *args)
    assert before == []
    collectives = {"save_state", "wait_for_everyone", "get_state_dict"}
    assert after and all(call[0] in collectives for call in after)
    assert _comments(fixed) == _comments(code)


def test_fixed_checkpoint_skips_steps_between_checkpoints(tmp_path):
    fixed, _ = _fix(CHECKPOINT, tmp_path)
    assert _run(fixed, "step_end", False, Args(), 3) == []
    assert _run(fixed, "step_end", False, Args(), 4) == [BARRIER, ("save_state", "out/checkpoint-4")]


def test_fixed_checkpoint_saves_after_the_rotation_on_every_rank(tmp_path):
    # the rotation stays on the main process, before a barrier that every rank reaches, so that no rank creates
    # the new checkpoint folder while the main process still lists the old ones
    fixed, _ = _fix(CHECKPOINT, tmp_path)
    assert _run(fixed, "step_end", True, Args(), 4) == [
        "rotate",
        BARRIER,
        ("save_state", "out/checkpoint-4"),
        "saved out/checkpoint-4",
    ]


NO_WORK_BEFORE = """\
from accelerate import Accelerator

accelerator = Accelerator()


def save(step, output_dir):
    if accelerator.is_main_process and step % 10 == 0:
        accelerator.save_state(output_dir)
        print("saved")


if __name__ == "__main__":
    save(10, "out")
"""

WORK_BEFORE_A_GATHER = """\
from accelerate import Accelerator

accelerator = Accelerator()


def report(step, loss):
    if accelerator.is_main_process:
        print("step", step)
        losses = accelerator.gather(loss)
        print(losses.mean())


if __name__ == "__main__":
    report(1, loss)
"""

BARRIER_ALREADY_THERE = """\
import shutil

from accelerate import Accelerator

accelerator = Accelerator()


def save(step, output_dir):
    if accelerator.is_main_process:
        shutil.rmtree(output_dir, ignore_errors=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(output_dir)


if __name__ == "__main__":
    save(10, "out")
"""


@pytest.mark.parametrize("code", [NO_WORK_BEFORE, WORK_BEFORE_A_GATHER, BARRIER_ALREADY_THERE])
def test_no_barrier_added_where_nothing_of_rank_0_can_race_the_collective(code, tmp_path):
    fixed, findings = _fix(code, tmp_path)
    assert fixed != code and [f for f in findings if f.code == "LD405"] == []
    assert fixed.count("wait_for_everyone()") == code.count("wait_for_everyone()")


ROTATION_IN_AN_EARLIER_BLOCK = """\
import shutil

from accelerate import Accelerator

acc = Accelerator()


def save(step, output_dir, fresh):
    if acc.is_main_process:
        if fresh:
            shutil.rmtree(output_dir, ignore_errors=True)
        if step % 10 == 0:
            acc.save_state(output_dir)


if __name__ == "__main__":
    save(10, "out", True)
"""


def test_barrier_spelled_as_the_script_names_its_accelerator(tmp_path):
    # the rotation sits in an earlier block than the save: the barrier goes just before the save, in its block
    fixed, findings = _fix(ROTATION_IN_AN_EARLIER_BLOCK, tmp_path)
    assert [f for f in findings if f.code == "LD405"] == []
    assert "    if step % 10 == 0:\n        acc.wait_for_everyone()\n        acc.save_state(output_dir)\n" in fixed


def test_one_finding_per_guarded_block_at_the_first_collective(tmp_path):
    path = tmp_path / "train.py"
    outcome = fix_text(EXPORT, path=path, display="train.py", kind="python", rules=[RULE], unsafe=False)
    assert [(f.span.line, f.message.split("`")[1]) for f in outcome.findings] == [
        (6, "accelerator.wait_for_everyone()")
    ]


RANK_CONDITION = """\
from accelerate import Accelerator

accelerator = Accelerator()


def save(step, output_dir):
    if accelerator.is_main_process:
        if step % 10 == 0 and accelerator.process_index < 8:
            accelerator.save_state(output_dir)
"""

SET_ON_MAIN = """\
from accelerate import Accelerator

accelerator = Accelerator()


def save(step, output_dir):
    if accelerator.is_main_process:
        target = make_dir(output_dir, step)
        accelerator.save_state(target)
"""


HELPER_AFTER_ROTATION = """\
import os
import shutil

from accelerate import Accelerator

accelerator = Accelerator()


def checkpoint(path):
    accelerator.save_state(path)


def train(rank, path):
    if rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        checkpoint(path)


if __name__ == "__main__":
    train(int(os.environ["RANK"]), "out")
"""


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (RANK_CONDITION, "reads the rank"),
        (SET_ON_MAIN, "calls `make_dir()`"),
        # the save needs a barrier after the rotation, and nothing at `checkpoint(path)` names the Accelerator
        (HELPER_AFTER_ROTATION, "no Accelerator is in sight at the helper's call"),
    ],
)
def test_no_fix_when_moving_code_could_change_behaviour(code, reason, tmp_path):
    fixed, findings = _fix(code, tmp_path)
    assert fixed == code
    (finding,) = [f for f in findings if f.code == "LD405"]
    assert finding.fix is None and reason in finding.message


GUARDED_CALLER = """

accelerator = Accelerator()
if accelerator.is_main_process:
    step_end(accelerator, parse_args(), 0, [])
"""


@pytest.mark.parametrize(
    ("caller", "reason"),
    [
        ("", "`step_end()` (train.py) is called from code lintdist cannot see"),
        (GUARDED_CALLER, "a rank test at train.py:19 keeps some ranks from this code"),
    ],
)
def test_no_fix_unless_every_rank_reaches_the_moved_collective(caller, reason, tmp_path):
    code = CHECKPOINT.split("\n\nif __name__")[0] + "\n" + caller
    fixed, findings = _fix(code, tmp_path)
    (finding,) = [f for f in findings if f.code == "LD405"]
    assert finding.fix is None and reason in finding.message, finding.message
    assert fixed == code


def test_save_state_message_follows_accelerate_source(tmp_path):
    path = tmp_path / "train.py"
    outcome = fix_text(CHECKPOINT, path=path, display="train.py", kind="python", rules=[RULE], unsafe=False)
    (finding,) = outcome.findings
    assert "DeepSpeed at every ZeRO stage" in finding.message
    assert "random_states_<i>.pkl" in finding.message
    assert "save_pretrained" not in finding.message  # a model export does not replace a training checkpoint


# Severity by evidence: an error where the project selects a backend under which the call hangs, info with what it
# costs under each backend where nothing does (accelerate 1.15: `save_state` is a collective under FSDP and
# DeepSpeed; `get_state_dict` and `save_model` gather under FSDP and ZeRO-3 and read local weights under DDP).
GUARDED_CALL = """\
from accelerate import Accelerator
{imports}

def main():
    accelerator = Accelerator({arguments})
    {before}
    if accelerator.is_main_process:
        {call}


if __name__ == "__main__":
    main()
"""
SAVE_STATE = "accelerator.save_state('out')"
GET_STATE_DICT = "accelerator.save(accelerator.get_state_dict(model), 'model.bin')"
SAVE_MODEL = "accelerator.save_model(model, 'exported')"
FSDP_TEST = "if accelerator.distributed_type == DistributedType.FSDP:\n        print('sharded')"


@pytest.mark.parametrize(
    ("call", "imports", "arguments", "before", "severity", "says"),
    [
        (SAVE_STATE, "", "", "", "info", "under DDP without automatic naming only the other ranks' RNG state"),
        (GET_STATE_DICT, "", "", "", "info", "under DDP and DeepSpeed ZeRO-1/2 it returns the local weights"),
        (SAVE_MODEL, "", "", "", "info", "under DDP and DeepSpeed ZeRO-1/2 it writes the same files"),
        (
            SAVE_STATE,
            "from accelerate.utils import DistributedType",
            "",
            FSDP_TEST,
            "warning",
            "the script tests `DistributedType.FSDP` at line 6, so it is meant to run under FSDP",
        ),
        (SAVE_STATE, "", "fsdp_plugin=plugin", "", "error", "the other ranks never join and the job hangs"),
        (GET_STATE_DICT, "", "deepspeed_plugin=plugin", "", "error", "the other ranks never join and the job hangs"),
        (
            SAVE_STATE,
            "from accelerate.utils import ProjectConfiguration",
            "project_config=ProjectConfiguration(automatic_checkpoint_naming=True)",
            "",
            "error",
            "the other ranks never join and the job hangs",
        ),
    ],
)
def test_sharded_checkpoint_call_severity_follows_the_evidence(
    call, imports, arguments, before, severity, says, tmp_path
):
    code = GUARDED_CALL.format(call=call, imports=imports, arguments=arguments, before=before)
    path = tmp_path / "train.py"
    (finding,) = fix_text(code, path=path, display="train.py", kind="python", rules=[RULE], unsafe=False).findings
    assert finding.severity.value == severity
    assert says in finding.message, finding.message
    unselected = "nothing in this project selects FSDP or DeepSpeed"
    assert (unselected in finding.message) == (severity == "info")
    assert ("the job hangs" in finding.message) == (severity == "error")


def test_helper_in_another_module_is_info_unless_the_project_selects_a_sharded_backend(tmp_path, lintdist):
    (tmp_path / "ckpt.py").write_text("def save_checkpoint(accelerator, folder):\n    accelerator.save_state(folder)\n")
    train = tmp_path / "train.py"
    call = "save_checkpoint(accelerator, 'out')"
    code = GUARDED_CALL.format(call=call, imports="from ckpt import save_checkpoint", arguments="{}", before="")
    for arguments, severity in (("", "info"), ("fsdp_plugin=plugin", "error")):
        train.write_text(code.replace("{}", arguments))
        result = lintdist("check", "--no-cache", "--select", "LD405", "--output-format", "json", str(train))
        (finding,) = json.loads(result.output)
        assert finding["severity"] == severity
        assert "reaches `accelerator.save_state()` (ckpt.py:2)" in finding["message"]
