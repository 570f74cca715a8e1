"""LD314 device-map-auto-multiprocess: `from_pretrained(device_map="auto")` in a script that runs several processes."""

from __future__ import annotations

import re

import libcst as cst

from lintdist.devices import INIT_PROCESS_GROUP
from lintdist.environment import environment_writes
from lintdist.facts import argument_of, string_value
from lintdist.guards import branch_tests, mentions
from lintdist.model import Applicability, Fix, Severity
from lintdist.rank_values import local_rank_in_scope
from lintdist.rule import Invalid, Pattern, Rule, Valid

# transformers 5.24 `integrations/accelerate.py::check_and_set_device_map`: the strings that plan a map over every
# visible device (any other string is one device; `"cuda"` becomes `cuda:{LOCAL_RANK}`).
SPREADING = frozenset({"auto", "balanced", "balanced_low_0", "sequential"})
# A class of transformers or PEFT, or one named like a model class where nothing resolves it.
LIBRARIES = ("transformers.", "peft.")
MODEL_CLASS = re.compile(r"^(?:Auto\w*Model\w*|\w+For[A-Z]\w*|\w+Model)$")
NOT_MODELS = re.compile(r"Tokenizer|Processor|Config|FeatureExtractor|Pipeline", re.IGNORECASE)
# Keywords that ask for tensor parallelism on purpose: the model is sharded over the ranks, not copied per rank.
TENSOR_PARALLEL = frozenset({"tp_plan", "tp_size", "distributed_config"})
# Text that says the author keeps a device map across processes on purpose, or gives each process its own GPUs.
DELIBERATE = ("ACCELERATE_BYPASS_DEVICE_MAP",)
DEEPSPEED_INIT = frozenset({"deepspeed.initialize"})
# Words of a test that chooses by the launch: how many processes run, or whether a process group exists.
LAUNCH_TEST = re.compile(r"(?i)world|ddp|distributed|rank|process|is_initialized")


