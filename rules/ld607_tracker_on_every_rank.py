"""LD607 tracker-on-every-rank: an experiment tracker (wandb, TensorBoard, MLflow) started by every process."""

from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from lintdist.edits import with_keyword_last
from lintdist.facts import argument_of
from lintdist.in_sight import holds_value
from lintdist.model import Applicability, Fix, Severity
from lintdist.process_group import group_started_before
from lintdist.rank_reads import every_rank_callers, launching_process_only, reads_rank
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.spelling import main_process_test

WANDB_INIT = frozenset({"wandb.init", "wandb.sdk.wandb_init.init"})
SUMMARY_WRITERS = frozenset(
    {
        "torch.utils.tensorboard.SummaryWriter",
        "torch.utils.tensorboard.writer.SummaryWriter",
        "tensorboardX.SummaryWriter",
        "tensorboardX.writer.SummaryWriter",
    }
)
MLFLOW_RUNS = frozenset({"mlflow.start_run", "mlflow.tracking.fluent.start_run"})
TRACKERS = WANDB_INIT | SUMMARY_WRITERS | MLFLOW_RUNS
# wandb.init keywords that choose how the processes share runs: `group=` (one run per process, grouped, as wandb's
# distributed guide documents), `settings=` (a shared run, `mode="shared"`), `mode=` unless a literal that logs
ARRANGED = frozenset({"group", "settings"})
LOGGING_MODES = frozenset({"online", "offline"})
WHAT = {
    "wandb": "each process starts its own W&B run (N runs, all but one holding only system stats or a copy of "
    "rank 0's metrics)",
    "tensorboard": "each process writes its own event file (duplicated or per-rank curves in one log directory)",
    "mlflow": "each process starts its own MLflow run",
}


