"""LD408 generate-without-synced-gpus: `generate` on an FSDP or ZeRO-3 model with the ranks' decoding loops unsynced."""

from __future__ import annotations

import re
from collections.abc import Iterator

import libcst as cst

from lintdist.deepspeed_settings import deepspeed_engine, engine_by_api
from lintdist.edits import keyword_arg, with_arg_appended
from lintdist.literals import dict_key, is_name
from lintdist.model import Applicability, Fix, Severity
from lintdist.project import mentioned_in_project
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.sharding import gathered_for_generation, parameter_sharding
from lintdist.wrappers import is_wrapped, wrapper_kind

# What makes transformers' `is_deepspeed_zero3_enabled()` true: an `HfDeepSpeedConfig` kept alive (the Trainer's,
# accelerate's `DeepSpeedPlugin`'s, or the script's own).
ZERO3_DETECTED = ("HfDeepSpeedConfig", "HfTrainerDeepSpeedConfig", "DeepSpeedPlugin", "TrainingArguments")
# The same in any module of a project, with the objects that make one (a Trainer, an Accelerator)
ZERO3_DETECTED_IN_PROJECT = re.compile(
    r"HfDeepSpeedConfig|HfTrainerDeepSpeedConfig|DeepSpeedPlugin|TrainingArguments|\bTrainer\(|\bAccelerator\("
)
# Spellings of a sharding backend in a script (a library's modeling code says "fsdp" or "ZeRO" in passing).
# `synced_gpus=False`, `"synced_gpus": False`: the one setting of it the rule reports
EXPLICIT_FALSE = re.compile(r"synced_gpus[\"']?\s*[=:]\s*False")
SHARDING_NEEDS = ("FullyShardedDataParallel", "fully_shard", "fsdp=", "zero_stage", "DeepSpeedPlugin", '"stage":')
GENERATE = re.compile(r"generate\(")
# The first transformers that turn `synced_gpus` on by themselves (`GenerationMixin.generate` when it is left out):
# for ZeRO-3 4.28.0 (4.27.4 defaults to False), for an FSDP-managed module 4.46.0 (4.45.0 checks ZeRO-3 only).
AUTO_SYNC_SINCE = {"ZeRO-3": "4.28", "FSDP": "4.46"}
HANG = (
    "every forward all-gathers the sharded parameters, so a rank whose sequences end first (EOS, or a shorter "
    "`max_new_tokens`) leaves the decoding loop while the others wait in the next forward's all-gather, and the job "
    "hangs"
)


