"""LD602 proven by running it: on 2 gloo ranks (accelerate MULTI_CPU under torchrun), the checkpoint of the
prepared model has `module.`-prefixed keys and fails a strict load into the plain model; after `--fix` it loads
strictly and holds the trained weights."""

from __future__ import annotations

import pytest
import torch

from tests.proofs.harness import fixed_copy, run_ranks

pytestmark = pytest.mark.slow


def _plain_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def test_fixed_checkpoint_loads_into_the_plain_model(tmp_path):
    broken, fixed = fixed_copy("ld602_prefixed_keys.py", tmp_path, codes="LD602")
    assert "accelerator.save(accelerator.unwrap_model(model).state_dict()" in fixed.read_text()

    broken_ranks = run_ranks(broken, tmp_path / "out-broken")
    fixed_ranks = run_ranks(fixed, tmp_path / "out-fixed")
    assert broken_ranks[0]["type"] == "DistributedDataParallel", "the prepared model must be DDP-wrapped"

    saved = torch.load(tmp_path / "out-broken" / "model.pt", weights_only=True)
    assert saved and all(key.startswith("module.") for key in saved)
    with pytest.raises(RuntimeError, match="Missing key"):
        _plain_model().load_state_dict(saved, strict=True)

    saved = torch.load(tmp_path / "out-fixed" / "model.pt", weights_only=True)
    model = _plain_model()
    model.load_state_dict(saved, strict=True)
    for name, parameter in model.named_parameters():
        for report in fixed_ranks:
            assert torch.equal(parameter, torch.tensor(report["weights"][name]))
