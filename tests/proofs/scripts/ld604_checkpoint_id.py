"""Save and reload a DCP checkpoint on 2 gloo CPU ranks with the pre-2.2 functions, for the LD604 proof.

The calls pass the new API's `checkpoint_id=` to `save_state_dict`/`load_state_dict`, which have no such
parameter. Each rank reports the error it met, or whether the reloaded weights equal the saved ones, in
``$PROOF_OUT/rank<R>.json``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(os.environ["PROOF_OUT"], "ckpt")
    torch.manual_seed(0)
    saved = {"weight": torch.randn(4, 4)}
    restored = {"weight": torch.zeros(4, 4)}
    report: dict = {"error": None}
    try:
        dcp.save_state_dict(saved, checkpoint_id=path)
        dcp.load_state_dict(restored, checkpoint_id=path)
        report["equal"] = bool(torch.equal(saved["weight"], restored["weight"]))
    except Exception as error:  # noqa: BLE001 - the report carries the failure
        report["error"] = type(error).__name__
    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{rank}.json"), "w") as handle:
        json.dump(report, handle)
    # every rank leaves its last collective before any rank tears the group down (one CI run aborted in
    # teardown with "terminate called without an active exception" when rank 0 got there first)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
