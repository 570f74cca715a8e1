"""Fast tests of the watcher's parts: the hang decision, the first divergence, the source reading, the checks."""

from __future__ import annotations

import functools
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from lintdist.runtime.watch import checks, hang, source
from lintdist.runtime.watch.channel import Channel
from lintdist.runtime.watch.probe import Collective, Site

NOW = 1000.0


def _status(rank: int, *, active=(), stuck=None, site=None, exit=None, progress=None, site_since=NOW, t=NOW):
    return {
        "rank": rank,
        "t": t,
        "progress": progress or {},
        "stuck_since": stuck,
        "active": [Collective("0", seq, op, [], Site.from_list(site), False).as_dict() for seq, op in active],
        "site": site,
        "site_since": site_since,
        "exit": exit,
    }


def test_ranks_in_the_same_collective_agree() -> None:
    statuses = {r: _status(r, active=[(7, "gloo:all_reduce")], stuck=NOW - 30) for r in (0, 1)}
    assert hang.diagnose(statuses, NOW) is None


def test_different_ops_at_one_sequence_number_diverge_after_the_confirmation_time() -> None:
    statuses = {
        0: _status(0, active=[(7, "gloo:barrier")], stuck=NOW - 2),
        1: _status(1, active=[(7, "gloo:all_reduce")], stuck=NOW - 2),
    }
    assert hang.diagnose(statuses, NOW) == hang.Divergence("op", 0, 1, "0", 7)
    statuses[1]["stuck_since"] = NOW - 0.5  # rank 1 only just got there: not yet
    assert hang.diagnose(statuses, NOW) is None


def test_a_rank_that_exited_while_another_waits_diverges_but_a_crash_is_left_to_the_launcher() -> None:
    waiting = _status(0, active=[(9, "gloo:all_reduce")], stuck=NOW - 2)
    assert hang.diagnose({0: waiting, 1: _status(1, exit={"site": None, "error": None})}, NOW).kind == "exited"
    crashed = _status(1, exit={"site": None, "error": "ValueError: x", "crashed": True})
    assert hang.diagnose({0: waiting, 1: crashed}, NOW) is None
    stale = _status(1, t=NOW - 60)
    assert hang.diagnose({0: waiting, 1: stale}, NOW).kind == "exited"


def test_a_rank_still_computing_is_slow_not_diverged_until_it_stalls() -> None:
    waiting = _status(0, active=[(9, "gloo:barrier")], stuck=NOW - 100)
    busy = _status(1, progress={"0": [8, 8]}, site=["train.py", 40, "<module>"], site_since=NOW - 100)
    assert hang.diagnose({0: waiting, 1: busy}, NOW) is None
    busy["site_since"] = NOW - 700
    assert hang.diagnose({0: waiting, 1: busy}, NOW).kind == "stalled"


def test_without_a_recorder_the_blocking_functions_are_compared_after_a_while() -> None:
    statuses = {
        0: _status(0, active=[(-1, "barrier")], stuck=NOW - 3),
        1: _status(1, active=[(-1, "all_reduce")], stuck=NOW - 3),
    }
    assert hang.diagnose(statuses, NOW) is None
    statuses[0]["stuck_since"] = statuses[1]["stuck_since"] = NOW - 11
    assert hang.diagnose(statuses, NOW).kind == "different"


def test_without_a_recorder_the_blocking_collective_is_read_from_the_stack() -> None:
    from lintdist.runtime.watch import probe

    namespace: dict = {"probe": probe, "sys": sys}
    torch_file = str(Path("/site/torch/distributed/distributed_c10d.py"))
    code = "def barrier():\n    return probe.blocking_function(sys._getframe())\n"
    # Functions whose frames claim to live in torch.distributed's file, and in a user's utils.py.
    exec(compile(code, torch_file, "exec"), namespace)  # noqa: S102 - our own constant source
    exec(compile(code.replace("barrier", "all_reduce"), "/home/me/utils.py", "exec"), namespace)  # noqa: S102
    assert namespace["barrier"]() == "barrier"
    assert namespace["all_reduce"]() is None  # the user's own function of that name


def test_the_leader_is_the_lowest_rank_still_running() -> None:
    from lintdist.runtime.watch.watcher import Options, Watcher

    watcher = Watcher(Options())
    statuses = {0: _status(0), 1: _status(1), 2: _status(2)}
    assert watcher._leader(statuses, NOW) == 0
    statuses[0]["exit"] = {"site": None, "error": None}
    assert watcher._leader(statuses, NOW) == 1
    statuses[1]["t"] = NOW - 60  # gone silent
    assert watcher._leader(statuses, NOW) == 2


def _history(*entries):
    return [Collective("0", seq, op, [], Site("t.py", line), True) for seq, op, line in entries]


def test_first_divergence_is_the_extra_collective_not_the_final_mismatch() -> None:
    # Rank 0 makes an extra all_reduce at line 33 (collective 3); from then on it is one ahead.
    rank0 = _history((1, "ar", 39), (2, "ar", 39), (3, "ar", 33), (4, "ar", 39), (5, "ar", 39))
    rank1 = _history((1, "ar", 39), (2, "ar", 39), (3, "ar", 39), (4, "ar", 39), (5, "barrier", 43))
    assert hang.first_divergence({0: rank0, 1: rank1}) == ("0", 3)


