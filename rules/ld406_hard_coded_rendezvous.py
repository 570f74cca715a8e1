"""LD406 hard-coded-rendezvous: a script that overwrites the rendezvous address or port its launcher provides."""

from __future__ import annotations

import re

import libcst as cst

from lintdist.devices import INIT_PROCESS_GROUP
from lintdist.environment import environment_writes, reads_environment, spells_environment
from lintdist.facts import argument_of, string_value
from lintdist.launch import most_nodes, setting_span, starts_processes
from lintdist.launcher_signs import LAUNCHER_VARIABLES, emulates_launcher, launcher_evidence, own_group
from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid
from lintdist.surrounding_tests import surrounding_tests
from lintdist.values import string_of

RENDEZVOUS_VARIABLES = frozenset({"MASTER_ADDR", "MASTER_PORT"})
# Launch-file flags that fix the rendezvous, per launcher.
ADDRESS_FLAGS = {
    "torchrun": ("master_addr", "rdzv_endpoint"),
    "accelerate": ("main_process_ip",),
    "deepspeed": ("master_addr",),
}
SHELL_VALUE = re.compile(r"[$`]")
LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "0.0.0.0", "::1"})
# A value that stands for an address to fill in: `<MASTER_IP>`, `{head_node}`, `xxx.xxx.xxx.xxx`, `MASTER_IP`,
# `your_ip`.
PLACEHOLDER = re.compile(r"[<>{}\[\]]|^[xX*.]+$|^[A-Z][A-Z0-9_]*$|(?i:your|_here\b)")