def is_wrapped_sharded(facts, expr: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """``expr`` (or the model it is the ``.module`` of) holds an FSDP1 model, or is sharded in place by
    ``fully_shard(expr)`` (FSDP2)."""
    if isinstance(expr, cst.Attribute) and expr.attr.value == "module":
        expr = expr.value
    if is_wrapped(facts, expr, at, "fsdp1") or is_wrapped(facts, expr, at, "fsdp2"):
        return True
    code = cst.Module([]).code_for_node(expr)
    return any(
        wrapper_kind(facts, call) == "fsdp2" and call.args and cst.Module([]).code_for_node(call.args[0].value) == code
        for call in facts.wrapped_models()
    )


class GenerateWithoutSyncedGpus(Rule):
    """
    ## What it does
    Reports `generate` run without synchronised decoding loops on a model
    whose parameters are sharded across ranks (FSDP, DeepSpeed ZeRO-3):
    an explicit `synced_gpus=False` passed to `generate` (or written into a
    `gen_kwargs` dict literal), and `generate` on the engine that a raw
    `deepspeed.initialize` returns (or its `.module`) with no `synced_gpus`,
    in a script that keeps no `HfDeepSpeedConfig` (nor a Trainer or
    accelerate `DeepSpeedPlugin`, which make one). It is an error where the
    launch settings or the script select FSDP (an FSDP plugin,
    `FullyShardedDataParallel`, `fully_shard`, `TrainingArguments(fsdp=...)`)
    or ZeRO stage 3 (a `DeepSpeedPlugin`, the launch's `zero_stage`, a
    config dict literal with `"zero_optimization": {"stage": 3}`), a
    warning when the script runs several processes and nothing says which
    backend, and nothing where the backend keeps whole parameters (DDP,
    ZeRO stage 0-2), nor inside TRL's `with unwrap_model_for_generation(...)`
    unless the project selects FSDP (under ZeRO-3 it gathers the whole
    parameters and removes DeepSpeed's hooks for the block, so the forward
    makes no collective; not with `gather_deepspeed3_params=False`).
    `generate` with `synced_gpus` left out on the sharded model (FSDP1,
    `fully_shard`, a prepared model) is reported where the project pins a
    transformers that does not turn it on by itself: older than 4.46 for
    FSDP, older than 4.28 for ZeRO-3 (the project's requirements,
    `pyproject.toml`, `setup.py` or environment file). Otherwise
    `generate` with `synced_gpus` left out on an FSDP
    model, under the Trainer or accelerate's DeepSpeed plugin is not
    reported: transformers 5.x turns it on itself there; nor is a
    `generate` that cannot stop early (`min_new_tokens` written as its
    `max_new_tokens`, or `min_length` as its `max_length`): every rank runs
    as many forwards. An engine that
    `deepspeed.initialize` builds in another module and hands over through
    an attribute or a parameter (`self.actor = engine_owner.actor`) is
    known by its API (`backward(loss)`, `step()` and `.module` on it):
    `<engine>.module.generate` without `synced_gpus` is a warning there,
    its ZeRO stage being out of sight, unless a module of the project (a
    file under its import root) names `HfDeepSpeedConfig`, a `Trainer`,
    `TrainingArguments`, an `Accelerator` or a `DeepSpeedPlugin` (lintdist
    does not tell whether such a config outlives the call that made it).

    ## Why is this bad?
    Under FSDP and ZeRO-3 each forward all-gathers the parameters, a
    collective every rank must join. `generate` runs one forward per new
    token and stops when this rank's sequences are done. Without
    `synced_gpus` a rank that finishes first leaves the loop; the others
    wait in their next forward's all-gather for it, and the job hangs until
    the process group's timeout. With `synced_gpus=True` every rank
    all-reduces a done-flag each step and a finished rank keeps running
    dummy forwards until all are done. transformers decides it itself only
    when `synced_gpus` is left out and it can see ZeRO-3 (a live
    `HfDeepSpeedConfig`) or an FSDP-managed module: an explicit `False`
    always wins, and a raw `deepspeed.initialize` is invisible to it.

    ## Example
    ```python
    model = FSDP(model, auto_wrap_policy=policy)
    outputs = model.generate(input_ids, max_new_tokens=64, synced_gpus=False)
    ```

    ## Use instead
    ```python
    model = FSDP(model, auto_wrap_policy=policy)
    outputs = model.generate(input_ids, max_new_tokens=64, synced_gpus=True)
    ```

    ## Fix safety
    `synced_gpus=False` becomes `synced_gpus=True`, and `synced_gpus=True`
    is added to a raw DeepSpeed engine's `generate`. Safe where the project
    selects FSDP or ZeRO-3: a process group then exists, and the only change
    is that finished ranks run extra forwards (what transformers does by
    default for the models it detects). Unsafe where the backend is unknown
    or the engine's ZeRO stage cannot be read: in a one-process run without
    a process group `synced_gpus=True` fails in `dist.all_reduce`, and under
    DDP or ZeRO-1/2 it only costs extra forwards.

    ## References
    - transformers 5.24 `transformers/generation/utils.py::GenerationMixin._extract_generation_mode_kwargs`
      (`(is_deepspeed_zero3_enabled() or is_fsdp_managed_module(self)) and world_size > 1 if synced_gpus is None
      else synced_gpus`) and `::_has_unfinished_sequences` (the done-flag `all_reduce`; without it a finished rank
      leaves the loop)
    - transformers 4.27.4 `generation/utils.py::GenerationMixin.generate` (`synced_gpus: Optional[bool] = False`),
      4.28.0 (`if synced_gpus is None: if is_deepspeed_zero3_enabled() and dist.get_world_size() > 1`), 4.45.0
      (ZeRO-3 only) and 4.46.0 (`is_deepspeed_zero3_enabled() or is_fsdp_managed_module(self)`)
    - transformers 5.24 `transformers/integrations/deepspeed.py::is_deepspeed_zero3_enabled` (true only while an
      `HfDeepSpeedConfig` is alive) and `transformers/distributed/fsdp.py::is_fsdp_managed_module`
    - https://github.com/huggingface/transformers/issues/18281: T5 `generate` under ZeRO-3 never finishes; the
      maintainer: "you must use `generate(..., synced_gpus=True)`"
    - https://github.com/deepspeedai/DeepSpeedExamples/pull/636: DS-Chat step 3 hung under ZeRO-3 (raw
      `deepspeed.initialize` in `rlhf_engine.py`, `generate` on `self.actor_model.module` in `ppo_trainer.py`,
      the `HfDeepSpeedConfig` a local that dies on return); fixed with `synced_gpus=True`
    - https://github.com/huggingface/transformers/issues/30228 and
      https://github.com/huggingface/transformers/pull/33483: FSDP `generate` deadlocks when ranks produce
      different lengths; the PR defaults `synced_gpus` to True for FSDP
    - https://github.com/deepspeedai/DeepSpeed/issues/8262: a ZeRO-3 rollout deadlocks when ranks stop
      `module.generate()` at different EOS positions
    - Proof: tests/proofs/test_ld408_generate_unsynced.py (gloo, 2 ranks): a tiny model sharded with FSDP2
      `fully_shard`, decoding with transformers' loop (`_has_unfinished_sequences`) to 3 and 6 tokens per rank,
      hangs with `synced_gpus=False` and finishes after the fix (`synced_gpus=True`), both ranks running 6 forwards
    """

    code = "LD408"
    name = "generate-without-synced-gpus"
    severity = Severity.ERROR
    needs_several_processes = True
    fix_kind = "safe"
    # an explicit setting, a raw engine, or a generate in a script that names a sharding backend (an old pin)
    triggers = (
        Pattern(("synced_gpus",), EXPLICIT_FALSE),
        "deepspeed.initialize",
        Pattern(SHARDING_NEEDS, GENERATE),
        Pattern((".module.generate(",), re.compile(r"\.backward\(")),  # an engine made in another module
    )

    VALID = (
        Valid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model)
outputs = model.generate(input_ids, max_new_tokens=64)
"""
        ),
        Valid(
            """\
import deepspeed

ds_config = {"train_batch_size": 16, "zero_optimization": {"stage": 2}}
engine, *_ = deepspeed.initialize(model=model, config=ds_config)
outputs = engine.module.generate(input_ids, synced_gpus=False)
"""
        ),
        Valid(
            """\
import deepspeed
from transformers.integrations import HfDeepSpeedConfig

ds_config = {"zero_optimization": {"stage": 3}}
dschf = HfDeepSpeedConfig(ds_config)  # keeps ZeRO-3 visible to transformers
engine, *_ = deepspeed.initialize(model=model, config=ds_config)
outputs = engine.module.generate(input_ids)
"""
        ),
        Valid("outputs = model.generate(input_ids, synced_gpus=False)\n"),
        Valid(
            """\
import deepspeed

ds_config = {"train_batch_size": 16, "zero_optimization": {"stage": 3}}
engine, *_ = deepspeed.initialize(model=model, config=ds_config)
outputs = engine.module.generate(input_ids, min_new_tokens=32, max_new_tokens=32)
"""
        ),
        Valid(
            """\
class Rollout:
    def __init__(self, engines):
        self.policy = engines.policy

    def sample(self, prompts):
        return self.policy.module.generate(prompts, max_new_tokens=64)

    def learn(self, loss):
        self.policy.backward(loss)
        self.policy.step()
""",
            project={
                "engines.py": "from transformers.integrations import HfDeepSpeedConfig\nkept = HfDeepSpeedConfig(cfg)\n"
            },
        ),
        Valid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model, use_orig_params=True)
samples = model.generate(prompt_ids, do_sample=True, max_length=256)
""",
            project={"requirements.txt": "transformers>=4.46\n"},
        ),
    )
    INVALID = (
        Invalid(
            """\
class Rollout:
    def __init__(self, engines):
        self.policy = engines.policy

    def sample(self, prompts):
        return self.policy.module.generate(prompts, max_new_tokens=64)

    def learn(self, loss):
        self.policy.backward(loss)
        self.policy.step()
""",
            lines=(6,),
            unsafe_fixed="""\
class Rollout:
    def __init__(self, engines):
        self.policy = engines.policy

    def sample(self, prompts):
        return self.policy.module.generate(prompts, max_new_tokens=64, synced_gpus=True)

    def learn(self, loss):
        self.policy.backward(loss)
        self.policy.step()
""",
        ),
        Invalid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model, use_orig_params=True)