def test_two_branches_of_a_rank_test_calling_one_collective_match() -> None:
    rank0 = _history((1, "ar", 39), (2, "broadcast", 36), (3, "ar", 39), (4, "broadcast", 36))
    rank1 = _history((1, "ar", 39), (2, "broadcast", 38), (3, "ar", 39), (4, "broadcast", 38))
    assert hang.first_divergence({0: rank0, 1: rank1}) is None


SCRIPT = """\
import torch.distributed as dist

for step in range(args.steps):
    loss = step * 2
    dist.all_reduce(loss)
    if rank == 0:
        dist.barrier()
    else:
        pass
    if loss < best:
        break
dist.barrier()
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return path


def test_rank_guard_reads_the_if_around_the_line(script: Path) -> None:
    guard = source.rank_guard(Site(str(script), 7))
    assert guard == source.Guard(6, "rank == 0", "if")
    assert source.rank_guard(Site(str(script), 5)) is None
    assert source.rank_guard(Site(str(script), 9)) == source.Guard(6, "rank == 0", "else")


def test_enclosing_loop_and_its_local_exits(script: Path) -> None:
    loop = source.enclosing_loop(Site(str(script), 5))
    assert (loop.line, loop.end_line) == (3, 11)
    assert loop.contains(Site(str(script), 11)) and not loop.contains(Site(str(script), 12))
    assert [(e.line, e.kind, e.condition) for e in source.local_exits(loop)] == [(11, "break", "loss < best")]
    assert source.enclosing_loop(Site(str(script), 12)) is None


def test_range_bound_reads_plain_names_only(script: Path) -> None:
    class Args:
        steps = 7

    assert source.range_bound(Site(str(script), 5), {"args": Args()}, {}) == 7
    assert source.range_bound(Site(str(script), 5), {}, {}) is None
    assert source.range_bound(Site(str(script), 12), {"args": Args()}, {}) is None


def test_explain_names_the_guarded_rank_as_ld405(script: Path) -> None:
    site = functools.partial(lambda line: [str(script), line, "<module>"])
    statuses = {
        0: _status(0, active=[(5, "gloo:barrier")], stuck=NOW - 2, site=site(7)),
        1: _status(1, active=[(5, "gloo:all_reduce")], stuck=NOW - 2, site=site(5)),
    }
    divergence = hang.diagnose(statuses, NOW)
    report = hang.explain(divergence, statuses, {}, NOW)
    assert report.code == "LD405"
    data = report.as_dict()
    assert (data["file"], data["line"], data["seq"], data["op"]) == (str(script), 7, 5, "gloo:barrier")
    assert data["ranks"][0]["rank_guard"] == {"line": 6, "test": "rank == 0", "branch": "if"}
    assert "rank 0" in report.text() and "under `if rank == 0:`" in report.text()


@pytest.mark.parametrize("leaver", [0, 1])
def test_explain_names_a_rank_that_left_the_loop_as_ld402(script: Path, leaver: int) -> None:
    stayer = 1 - leaver
    statuses = {
        stayer: _status(stayer, active=[(5, "gloo:all_reduce")], stuck=NOW - 2, site=[str(script), 5, "<module>"]),
        leaver: _status(leaver, active=[(5, "gloo:barrier")], stuck=NOW - 2, site=[str(script), 12, "<module>"]),
    }
    report = hang.explain(hang.diagnose(statuses, NOW), statuses, {}, NOW)
    assert report.code == "LD402", report.message
    assert f"rank {leaver} left the loop" in report.message and "`break` at line 11" in report.message


def test_sampler_iterated_again_with_the_same_epoch_is_reported_once() -> None:
    found = checks.Checks(lambda: 2)
    dataset = TensorDataset(torch.arange(8.0))
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True)
    sampler._lintdist_site = Site("train.py", 3)
    iterate = functools.partial(found._sampler_iter, lambda s: iter(range(4)))
    for _ in range(3):
        list(iterate(sampler))
    assert [item[2]["code"] for item in found.outbox] == ["LD201"]
    fine = checks.Checks(lambda: 2)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        list(functools.partial(fine._sampler_iter, lambda s: iter(range(4)))(sampler))
    assert not fine.outbox


def test_token_window_weight_error_and_the_rescaled_recipe() -> None:
    def window(counts, scale):
        found = checks.Checks(lambda: 1)
        for count in counts:
            mean = torch.tensor(2.0)
            found._window_losses.append([torch.tensor(count), mean, (mean * scale(count)).reshape(-1)[0], None])
        found._close_token_window()
        return list(found.outbox)

    per_batch_mean = window([27, 12, 10, 17], lambda count: 0.25)
    ((_, _, finding),) = per_batch_mean
    expected = max(abs(66 / (4 * count) - 1) for count in (27, 12, 10, 17))
    assert finding["code"] == "LD102" and finding["evidence"]["worst_weight_error"] == round(expected, 4)
    assert window([27, 12, 10, 17], lambda count: count / 66) == []  # scaled by each micro-batch's share
    assert window([16, 16, 16, 16], lambda count: 0.25) == []  # equal counts: the mean is exact


def test_schedule_lengths_are_read_where_schedulers_keep_them() -> None:
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    linear = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=24)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=30)
    lambda_with_keywords = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lambda step, num_training_steps: 1.0, num_training_steps=40)
    )
    step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    assert [checks._schedule_length(s) for s in (linear, cosine, lambda_with_keywords, step)] == [24, 30, 40, None]


def test_loader_counts_and_the_double_shard() -> None:
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=4)
    assert checks._loader_counts(loader, [torch.zeros(4)]) == (64, 64, 4)
    assert checks._shares_twice((16, 64, 4), 2) and not checks._shares_twice((32, 64, 4), 2)
    assert checks._shares_twice((8, 64, 4), 2) is False


def test_batch_and_gradient_comparisons() -> None:
    same = {r: {"hash": "h", "counts": (64, 64, 4), "site": ["t.py", 5, "<module>"]} for r in (0, 1)}
    found = checks.compare_batches("t.py:5", same)
    assert (found["code"], found["file"], found["line"]) == ("LD203", "t.py", 5)
    assert checks.compare_batches("t.py:5", {0: same[0], 1: {**same[1], "hash": "other"}}) is None
    value = {"sum": 1.0, "abs": 2.0, "site": ["t.py", 9, ""], "backwards": 4, "no_sync": 4, "no_sync_site": "t.py:7"}
    differ = {0: value, 1: {**value, "sum": 1.5}}
    found = checks.compare_gradients("1", differ)
    assert (found["code"], found["line"]) == ("LD110", 9) and "t.py:7" in found["message"]
    assert checks.compare_gradients("1", {0: value, 1: {**differ[1], "no_sync": 0}})["code"] == "LD103"
    assert checks.compare_gradients("1", {0: value, 1: value}) is None


def test_channel_round_trips_and_claims_findings_once() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    first, second = Channel(store, 0, 2), Channel(store, 1, 2)
    first.post_status({"rank": 0})
    assert first.statuses() == {0: {"rank": 0}}
    second.post_status({"rank": 1})
    assert first.statuses() == {0: {"rank": 0}, 1: {"rank": 1}}
    first.post_finding("LD201:x", {"code": "LD201"})
    second.post_finding("LD201:x", {"code": "LD201"})
    assert first.new_findings() == [{"code": "LD201"}] and first.new_findings() == []
    first.post_value("grad", "1", {"sum": 1})
    assert first.values("grad", "1") is None
    second.post_value("grad", "1", {"sum": 1})
    assert first.values("grad", "1") == {0: {"sum": 1}, 1: {"sum": 1}}
    assert first.post_report({"code": "LD405"}) and not second.post_report({"code": "LD402"})
    assert second.report() == {"code": "LD405"}


def _watch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # In a child process: the watcher patches torch for the life of its process.
    command = [sys.executable, "-m", "lintdist.runtime.watch", *args]
    return subprocess.run(command, check=False, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_main_runs_a_script_without_a_process_group_and_keeps_its_exit(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text('import sys\nopen("ran.txt", "w").write(" ".join(sys.argv[1:]) + " " + __name__)\n')
    assert _watch(str(script), "--lr", "0.1", cwd=tmp_path).returncode == 0
    assert (tmp_path / "ran.txt").read_text() == "--lr 0.1 __main__"
    (tmp_path / "failing.py").write_text("raise SystemExit(4)\n")
    assert _watch("failing.py", cwd=tmp_path).returncode == 4
    (tmp_path / "raising.py").write_text("raise ValueError('bad input')\n")
    raised = _watch("raising.py", cwd=tmp_path)
    assert raised.returncode == 1 and "ValueError: bad input" in raised.stderr


def test_main_passes_the_script_its_own_options_and_runs_modules(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text('import sys\nprint("ARGV", sys.argv[1:], __name__)\n')
    result = _watch("--report", "r.json", "-m", "pkg.train", "--lr", "3", "--report", "mine", cwd=tmp_path)
    assert result.returncode == 0 and "ARGV ['--lr', '3', '--report', 'mine'] __main__" in result.stdout
    result = _watch("--no-exit", "pkg/train.py", "-m", "x", cwd=tmp_path)
    assert result.returncode == 0 and "ARGV ['-m', 'x'] __main__" in result.stdout


def test_main_without_a_script_is_a_usage_error(tmp_path: Path) -> None:
    result = _watch(cwd=tmp_path)
    assert result.returncode == 2 and "give the training script" in result.stderr


def test_the_watcher_imports_torch_only() -> None:
    code = (
        "import sys, lintdist.runtime.watch; "
        "bad = [n for n in sys.modules if n.startswith(('lintdist.rules', 'lintdist.cli', 'libcst', 'click', 'accelerate'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
