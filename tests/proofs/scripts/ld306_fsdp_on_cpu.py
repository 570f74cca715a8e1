"""Let accelerate 1.15 run its FSDP path on CPU ranks (gloo), for the LD306 and LD309 proofs.

accelerate never selects FSDP on a CPU: ``PartialState._prepare_backend`` gives ``MULTI_CPU`` (with
``cpu=True`` or ``ACCELERATE_USE_CPU``, which the proofs set) or ``NO``, and ``AcceleratorState.__init__``
switches to ``DistributedType.FSDP`` only inside its multi-device branch (``MULTI_GPU``, ``MULTI_XPU``...).
Importing this module wraps ``AcceleratorState.__init__`` to do, after the real one, exactly what that
branch does for a plugin: ``distributed_type = FSDP`` and ``fsdp_plugin = plugin`` (plus the copy of the
type ``PartialState`` keeps). Everything after that is accelerate's and torch's own code, unpatched:
``Accelerator.prepare`` with its FSDP2 checks, ``_prepare_fsdp2``, ``fsdp2_apply_ac``,
``fsdp2_prepare_model`` and ``fully_shard`` on the gloo process group of ``torchrun``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

_real_init = AcceleratorState.__init__


def _init_then_fsdp(self, *args, fsdp_plugin=None, **kwargs):
    _real_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP


AcceleratorState.__init__ = _init_then_fsdp


class Block(torch.nn.Module):
    """One residual MLP block: the unit a wrap policy should shard on its own."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def failure(error: BaseException, script: str) -> dict:
    """The exception's type, message and the line of ``script`` it was raised from."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if os.path.basename(f.filename) == script]
    return {"error": type(error).__name__, "message": str(error), "line": frames[-1].lineno if frames else None}


def layout(model: torch.nn.Module) -> dict:
    """How FSDP2 cut the model: the FSDP units and the activation-checkpointed modules."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule

    units = [name or "<root>" for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    checkpointed = [name for name, m in model.named_modules() if isinstance(m, CheckpointWrapper)]
    return {"fsdp_units": units, "checkpointed": checkpointed}


def train_steps(accelerator, model, optimizer, steps: int = 5) -> list[float]:
    """A few steps on the same batch: the losses, to show the prepared pair trains."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def write(report: dict) -> None:
    rank = int(os.environ.get("RANK", "0"))
    report = {**report, "distributed_type": str(AcceleratorState().distributed_type), "argv": sys.argv[1:]}
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as out:
        json.dump(report, out)