class TrackerOnEveryRank(Rule):
    """
    ## What it does
    Reports `wandb.init(...)`, `torch.utils.tensorboard.SummaryWriter(...)`
    (or tensorboardX's) and `mlflow.start_run(...)` (a `with` item too)
    that every process of a distributed script reaches: no
    `if accelerator.is_main_process:`/`if rank == 0:` guard around it (here,
    in a conditional expression, or around every caller of its function),
    no earlier `if not accelerator.is_main_process: return`, no main-process
    decorator. The script is distributed when it builds an `Accelerator`,
    wraps a model in DDP/FSDP or starts a process group, and its launch does
    not run one process.

    Not reported: a call in the process that starts the workers itself
    (`wandb.init(...)` under `if __name__ == "__main__":` before
    `mp.spawn(train, ...)`: one run, handed to the workers), a call any of
    whose arguments reads the rank
    (`SummaryWriter(f"runs/rank{rank}")`, `wandb.init(name=f"r{rank}")`,
    `mode="disabled" if rank else None`): per-rank runs by design; a
    `wandb.init` with `group=` (wandb's documented "one run per process",
    grouped), `settings=` (a shared run) or a `mode=` other than a literal
    `"online"`/`"offline"`; a file that sets `WANDB_MODE`/`WANDB_DISABLED`
    (the environment may disable the other ranks). accelerate's
    `init_trackers`/`log_with=` (accelerate 1.15: `Accelerator.init_trackers`
    runs on the main process only, so its trackers start there alone),
    transformers' `report_to=` (its callbacks check `is_world_process_zero`)
    and Lightning loggers (rank-zero only) are never called here.

    ## Why is this bad?
    A launch of N processes creates N runs or N event files. The extra W&B
    runs hold only system metrics or each rank's own shard of the metrics;
    TensorBoard shows N overlapping curves per tag in one directory; MLflow
    lists N runs per job. Dashboards, sweeps and run comparisons are polluted,
    and every rank pays the tracker's start-up and network traffic.

    ## Example
    ```python
    accelerator = Accelerator()
    wandb.init(project="my-project", config=vars(args))
    for step, batch in enumerate(loader):
        ...
        wandb.log({"loss": loss.item()})
    ```

    ## Use instead
    ```python
    accelerator = Accelerator()
    wandb.init(project="my-project", config=vars(args),
               mode=None if accelerator.is_main_process else "disabled")
    for step, batch in enumerate(loader):
        ...
        wandb.log({"loss": loss.item()})
    ```
    or `accelerator = Accelerator(log_with="wandb")` with
    `accelerator.init_trackers(...)` and `accelerator.log(...)`, which run on
    the main process only.

    ## Fix safety
    The fix, for `wandb.init` only, is unsafe: it passes
    `mode=None if <main-process test> else "disabled"` (`None` is wandb's
    default, so the main process is unchanged; a disabled run accepts
    `wandb.log`, `wandb.config` and `run.finish` as no-ops). It is offered
    only where the test is valid at the call: an `Accelerator` (or a started
    process group, `dist.get_rank() == 0`) exists before it. Unsafe because
    code on the other ranks that reads what a real run provides
    (`wandb.run.dir`, `run.id` to name files, artifacts) then reads the
    disabled run's stand-ins. A `SummaryWriter` or an MLflow run gets no fix:
    putting it under a guard leaves `writer.add_scalar(...)`/`mlflow.log_*`
    on the other ranks failing or starting runs of their own, and every use
    must be guarded by hand.

    ## References
    - accelerate 1.15 `accelerator.py::Accelerator.init_trackers`
      (`@on_main_process`: trackers are built and started on the main process
      only) and `tracking.py::on_main_process` (`log`/`finish` of
      `TensorBoardTracker`, `MLflowTracker`: `main_process_only = True`)
    - transformers 5.24 `integrations/integration_utils.py::WandbCallback.setup`,
      `TensorBoardCallback.on_train_begin`, `MLflowCallback.setup`
      (`state.is_world_process_zero`)
    - wandb `sdk/wandb_init.py::init` (`mode: Literal["online", "offline",
      "disabled", "shared"] | None = None`; a disabled run's methods are no-ops)
    - wandb docs, "Log distributed training experiments"
      (https://docs.wandb.ai/guides/track/log/distributed-training/): track
      rank 0 only, or one run per process grouped with `group=`
    - huggingface/pytorch-image-models issue #1309: `--log-wandb` on 4 GPUs
      creates 4 runs; the maintainer moves `wandb.init` to rank 0
    - tdrussell/diffusion-pipe PR #312: wandb started on every process, one
      run per GPU holding only system stats; fixed with a main-process guard
    - metatensor/metatrain issue #733: N runs for N devices, all but one empty
    - OpenNMT/OpenNMT-py PR #1557 and facebookresearch/detectron2 PR #4852:
      one TensorBoard events file per process
    - mlflow/mlflow issue #11782: `with mlflow.start_run()` on several GPUs
      makes one run per GPU
    - Proof: none on gloo: the harm is in the tracker's service (runs, files),
      not in the training; `tests/proofs` has no tracker installed
    """

    code = "LD607"
    name = "tracker-on-every-rank"
    severity = Severity.WARNING
    needs_several_processes = True
    fix_kind = "unsafe"
    # the words other rules test too come first: a file without them is passed over at no cost
    triggers = (
        "Accelerator(",
        "DistributedDataParallel",
        "init_process_group",
        "fully_shard",
        "torch.distributed",
        "torch import distributed",
    )
    also_triggers = ((Pattern(("wandb.init", "SummaryWriter", "start_run(")),),)

    VALID = (
        Valid(
            """\
import wandb
from accelerate import Accelerator

accelerator = Accelerator()
if accelerator.is_main_process:
    wandb.init(project="p")
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

dist.init_process_group("gloo")
rank = dist.get_rank()
writer = SummaryWriter(f"runs/rank{rank}")
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

dist.init_process_group("nccl")
writer = SummaryWriter("runs") if dist.get_rank() == 0 else None
"""
        ),
        Valid(
            """\
import wandb
from accelerate import Accelerator

accelerator = Accelerator()
wandb.init(project="p", group="ddp-run")
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
import wandb
from accelerate import Accelerator

accelerator = Accelerator()
wandb.init(project="p", config={"lr": 1e-4})
""",
            lines=(5,),
            unsafe_fixed="""\
import wandb
from accelerate import Accelerator

accelerator = Accelerator()
wandb.init(project="p", config={"lr": 1e-4}, mode=None if accelerator.is_main_process else "disabled")
""",
        ),
        Invalid(
            """\
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter

def main():
    dist.init_process_group("nccl")
    model = DDP(build_model())
    writer = SummaryWriter("runs/exp1")
    for step in range(10):
        writer.add_scalar("loss", train_step(model), step)

if __name__ == "__main__":
    main()
""",
            lines=(8,),
        ),
        Invalid(
            """\
import mlflow
from accelerate import Accelerator

accelerator = Accelerator()
with mlflow.start_run():
    train(accelerator)
""",
            lines=(5,),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        if not self.loop.distributed and facts.project is None:
            return
        for call in facts.calls:
            if facts.callee_is(call, TRACKERS):
                self._check(call)

    def _check(self, call: cst.Call) -> None:
        facts = self.facts
        kind = (
            "wandb" if facts.callee_is(call, WANDB_INIT) else "mlflow" if facts.callee_is(call, MLFLOW_RUNS) else "tensorboard"
        )
        if any(reads_rank(facts, arg.value, call) for arg in call.args) or self._tested_in_expression(call):
            return
        if kind == "wandb" and self._arranged(call):
            return
        callers = every_rank_callers(facts, call)
        if callers is None or launching_process_only(facts, call):
            return
        evidence = ""
        if callers:
            evidence = f" (reached on every rank from {', '.join(o.where(s) for o, s in callers)})"
        test = main_process_test(facts, call)
        remedy = f"start it under `if {test}:`" if test else "start it on rank 0 only"
        if kind == "wandb":
            remedy += ' or pass `mode="disabled"` on the other ranks (`group=` for deliberate per-rank runs)'
        else:
            remedy += ", and guard its uses"
        name = get_full_name_for_node(call.func) or "tracker"
        self.report(
            call,
            f"`{name}(...)` runs on every process{evidence}: {WHAT[kind]}; {remedy}",
            fix=self._fix(call, test) if kind == "wandb" and not callers else None,
        )

    def _tested_in_expression(self, call: cst.Call) -> bool:
        """A conditional expression or `and`/`or` in the call's statement runs it on some ranks only."""
        facts = self.facts
        child: cst.CSTNode = call
        for ancestor in facts.ancestors(call):
            if isinstance(ancestor, cst.BaseSmallStatement | cst.BaseCompoundStatement):
                return False
            test = ancestor.test if isinstance(ancestor, cst.IfExp) and child is not ancestor.test else None
            if isinstance(ancestor, cst.BooleanOperation) and child is ancestor.right:
                test = ancestor.left
            if test is not None and (facts.rank_dependent(test) or reads_rank(facts, test, call)):
                return True
            child = ancestor
        return False

    def _arranged(self, call: cst.Call) -> bool:
        """The processes' runs are arranged on purpose: grouped, shared, a computed mode, or set by the environment."""
        text = self.context.text
        if "WANDB_MODE" in text or "WANDB_DISABLED" in text:
            return True
        if any(a.keyword is not None and a.keyword.value in ARRANGED for a in call.args):
            return True
        mode = argument_of(call, "mode", None)
        if mode is None:
            return False
        return not (isinstance(mode, cst.SimpleString) and mode.evaluated_value in LOGGING_MODES)

    def _fix(self, call: cst.Call, test: str | None) -> Fix | None:
        facts = self.facts
        if test is None or argument_of(call, "mode", None) is not None or group_started_before(facts, call) is not True:
            return None
        root = test.split(".", 1)[0]
        if test.endswith(".is_main_process") and root != "self" and not holds_value(facts, root, call):
            return None
        value = cst.parse_expression(f'None if {test} else "disabled"')
        new = with_keyword_last(call, "mode", value)
        return Fix(
            Applicability.UNSAFE,
            'Pass `mode="disabled"` on the processes other than the main one',
            replacements=((call, new),),
        )
