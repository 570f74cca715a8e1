"""Corrected building blocks for distributed training loops; imports torch only, never the linter.

Self-test on a cluster: `torchrun --nproc_per_node N -m lintdist.runtime.selftest`.
"""

from lintdist.runtime.loop import scheduler_total_steps, set_epoch
from lintdist.runtime.process import any_rank, main_process_first, sequence_parallel_group
from lintdist.runtime.sync import grad_sync
from lintdist.runtime.tokens import (
    TokenLossWindow,
    TokenWindows,
    count_loss_tokens,
    global_token_count,
    microbatch_groups,
    shift_labels,
)

__all__ = [
    "TokenLossWindow",
    "TokenWindows",
    "any_rank",
    "count_loss_tokens",
    "global_token_count",
    "grad_sync",
    "main_process_first",
    "microbatch_groups",
    "scheduler_total_steps",
    "sequence_parallel_group",
    "set_epoch",
    "shift_labels",
]
