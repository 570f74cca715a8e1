"""LD411 global-rank-from-local-rank: `init_process_group(rank=...)` given the rank on this node, not in the job."""

from __future__ import annotations

import re

import libcst as cst

from lintdist.devices import INIT_PROCESS_GROUP
from lintdist.edits import module_import
from lintdist.facts import argument_of
from lintdist.launcher_signs import emulates_launcher, meets_on_this_machine
from lintdist.model import Applicability, Fix, Severity
from lintdist.rank_values import code_text, local_rank
from lintdist.rule import Invalid, Pattern, Rule, Valid

# Launchers that export `RANK` to every worker: torch 2.13 `elastic/agent/server/local_elastic_agent.py::
# _start_workers` (torchrun, and `accelerate launch`, which runs it), deepspeed's `launcher/launch.py`.
SETS_RANK = frozenset({"torchrun", "accelerate", "deepspeed"})
GLOBAL_RANK = 'int(os.environ["RANK"])'


class GlobalRankFromLocalRank(Rule):
    """
    ## What it does
    Reports `init_process_group(..., rank=r)` where `r` is the rank of the
    process *on its node*: `int(os.environ["LOCAL_RANK"])` (also
    `os.environ.get`, `os.getenv`), `dist.get_node_local_rank()`,
    `args.local_rank` (the `--local_rank` argument a launcher passes), an
    Accelerator's or `PartialState`'s `local_process_index`, or a name,
    attribute or parameter whose every value comes from one of them. The
    value is followed through assignments and call sites, not guessed from
    the name: `rank = args.node_rank * ngpus + local_rank` and a parameter
    with no caller in sight are not reported.

    It is an error where the script's launch shows more than one node
    (`torchrun --nnodes 2`, `srun -N 2`, `accelerate launch` with
    `num_machines: 2`), a warning where the launch is unknown, and nothing
    where the launch runs one node (`torchrun --standalone`, `--nnodes 1`,
    `python train.py`, `mp.spawn` in the script): there the local rank is
    the global one. Test modules are not reported.

    ## Why is this bad?
    `rank` must be unique in `0..world_size-1` across the whole job, and
    torch does not check it: an explicit rank overrides the launcher's
    `RANK`. With two nodes of four processes, both nodes claim ranks 0 to 3,
    ranks 4 to 7 never join, and `init_process_group` waits until its
    timeout (30 minutes by default for gloo, 10 for NCCL) while the two
    "rank 0" processes race for the store. The script works on one
    machine, where local and global ranks coincide, and hangs on two.

    ## Example
    ```python
    import os

    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
    ```

    ## Use instead
    ```python
    import os

    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    ```

    ## Fix safety
    The fix writes `rank=int(os.environ["RANK"])` (adding `import os` if
    needed), and leaves the local-rank variable alone for the device choice.
    It is safe where the script's launch is `torchrun`, `accelerate launch`
    or `deepspeed`, which set `RANK` for every worker; elsewhere (no launch
    in sight, `srun`, `mpiexec`, a script that sets its own variables) it is
    unsafe: a hand-written launcher may set `LOCAL_RANK` but not `RANK`, and
    the fixed script would raise `KeyError`.

    ## References
    - torch 2.13 `torch/distributed/distributed_c10d.py::init_process_group`: an explicit `rank` is put in the
      rendezvous URL and wins over `RANK`; the only check is "rank must be non-negative if using store".
      `torch/distributed/rendezvous.py::_env_rendezvous_handler` reads `RANK` only when no rank is given.
    - torch 2.13 `torch/distributed/elastic/agent/server/local_elastic_agent.py::_start_workers`: `RANK` is the
      global rank, `LOCAL_RANK` the rank on the node.
    - pytorch/pytorch#23074 (https://github.com/pytorch/pytorch/issues/23074): a hang at initialisation with
      two nodes of two processes; the maintainer: "`local_rank` for the two nodes are actually 0, 1 and 0, 1,
      so it hangs as it never sees 2 and 3".
    - Tencent/PatrickStar#42 (https://github.com/Tencent/PatrickStar/pull/42): "local_rank to global rank to
      enable multi-node training".
    - tingshua-yts/BetterDL#2 (https://github.com/tingshua-yts/BetterDL/pull/2): the multi-node example passes
      the local rank where the global one is needed.
    - Proof: tests/proofs/test_ld411_two_nodes.py (gloo, two torchrun "nodes" of one process on this machine):
      with `rank=LOCAL_RANK` both processes claim rank 0 and `init_process_group` fails within its 20 s timeout;
      the fixed script forms the group of two with ranks 0 and 1.
    """

    code = "LD411"
    name = "global-rank-from-local-rank"
    severity = Severity.WARNING
    fix_kind = "safe"
    needs_several_processes = True
    # an `init_process_group(` whose arguments name a rank (one level of nested calls: `int(os.environ[...])`)
    triggers = (Pattern(("init_process_group",), re.compile(r"init_process_group\((?:[^()]|\([^()]*\))*rank")),)
    also_triggers = (("LOCAL_RANK", "local_rank", "local_process_index"),)

    VALID = (
        Valid(
            """\
import os
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
"""
        ),
        Valid(
            """\
import torch.distributed as dist

rank = args.node_rank * args.nproc_per_node + args.local_rank
dist.init_process_group("nccl", rank=rank, world_size=args.world_size)
"""
        ),
        Valid(
            """\
import os
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
""",
            project={"run.sh": "torchrun --standalone --nproc_per_node 8 train.py\n"},
        ),
        Valid(
            """\
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(local_rank, world_size):
    dist.init_process_group("gloo", rank=local_rank, world_size=world_size)

mp.spawn(worker, args=(2,), nprocs=2)
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import os
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
""",
            lines=(5,),
            unsafe_fixed="""\
import os
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
""",
        ),
        Invalid(
            """\
import torch.distributed as dist

def setup(args):
    dist.init_process_group(backend="nccl", init_method="env://", world_size=args.world_size, rank=args.local_rank)
""",
            lines=(4,),
            unsafe_fixed="""\
import torch.distributed as dist
import os

def setup(args):
    dist.init_process_group(backend="nccl", init_method="env://", world_size=args.world_size, rank=int(os.environ["RANK"]))
""",
        ),
        Invalid(
            """\
import os
import torch.distributed as dist

dist.init_process_group("gloo", rank=int(os.environ["LOCAL_RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
""",
            lines=(4,),
            fixed="""\
import os
import torch.distributed as dist

dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
""",
            project={"run.sh": "torchrun --nnodes 2 --node_rank $NODE_RANK --nproc_per_node 4 train.py\n"},
        ),
    )

    def check_python(self) -> None:
        facts = self.facts
        if self.context.is_test_module or self.launch.one_node:
            return  # one node (a launch line, or `mp.spawn` in the script): the rank on the node is the job's
        for call in facts.calls:
            if facts.method_name(call) != "init_process_group" or not facts.callee_is(call, INIT_PROCESS_GROUP):
                continue
            rank, size = argument_of(call, "rank", 4), argument_of(call, "world_size", 3)
            if (isinstance(size, cst.Integer) and size.value == "1") or meets_on_this_machine(facts, call):
                continue  # a group of one process, or one whose rendezvous is on this machine: one node
            how = local_rank(facts, rank, call) if rank is not None else None
            if how is not None:
                self._report(call, rank, how)

    def _report(self, call: cst.Call, rank: cst.BaseExpression, how: str) -> None:
        text = code_text(rank)
        code = re.findall(r"`([^`]+)`", how)
        shown = f"`{text}`" + ("" if code and code[0] in text else f" (from {how})")
        nodes = self.launch.nodes
        several = nodes is not None and isinstance(nodes.value, int) and nodes.value > 1
        if several:
            where = f"this job runs on {nodes.value} nodes ({nodes.where()}), where"
        else:
            where = "this is wrong on more than one node:"
        self.report(
            rank,
            f"`init_process_group` is given {shown}, the rank on this node, as its rank in the whole job; {where} "
            "every node's processes claim the same ranks 0..n-1, the other ranks never join and the rendezvous "
            'hangs until its timeout; pass the global rank (`int(os.environ["RANK"])`) or leave `rank` to env://',
            severity=Severity.ERROR if several else None,
            fix=self._fix(rank),
        )

    def _fix(self, rank: cst.BaseExpression) -> Fix | None:
        """``rank=int(os.environ["RANK"])``: safe under a launcher that sets ``RANK``, unsafe elsewhere."""
        imports = module_import(self.context.names.module_bindings("os"), "os")
        if imports is None:
            return None  # `os` is something else here
        launcher = self.launch.launcher
        sets_rank = launcher is not None and launcher.value in SETS_RANK and not emulates_launcher(self.facts, rank)
        return Fix(
            Applicability.SAFE if sets_rank else Applicability.UNSAFE,
            'Pass the global rank, `int(os.environ["RANK"])`',
            replacements=((rank, cst.parse_expression(GLOBAL_RANK)),),
            imports=imports,
        )