class HardCodedRendezvous(Rule):
    """
    ## What it does
    Reports a script launched by `torchrun` or `accelerate launch` that
    overwrites the rendezvous its launcher provides: `os.environ["MASTER_ADDR"]
    = ...` or `os.environ["MASTER_PORT"] = ...` (also through
    `os.environ.update(...)` or `os.putenv`), or
    `init_process_group(init_method="tcp://host:port")` with a literal
    address. The script counts as launched when it reads `RANK`,
    `LOCAL_RANK` or `WORLD_SIZE` from the environment, calls
    `init_process_group()` with no `rank`/`world_size`, builds an
    `Accelerator`/`PartialState`, or is named by a `torchrun`, `accelerate
    launch` or `deepspeed` line (also under `srun` or `mpiexec`). In a launch
    file, a multi-node line (`--nnodes`/`--num_machines` above 1, or `srun
    -N 2` around the launcher) that fixes the address to a literal
    (`--master_addr 10.1.2.3`, `--main_process_ip localhost`,
    `--rdzv_endpoint host:port`) is reported too, unless the value is a
    placeholder (`<MASTER_IP>`, `xxx.xxx.xxx.xxx`, `MASTER_IP`, `your_ip`).
    In documentation (a launch block of a Markdown page) an address is the
    reader's to replace: only `localhost` and its kin, wrong on every copy of
    a multi-node command, are reported there.

    ## Why is this bad?
    The launcher exports `MASTER_ADDR` and `MASTER_PORT` to every worker
    (torchrun's elastic agent sets them from its rendezvous; `accelerate
    launch` from `--main_process_ip`/`--main_process_port`). A script that
    overwrites them makes every node rendezvous at the written address: on a
    second node `localhost` is the wrong machine and the job hangs at
    `init_process_group`, and two jobs on one machine collide on the written
    port (`EADDRINUSE`). It works on the machine it was written on and breaks
    when the job is moved or scaled out.

    Not reported: `os.environ.setdefault(...)` and assignments under a test of
    the environment (`if "MASTER_ADDR" not in os.environ:`), which keep the
    launcher's values; and a file that starts its own processes
    (`mp.spawn`, `torch.multiprocessing.start_processes`, `mp.Process`,
    `notebook_launcher`), where a single-node job needs an address set
    somewhere; and a script whose launch lines start it with a launcher that
    sets no rendezvous (`python train.py`, `mpiexec -n 2 python train.py`,
    `srun -N 2 python train.py`): there the script has to set
    `MASTER_ADDR`/`MASTER_PORT` itself (from `SLURM_*` or the MPI
    environment), and nothing is overwritten.

    ## Example
    ```python
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    ```

    ## Use instead
    ```python
    os.environ.setdefault("MASTER_ADDR", "localhost")  # a fallback for a single process run by hand
    os.environ.setdefault("MASTER_PORT", "12355")
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    ```

    ## Fix safety
    There is no fix: whether the value was meant as a fallback (`setdefault`)
    or should go (the launcher sets it) is the author's choice.

    ## References
    - torch `torch/distributed/elastic/agent/server/local_elastic_agent.py`
      (`_start_workers` sets `MASTER_ADDR`/`MASTER_PORT` for every worker) and
      `torch/distributed/run.py` (`--master_addr`, `--master_port`, `--rdzv_endpoint`)
    - accelerate `accelerate/utils/launch.py` (`prepare_multi_gpu_env`,
      `prepare_simple_launcher_cmd_env`: `MASTER_ADDR`/`MASTER_PORT` from the launch flags)
    - facebookresearch/XLM issue #53: two jobs on one server fail with
      "Address already in use" until the script stops writing a fixed `MASTER_PORT`
    - open-mmlab/mmcv pull request #362: the launcher's `MASTER_PORT` is kept
      instead of being overwritten by the script's value
    - pytorch/pytorch issue #73320: a fixed rendezvous port identifies the job;
      a second job on the same nodes must get another one
    - Slurm `srun` and Open MPI `mpirun` export their own variables
      (`SLURM_PROCID`, `OMPI_COMM_WORLD_RANK`), not `MASTER_ADDR`/`MASTER_PORT`
    """

    code = "LD406"
    name = "hard-coded-rendezvous"
    severity = Severity.INFO
    default_enabled = True
    kinds = frozenset({"python", "launch"})
    triggers = ("master_addr", "main_process_ip", "rdzv_endpoint")
    python_triggers = ("MASTER_ADDR", "MASTER_PORT", "tcp://")

    VALID = (
        Valid(
            """\
import os

import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


mp.spawn(worker, args=(2,), nprocs=2)
"""
        ),
        Valid(
            """\
import os

import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "localhost")
if "MASTER_PORT" not in os.environ:
    os.environ["MASTER_PORT"] = "29500"
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
"""
        ),
        Valid(
            "torchrun --nnodes 1 --nproc_per_node 8 --master_addr localhost --master_port 29501 train.py\n",
            filename="launch.sh",
        ),
        Valid(
            """\
import os

import torch.distributed as dist

os.environ["MASTER_ADDR"] = os.environ["SLURM_LAUNCH_NODE_IPADDR"]
os.environ["MASTER_PORT"] = "29500"
dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
""",
            project={"job.sh": "srun -N 2 --ntasks-per-node 4 python train.py\n"},
        ),
    )
    INVALID = (
        Invalid(
            """\
import os

import torch.distributed as dist

os.environ["MASTER_ADDR"] = "localhost"
os.environ["MASTER_PORT"] = "12355"
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
""",
            lines=(5, 6),
        ),
        Invalid(
            "torchrun --nnodes 2 --nproc_per_node 8 --master_addr 10.0.0.5 --master_port 29500 train.py\n",
            lines=(1,),
            filename="launch.sh",
        ),
        Invalid(
            'srun -N 2 torchrun --nnodes "$SLURM_NNODES" --nproc_per_node 8 --master_addr localhost train.py\n',
            lines=(1,),
            filename="launch.sh",
        ),
    )

    def check_python(self) -> None:
        facts = self.facts
        if facts is None or starts_processes(facts):
            return
        rendezvous = self.launch.rendezvous
        if rendezvous is not None and rendezvous.value is False:
            return  # `python`, `srun`, `mpiexec`: no launcher value to overwrite, the script must set it
        found = [*self._environment_writes(), *self._tcp_init_methods()]
        if not found:
            return
        if launcher_evidence(facts, self.launch, self.context.settings) is None:
            return
        launcher = self.launch.launcher
        # the launcher sets the rendezvous (a launch that does not returned above); not `deepspeed`: its workers host
        # their own store at the port, so one written value reaches them all
        launched = rendezvous is not None and launcher is not None and launcher.value in {"torchrun", "accelerate"}
        for node, what in found:
            evidence = launcher_evidence(facts, self.launch, self.context.settings, near=node)
            if evidence is None or emulates_launcher(facts, node):
                continue  # a documentation block with no launcher of its own, or code that sets RANK/WORLD_SIZE itself
            if launched and "MASTER_PORT" in what:
                # torch 2.13 `rendezvous._create_c10d_store`: under torchrun (TORCHELASTIC_USE_AGENT_STORE=True, the
                # default of its static and c10d rendezvous) every worker is a client of the agent's store
                self.report(
                    node,
                    f"{what} overwrites the port of the rendezvous that {launcher.where()} starts: under "
                    "torchrun (and `accelerate launch`, which runs it) every worker connects as a client to the store "
                    "the launcher hosts at `MASTER_ADDR:MASTER_PORT`, so a port written here points the workers "
                    "where nothing listens and `init_process_group` times out (unless it happens to equal the "
                    "launcher's port); use `os.environ.setdefault(...)` for a fallback, or leave it to the launcher",
                    severity=Severity.ERROR,
                )
                continue
            self.report(
                node,
                f"{what} overwrites the rendezvous the launcher provides ({evidence}): torchrun and `accelerate "
                "launch` set `MASTER_ADDR`/`MASTER_PORT` for every worker, and a written value breaks multi-node "
                "runs and collides with other jobs on the port; use `os.environ.setdefault(...)` for a fallback, "
                "or leave it to the launcher",
            )

    # -- Python -----------------------------------------------------------------------------------

    def _environment_writes(self) -> list[tuple[cst.CSTNode, str]]:
        found = []
        for write in environment_writes(self.facts):
            keys = [k for k in write.keys if k in RENDEZVOUS_VARIABLES]
            if not keys or self._env_tested(write.node):
                continue
            if write.how == "store" and not reads_environment(self.facts, write.value):
                found.append((write.node, f'`os.environ["{keys[0]}"] = ...`'))
            elif write.how == "update":
                found.append((write.node, f"`os.environ.update(...)` setting {' and '.join(keys)}"))
            elif write.how == "putenv":
                found.append((write.node, f'`os.putenv("{keys[0]}", ...)`'))
        return found

    def _tcp_init_methods(self) -> list[tuple[cst.CSTNode, str]]:
        facts = self.facts
        found = []
        for call in facts.calls:
            if facts.method_name(call) != "init_process_group" or not facts.callee_is(call, INIT_PROCESS_GROUP):
                continue
            method = argument_of(call, "init_method", 1)
            text = string_of(facts, method, call)
            if text is not None and text.startswith("tcp://") and not own_group(facts, call):
                found.append((method, f'`init_process_group(init_method="{text}")`'))
        return found

    def _env_tested(self, node: cst.CSTNode) -> bool:
        """An ``if`` around the write reads the environment (``"MASTER_ADDR" not in os.environ``,
        ``os.environ.get("RANK") is None``): a fallback that keeps what the launcher set."""
        facts = self.facts
        variables = RENDEZVOUS_VARIABLES | LAUNCHER_VARIABLES
        around = surrounding_tests(facts, node, kinds=(cst.If, cst.While), scopes=(cst.FunctionDef, cst.ClassDef))
        return any(
            spells_environment(facts, branch.test)
            or any(string_value(s) in variables for s in facts.within(branch.test, cst.SimpleString))
            for branch in around
        )

    # -- launch files --------------------------------------------------------------------------------

    def check_launch(self, launch) -> None:
        text = self.context.text
        for command in launch.commands:
            count, written = most_nodes(command, launch, text, self.context.display_name)
            if count is None or count <= 1:
                continue
            flags = {f.name: f for f in command.flags}
            for name in ADDRESS_FLAGS.get(command.launcher, ()):
                flag = flags.get(name)
                if flag is None or flag.value is None or SHELL_VALUE.search(flag.value):
                    continue
                host = flag.value.rsplit(":", 1)[0] if name == "rdzv_endpoint" else flag.value
                local = host in LOCAL_ADDRESSES
                if PLACEHOLDER.search(host) or (self.context.is_documentation and not local):
                    continue  # the reader's own address goes there: only `localhost` is wrong in every copy
                message = (
                    f"`--{name} {flag.value}` fixes the rendezvous of a multi-node launch (`{written}`) to "
                    + ("this machine: the other nodes cannot reach it" if local else "one machine's address")
                    + "; pass it in from the scheduler (`$MASTER_ADDR`, `$SLURM_...`, a script argument) so the job "
                    "runs wherever node 0 lands"
                )
                self.report(None, message, span=setting_span(text, flag))
