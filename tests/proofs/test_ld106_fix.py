"""LD106 proven by running it: after --fix the first optimizer step sees the mean gradient of the accumulation
window; before, `loss.backward()` skips accelerate's division and the gradient is the window's sum.

A second script divides the loss by the steps by hand before `loss.backward()`: its gradient is already right, and
the fix must keep it right, so it deletes the division while switching to `accelerator.backward` (which divides).
Switching the call alone would divide twice: the test runs that variant too and shows it is off.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from tests.proofs.harness import SCRIPTS, fixed_copy, run_ranks

pytestmark = pytest.mark.slow

TOLERANCE = 1e-10


def window_mean_gradient(script: str, ranks: list[dict]) -> list[torch.Tensor]:
    """One process, float64: the gradient of the mean of the micro-batch losses that every rank trained on
    before its first optimizer step (the mean over the accumulation window and the ranks)."""
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), SCRIPTS / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build_model()
    losses = [
        F.mse_loss(
            model.linear(torch.tensor(batch["x"], dtype=torch.float64)), torch.tensor(batch["y"], dtype=torch.float64)
        )
        for report in ranks
        for batch in report["seen"]
    ]
    (sum(losses) / len(losses)).backward()
    return [p.grad for p in model.parameters()]


def max_error(report: dict, reference: list[torch.Tensor]) -> float:
    return max(
        (torch.tensor(g, dtype=torch.float64) - r).abs().max().item() for g, r in zip(report["grads"], reference)
    )


def relative_scale(report: dict, reference: list[torch.Tensor]) -> float:
    """The factor the gradient is off by: ||g|| / ||reference||."""
    grads = torch.cat([torch.tensor(g, dtype=torch.float64).flatten() for g in report["grads"]])
    return (grads.norm() / torch.cat([r.flatten() for r in reference]).norm()).item()


def test_tensor_backward_sums_the_window_and_the_fix_averages_it(tmp_path):
    script = "ld106_tensor_backward.py"
    broken, fixed = fixed_copy(script, tmp_path, codes="LD106")
    assert "            accelerator.backward(loss)\n" in fixed.read_text()

    for label, path in (("broken", broken), ("fixed", fixed)):
        ranks = run_ranks(path, tmp_path / f"out-{label}")
        assert [r["num_processes"] for r in ranks] == [2, 2]
        assert [len(r["seen"]) for r in ranks] == [2, 2]  # one window of 2 micro-batches per rank
        reference = window_mean_gradient(script, ranks)
        if label == "fixed":
            assert max(max_error(r, reference) for r in ranks) <= TOLERANCE
        else:
            assert [round(relative_scale(r, reference), 6) for r in ranks] == [2.0, 2.0]


def test_divided_loss_fix_deletes_the_division_with_the_call(tmp_path):
    script = "ld106_divided_backward.py"
    broken, fixed = fixed_copy(script, tmp_path, codes="LD106")
    text = fixed.read_text()
    assert "loss / GRAD_ACCUM" not in text
    assert "            loss = model(x, y)\n            accelerator.backward(loss)\n" in text
    # What a fix of the call alone would give: accelerate's division on top of the script's.
    call_only = tmp_path / "call_only" / script
    call_only.parent.mkdir()
    call_only.write_text(broken.read_text().replace("loss.backward()", "accelerator.backward(loss)"))

    for label, path in (("broken", broken), ("fixed", fixed), ("call_only", call_only)):
        ranks = run_ranks(path, tmp_path / f"out-{label}")
        assert [len(r["seen"]) for r in ranks] == [3, 3]
        reference = window_mean_gradient(script, ranks)
        if label == "call_only":
            assert [round(relative_scale(r, reference), 6) for r in ranks] == [round(1 / 3, 6)] * 2
        else:
            assert max(max_error(r, reference) for r in ranks) <= TOLERANCE