with FSDP.summon_full_params(model, writeback=False, recurse=False):
    samples = model.generate(prompt_ids, do_sample=True, max_length=256)
""",
            lines=(5,),
            fixed="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model, use_orig_params=True)
with FSDP.summon_full_params(model, writeback=False, recurse=False):
    samples = model.generate(prompt_ids, do_sample=True, max_length=256, synced_gpus=True)
""",
            project={"requirements.txt": "torch==2.1.0\ntransformers==4.29.2\n"},
        ),
        Invalid(
            """\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model)
outputs = model.generate(input_ids, max_new_tokens=64, synced_gpus=False)
""",
            lines=(4,),
            fixed="""\
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

model = FSDP(model)
outputs = model.generate(input_ids, max_new_tokens=64, synced_gpus=True)
""",
        ),
        Invalid(
            """\
import deepspeed

ds_config = {"train_batch_size": 16, "zero_optimization": {"stage": 3}}
engine, *_ = deepspeed.initialize(model=model, config=ds_config)
outputs = engine.module.generate(input_ids, max_new_tokens=64)
""",
            lines=(5,),
            fixed="""\
import deepspeed

ds_config = {"train_batch_size": 16, "zero_optimization": {"stage": 3}}
engine, *_ = deepspeed.initialize(model=model, config=ds_config)
outputs = engine.module.generate(input_ids, max_new_tokens=64, synced_gpus=True)
""",
        ),
        Invalid(
            """\
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
gen_kwargs = {"max_new_tokens": 64, "synced_gpus": False}
outputs = accelerator.unwrap_model(model).generate(input_ids, **gen_kwargs)
""",
            lines=(5,),
            unsafe_fixed="""\
from accelerate import Accelerator

accelerator = Accelerator()
model = accelerator.prepare(model)
gen_kwargs = {"max_new_tokens": 64, "synced_gpus": True}
outputs = accelerator.unwrap_model(model).generate(input_ids, **gen_kwargs)
""",
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        sharded, evidence = parameter_sharding(facts, self.settings)
        if sharded is False:
            return
        text = self.context.text
        unseen = not any(word in text for word in ZERO3_DETECTED)  # nothing here keeps ZeRO-3 visible
        if unseen and ".module.generate(" in text:
            self._engines_from_elsewhere()  # such an engine stands for a `deepspeed.initialize` run
        if sharded is None and not self.loop.distributed:
            return
        zero3_gathered = sharded is not True or "DeepSpeed" in evidence
        for call in facts.calls:
            if zero3_gathered and gathered_for_generation(facts, call):
                continue  # the parameters are whole and DeepSpeed's hooks removed: the forward makes no collective
            if facts.method_name(call) in {"generate", "dict"}:
                for arg in call.args:
                    if arg.keyword is not None and arg.keyword.value == "synced_gpus" and is_name(arg.value, "False"):
                        self._report(arg.value, "`synced_gpus=False`", sharded, evidence)
        for element in facts.index.nodes(cst.DictElement):
            if dict_key(element) == "synced_gpus" and is_name(element.value, "False"):
                self._report(element.value, '`"synced_gpus": False`', sharded, evidence)
        if unseen and "deepspeed.initialize" in text:
            self._raw_engines(sharded, evidence)
        elif sharded:
            self._before_auto_sync(evidence)

    def _before_auto_sync(self, evidence: str) -> None:
        """``generate`` with ``synced_gpus`` left out on the project's sharded model, where the project pins a
        transformers that does not turn it on by itself for that backend."""
        facts, backend = self.facts, "ZeRO-3" if "DeepSpeed" in evidence else "FSDP"
        since = AUTO_SYNC_SINCE[backend]
        if self.versions.allows("transformers", f">={since}") is not False:
            return  # a recent (or unknown) transformers decides by itself
        for call, model in self._generate_unset():
            if backend == "ZeRO-3" and gathered_for_generation(facts, call):
                continue
            if not (self.loop.prepared_model(model, call) or is_wrapped_sharded(facts, model, call)):
                continue
            message = (
                f"`generate` without `synced_gpus` on a sharded model ({evidence}), and the project pins a "
                f"transformers older than {since}, which leaves it off for {backend}: {HANG}; pass `synced_gpus=True`"
            )
            self.report(call, message, fix=_pass_synced(call, Applicability.SAFE))

    def _raw_engines(self, sharded: bool | None, evidence: str) -> None:
        """``generate`` on a raw ``deepspeed.initialize`` engine, with ``synced_gpus`` left to transformers, which
        cannot see ZeRO-3 without an ``HfDeepSpeedConfig``."""
        for call, model in self._generate_unset():
            if not deepspeed_engine(self.facts, model, call):
                continue
            where = evidence if sharded else "if the engine runs ZeRO stage 3 (its config is not in sight)"
            message = (
                f"`generate` on a `deepspeed.initialize` engine without `synced_gpus` ({where}): transformers turns "
                "it on only while an `HfDeepSpeedConfig` is alive, and none is here; under ZeRO-3 "
                f"{HANG}; pass `synced_gpus=True`"
            )
            fix = _pass_synced(call, Applicability.SAFE if sharded else Applicability.UNSAFE)
            self.report(call, message, severity=None if sharded else Severity.WARNING, fix=fix)

    def _engines_from_elsewhere(self) -> None:
        """``generate`` on an engine made in another module (known by its API), where no module of the project
        keeps ZeRO-3 visible to transformers; its ZeRO stage is not in sight, so a warning."""
        facts, project = self.facts, self.facts.project
        searched = False
        for call, model in self._generate_unset():
            used = engine_by_api(facts, model, call)
            if used is None or gathered_for_generation(facts, call):
                continue
            if project is not None and not searched:  # the project is read once, for the first such call
                if mentioned_in_project(project, ZERO3_DETECTED_IN_PROJECT) is not False:
                    return  # a module keeps one (or makes a Trainer or Accelerator that does), or too many to read
                searched = True
            message = (
                f"`generate` without `synced_gpus` on a DeepSpeed engine made in another module ({used}): it "
                "hangs under ZeRO-3, where transformers turns `synced_gpus` on only while an `HfDeepSpeedConfig` "
                f"is alive, and no module of this project keeps one; {HANG}; pass `synced_gpus=True` if the engine "
                "may run ZeRO stage 3"
            )
            self.report(call, message, severity=Severity.WARNING, fix=_pass_synced(call, Applicability.UNSAFE))

    def _generate_unset(self) -> Iterator[tuple[cst.Call, cst.BaseExpression]]:
        """Each ``<model>.generate(...)`` call that leaves ``synced_gpus`` to transformers (no such keyword, no
        ``*args``/``**kwargs`` that may carry it) and may stop early (not ``min_length`` equal to ``max_length``,
        nor ``min_new_tokens`` to ``max_new_tokens``), with the model it runs."""
        for call in self.facts.calls:
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "generate"):
                continue
            if any(arg.star or (arg.keyword is not None and arg.keyword.value == "synced_gpus") for arg in call.args):
                continue
            given = {a.keyword.value: cst.Module([]).code_for_node(a.value) for a in call.args if a.keyword}
            if any(given.get(f"min_{n}", 0) == given.get(f"max_{n}") for n in ("length", "new_tokens")):
                continue  # EOS cannot stop a rank before the others: every rank runs as many forwards
            yield call, func.value

    def _report(self, value: cst.Name, spelled: str, sharded: bool | None, evidence: str) -> None:
        if sharded:
            message = f"{spelled} on a sharded model ({evidence}): {HANG}; pass `synced_gpus=True`"
        else:
            message = (
                f"{spelled} in a multi-process script: it hangs under DeepSpeed ZeRO-3 or FSDP, where {HANG}; pass "
                "`synced_gpus=True` if the model may be sharded (nothing here says which backend runs)"
            )
        fix = Fix(
            Applicability.SAFE if sharded else Applicability.UNSAFE,
            "Pass synced_gpus=True",
            replacements=((value, value.with_changes(value="True")),),
        )
        self.report(value, message, severity=None if sharded else Severity.WARNING, fix=fix)


def _pass_synced(call: cst.Call, applicability: Applicability) -> Fix:
    """``synced_gpus=True`` appended to a ``generate`` call that leaves it out."""
    appended = with_arg_appended(call, keyword_arg("synced_gpus", cst.Name("True")))
    return Fix(applicability, "Pass synced_gpus=True", replacements=((call, appended),))
