"""CUDA checks: CUDA tensors, NCCL with one rank, bf16 autocast with scale_mean, FSDP2 on one GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from lintdist.runtime import TokenLossWindow, count_loss_tokens, global_token_count, selftest

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False on this machine")
    return torch.device("cuda", 0)


def test_token_helpers_keep_cuda_tensors_on_the_device(cuda: torch.device) -> None:
    labels = torch.tensor([[-100, 1, 2], [3, -100, -100]], device=cuda)
    count = count_loss_tokens({"labels": labels}, shifted=True)
    assert count.device == cuda and count.item() == 2
    assert global_token_count(count).device == cuda
    window = TokenLossWindow([{"labels": labels}], shifted=True)
    loss = torch.tensor(3.0, device=cuda, requires_grad=True)
    assert window.scale_sum(loss).device == cuda
    assert window.scale_mean(loss, {"labels": labels}).item() == pytest.approx(3.0)


@pytest.mark.parametrize("autocast", [False, True], ids=["float64", "bf16-autocast"])
def test_token_loss_window_on_one_gpu(cuda: torch.device, autocast: bool) -> None:
    case = selftest.TokenLossCase(
        "plain", 3, selftest.canonical_lengths(1), reduction="mean", shifted=True, autocast=autocast
    )
    verdict = selftest.check_token_loss(selftest.local_context(cuda), case)
    assert verdict.status == "PASS", verdict.line()


def test_selftest_with_nccl_on_one_gpu(cuda: torch.device) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    result = subprocess.run(
        [sys.executable, "-m", "lintdist.runtime.selftest", "--backend", "nccl", "--timeout", "60"],
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS token-loss (raw DDP, W=1, G=3)" in result.stdout
    assert "PASS token-loss (accelerate MULTI_GPU, W=1, G=3)" in result.stdout
    assert "PASS token-loss (FSDP2, W=1, G=3)" in result.stdout
    assert "PASS grad-sync (FSDP2, W=1)" in result.stdout
    assert "bf16 autocast, scale_mean, shifted]" in result.stdout
    assert "FAIL" not in result.stdout