class DeviceMapAutoMultiprocess(Rule):
    """
    ## What it does
    Reports `from_pretrained(..., device_map="auto")` (also `"balanced"`,
    `"balanced_low_0"`, `"sequential"`) of a transformers or PEFT model class
    (`AutoModelForCausalLM`, `LlamaForCausalLM`, `AutoPeftModelForCausalLM`...)
    in a script that runs several processes: its launch starts more than one
    (`torchrun --nproc_per_node 4`, `accelerate launch` with `num_processes:
    4`, `deepspeed`), or the script itself wraps a model in
    `DistributedDataParallel`/FSDP or calls `init_process_group` /
    `deepspeed.initialize`, or picks a per-process map itself when several
    processes run (`{"": local_rank} if ddp else ...`). The value is followed through assignments: a map
    that is `"auto"` in one branch and no map (`None`) in the other is
    reported; one that is `"auto"` only beside a per-process branch chosen by
    the launch (`device_map = {"": local_rank}` when `WORLD_SIZE > 1`, `...
    if ddp else "auto"`) is not, unless that branch itself sits under another
    test (`if use_4bit:`), so that the other runs of several processes keep
    `"auto"`. Not reported either:
    `device_map={"": local_rank}`, `{"": accelerator.local_process_index}`,
    `"cuda"` (transformers maps it to `cuda:{LOCAL_RANK}`), tensor parallelism
    asked for on purpose (`tp_plan`, `distributed_config`), a script that
    sets `ACCELERATE_BYPASS_DEVICE_MAP` or `CUDA_VISIBLE_DEVICES` itself, and
    a script with no sign of several processes (one-process model
    parallelism, `python infer.py`).

    ## Why is this bad?
    `device_map="auto"` plans one model over *every visible GPU*, and each
    process plans its own: with 4 processes on a 4-GPU node, every GPU holds
    layers of all 4 copies, the work is done 4 times, and memory runs out
    long before a one-process run would. Training cannot proceed at all:
    accelerate 1.15's `Accelerator.prepare` (which the transformers `Trainer`
    calls) raises "You can't train a model that has been loaded with
    `device_map='auto'` in any distributed mode", and
    `DistributedDataParallel(model, device_ids=[rank])` refuses a module
    spread over several devices. transformers 5.24 only logs this at info
    level, after every process has loaded the weights. Data parallelism wants
    one whole copy per process on its own GPU; a model too large for one GPU
    needs FSDP or DeepSpeed ZeRO-3, not a device map.

    ## Example
    ```python
    import os

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    model = AutoModelForCausalLM.from_pretrained("gpt2", device_map="auto")
    ```

    ## Use instead
    ```python
    import os

    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    model = AutoModelForCausalLM.from_pretrained("gpt2", device_map={"": local_rank})
    ```

    ## Fix safety
    Unsafe, and offered only where the local rank is at hand (a name bound to
    it before the call, or an `Accelerator`'s `local_process_index`): the fix
    writes `device_map={"": local_rank}`. A model that does not fit on one GPU
    then fails to load; it needs FSDP or DeepSpeed ZeRO-3 instead, which a
    rewrite cannot choose.

    ## References
    - transformers 5.24 `modeling_utils.py::PreTrainedModel.from_pretrained`: with `device_map == "auto"` and
      `WORLD_SIZE` set it only calls `logger.info("You've set device_map=`auto` while triggering a distributed
      run with torchrun. This might lead to unexpected behavior...")`.
    - transformers 5.24 `integrations/accelerate.py::check_and_set_device_map` (`"cuda"` becomes
      `cuda:{LOCAL_RANK}`; `auto`/`balanced`/`balanced_low_0`/`sequential` are planned) and `_get_device_map`
      (`get_balanced_memory`/`get_max_memory` over every visible GPU).
    - accelerate 1.15 `accelerator.py::Accelerator.prepare` and `prepare_model`: `verify_device_map(model)` (an
      `hf_device_map` of more than one entry) in any distributed mode raises "You can't train a model that has
      been loaded with `device_map='auto'` in any distributed mode", unless `ACCELERATE_BYPASS_DEVICE_MAP=true`;
      a model with DTensor parameters raises "...incompatible with DDP. Maybe you loaded your model with
      `device_map='auto'`?".
    - transformers 5.24 `trainer.py::Trainer.__init__` treats a multi-device `hf_device_map` as model parallel
      and prepares the model through accelerate.
    - huggingface/accelerate#1802 (https://github.com/huggingface/accelerate/issues/1802): DDP fails with
      "device_ids and output_device arguments only work with single-device..."; the maintainer: "You need to
      remove `device_map="auto"` if you want to use DistributedDataParallel".
    - huggingface/accelerate#1167 (https://github.com/huggingface/accelerate/issues/1167): a device mismatch
      (`cuda:1 and cuda:7`) in training; "you cannot use data parallel in conjunction with model parallelism".
    - huggingface/autotrain-advanced#247 (https://github.com/huggingface/autotrain-advanced/issues/247): the
      Trainer under torchrun raises the accelerate error above.
    - No CPU proof: the harm needs several GPUs (the map is planned over visible GPUs; on CPU it is one device).
    """

    code = "LD314"
    name = "device-map-auto-multiprocess"
    severity = Severity.WARNING
    fix_kind = "unsafe"
    needs_several_processes = True
    triggers = (
        # not on a `>>>`/`...` line of a docstring nor in a comment: library docstrings show `device_map="auto"`
        Pattern(
            ("device_map",),
            re.compile(
                r"^(?![ \t]*(?:>>>|\.\.\.|#))[^\n]*device_map\w*\s*=\s*[\"'](?:auto|balanced|balanced_low_0|sequential)[\"']",
                re.MULTILINE,
            ),
        ),
    )
    also_triggers = (("from_pretrained",),)  # the only call the rule reads

    VALID = (
        Valid(
            """\
import os
import torch.distributed as dist
from transformers import AutoModelForCausalLM

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map={"": local_rank})
"""
        ),
        Valid(
            """\
import os
from transformers import AutoModelForCausalLM, Trainer

device_map = "auto"
if int(os.environ.get("WORLD_SIZE", 1)) > 1:
    device_map = {"": int(os.environ.get("LOCAL_RANK", 0))}
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map=device_map)
trainer = Trainer(model=model)
""",
            project={"run.sh": "torchrun --nproc_per_node 4 train.py\n"},
        ),
        Valid(
            """\
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("big-model", device_map="auto")
tokenizer = AutoTokenizer.from_pretrained("big-model")
print(tokenizer.decode(model.generate(**tokenizer("hi", return_tensors="pt").to(0))[0]))
"""
        ),
        Valid(
            """\
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("big-model", tp_plan="auto", device_map="auto")
""",
            project={"run.sh": "torchrun --nproc_per_node 4 infer.py\n"},
        ),
    )
    INVALID = (
        Invalid(
            """\
import os
import torch.distributed as dist
from transformers import AutoModelForCausalLM

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map="auto")
""",
            lines=(7,),
            unsafe_fixed="""\
import os
import torch.distributed as dist
from transformers import AutoModelForCausalLM

dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map={"": local_rank})
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

accelerator = Accelerator()
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map="auto")
model, optimizer = accelerator.prepare(model, optimizer)
""",
            lines=(5,),
            project={
                "default_config.yaml": "distributed_type: MULTI_GPU\nnum_processes: 4\n",
                "run.sh": "accelerate launch --config_file default_config.yaml train.py\n",
            },
            unsafe_fixed="""\
from accelerate import Accelerator
from transformers import AutoModelForCausalLM

accelerator = Accelerator()
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map={"": accelerator.local_process_index})
model, optimizer = accelerator.prepare(model, optimizer)
""",
        ),
        Invalid(
            """\
from transformers import AutoModelForSequenceClassification, Trainer

model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased", device_map="auto")
Trainer(model=model, args=training_args).train()
""",
            lines=(3,),
            project={"run.sh": "torchrun --nproc_per_node=8 train.py\n"},
        ),
        Invalid(
            """\
import os
from transformers import AutoModelForCausalLM, Trainer

several = int(os.environ.get("WORLD_SIZE", 1)) > 1
device_map = "auto"
if use_4bit:
    device_map = {"": int(os.environ["LOCAL_RANK"])} if several else "auto"
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map=device_map)
Trainer(model=model, args=training_args).train()
""",
            lines=(8,),
            project={"run.sh": "torchrun --nproc_per_node=4 train.py\n"},
        ),
        Invalid(
            """\
import os
from transformers import AutoModelForCausalLM, Trainer

device_map = "auto"
if use_4bit:
    device_map = {"": int(os.environ["LOCAL_RANK"])} if int(os.environ.get("WORLD_SIZE", 1)) > 1 else None
model = AutoModelForCausalLM.from_pretrained("gpt2", device_map=device_map)
Trainer(model=model, args=training_args).train()
""",
            lines=(7,),
        ),
    )

    def check_python(self) -> None:
        facts, text = self.facts, self.context.text or ""
        if self.context.is_test_module or any(word in text for word in DELIBERATE):
            return
        if any("CUDA_VISIBLE_DEVICES" in write.keys for write in environment_writes(facts)):
            return  # the script gives each process its own GPUs: "auto" plans over those
        several = self._several_processes()
        for call in facts.calls:
            if facts.method_name(call) != "from_pretrained" or not self._model_class(call):
                continue
            if any(a.keyword is not None and a.keyword.value in TENSOR_PARALLEL for a in call.args):
                continue
            value = argument_of(call, "device_map", None)
            spread, aware = self._spreading(value, call) if value is not None else (None, None)
            if spread is not None and (several or aware) is not None:
                self._report(value, spread, several or aware, text)

    def _several_processes(self) -> tuple[str, bool] | None:
        """Why the script runs several processes, in words, and whether that is certain (the launch says how many,
        or the script wraps a model for data parallelism); None when nothing says."""
        launch, facts = self.launch, self.facts
        if launch.several_processes:
            return f"the launch starts {launch.processes.value} processes: {launch.processes.where()}", True
        if facts.wrapped_models():
            return "the script wraps a model in DDP/FSDP", True
        for call in facts.calls:
            if facts.callee_is(call, INIT_PROCESS_GROUP | DEEPSPEED_INIT):
                return f"the script calls `{facts.method_name(call)}`, so a launcher starts several", False
        return None

    def _spreading(self, value: cst.BaseExpression, call: cst.Call) -> tuple[str | None, tuple[str, bool] | None]:
        """The planning string ``value`` may be (``"auto"``) under several processes, and why the script itself says
        that it runs in several (a per-process value chosen by a launch test elsewhere), or None. A value that gives each process
        its own device (``{"": local_rank}``, an index) means the author chose per launch: a planning string chosen
        under a test about the launch (``... if ddp else "auto"``) is then not reported, nor one that such a value
        replaces under launch tests alone (``if world_size > 1: device_map = {"": local_rank}``); one replaced only
        under another test (``if q_lora:``) still reaches the other runs of several processes."""
        facts = self.facts
        spreads, own = [], []
        for origin in facts.origins(value, call):
            node = origin.node
            text = string_value(node) if isinstance(node, cst.SimpleString) else None
            if text in SPREADING:
                spreads.append((node, text))
            elif not (isinstance(node, cst.Name) and node.value == "None"):
                own.append(node)

        def about_launch(tests: list[cst.BaseExpression]) -> bool:
            return any(mentions(facts, test, LAUNCH_TEST) for test in tests)

        if any(all(mentions(facts, t, LAUNCH_TEST) for t in branch_tests(facts, n)) for n in own):
            return None, None  # every launch of several processes takes the per-process value
        # a per-process value chosen when several processes run: the script is written for such launches
        chosen = next((n for n in own if about_launch(branch_tests(facts, n))), None)
        aware = (
            None
            if chosen is None
            else (f"the script picks a per-process map at {facts.where(chosen)} for such runs", False)
        )
        for node, text in spreads:
            if not (own and about_launch(branch_tests(facts, node))):
                return text, aware
        return None, None

    def _model_class(self, call: cst.Call) -> bool:
        """``call`` loads a transformers or PEFT model (not a tokenizer or config)."""
        func = call.func
        if not isinstance(func, cst.Attribute):
            return False
        owner = cst.Module([]).code_for_node(func.value).rsplit(".", 1)[-1]
        if NOT_MODELS.search(owner):
            return False
        names = self.facts.qualified_names(func)
        if any(name.startswith(LIBRARIES) for name in names):
            return True
        return not names and bool(MODEL_CLASS.match(owner))

    def _report(self, value: cst.BaseExpression, spread: str, several: tuple[str, bool], text: str) -> None:
        why, certain = several
        raised = "\"You can't train a model that has been loaded with `device_map='auto'` in any distributed mode\""
        if ".prepare(" in text:
            consequence = f"accelerate's `prepare` raises {raised}, after every process has loaded the weights"
        elif "Trainer(" in text:
            consequence = f"the `Trainer` prepares it with accelerate, which raises {raised}"
        elif self.facts.wrapped_models():
            consequence = (
                "`DistributedDataParallel` refuses a model spread over several devices when given `device_ids`, "
                "and without them every GPU holds a share of every process's copy"
            )
        else:
            consequence = "every GPU holds a share of every process's copy, and the work is done once per process"
        local = local_rank_in_scope(self.facts, value)
        fix = None
        if local is not None:
            new = cst.parse_expression(f'{{"": {local}}}')
            fix = Fix(
                Applicability.UNSAFE,
                f'Load one copy per process: `device_map={{"": {local}}}`',
                replacements=((value, new),),
            )
        self.report(
            value,
            f'`device_map="{spread}"` plans the model over every visible GPU, in each process ({why}): '
            f'{consequence}; give each process its own GPU (`device_map={{"": local_rank}}`), or use FSDP or '
            "DeepSpeed ZeRO-3 for a model too large for one GPU",
            severity=Severity.ERROR if certain else None,
            fix=fix,
        )
