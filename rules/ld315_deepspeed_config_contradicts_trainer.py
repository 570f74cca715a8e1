"""LD315 deepspeed-config-contradicts-trainer: a DeepSpeed config whose values the Trainer's arguments contradict."""

from __future__ import annotations

import libcst as cst

from lintdist.arguments import command_line_default, holds_parsed_arguments
from lintdist.backends import TRAINING_ARGUMENTS
from lintdist.deepspeed_files import ABSENT, named_deepspeed_config, top_value
from lintdist.facts import argument_of, string_value
from lintdist.launch import resolve_launch_path
from lintdist.literals import dict_key, readable_mapping
from lintdist.model import Severity, Span
from lintdist.rule import Invalid, Rule, Valid
from lintdist.script_arguments import script_flags
from lintdist.sources import launch_text, line_col
from lintdist.value_uses import assigned_reads
from lintdist.values import known_value, number_literal, python_value, string_of

# DeepSpeed key -> the TrainingArguments field `trainer_config_process` matches it with, and that field's default
MATCHED = {
    "train_micro_batch_size_per_gpu": ("per_device_train_batch_size", 8),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", 1),
    "gradient_clipping": ("max_grad_norm", 1.0),
}
UNKNOWN = object()


class DeepSpeedConfigContradictsTrainer(Rule):
    """
    ## What it does
    Reads the DeepSpeed config a transformers `TrainingArguments` runs with
    (`TrainingArguments(deepspeed="ds_config.json")` or a dict literal in
    the script, the `default=` of the script's own option when it passes
    `deepspeed=args.deepspeed` from `argparse`, or `--deepspeed
    ds_config.json` on a launch line of a script that uses
    `TrainingArguments`) and compares it with the arguments:

    - the config has no `gradient_clipping` key while `max_grad_norm` is
      above 0 (its default is 1.0): reported as a warning, because nothing
      says so at run time;
    - `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps` or
      `gradient_clipping` is a number that differs from
      `per_device_train_batch_size`, `gradient_accumulation_steps` or
      `max_grad_norm` (given, or their defaults 8, 1 and 1.0): reported as
      info, since transformers raises at start-up anyway; the finding says
      so before the job is queued and the model loaded.

    Values that are `"auto"`, arguments lintdist cannot read (a variable, an
    `argparse` value without a literal default, `**kwargs`), `auto_find_batch_size=True` (the batch
    size is not matched then), a config path it cannot find and a launch line
    whose script it cannot see are not compared. On a launch line, a field
    the flags leave out takes its `TrainingArguments` default only when the
    script reads its options with `HfArgumentParser` and never names the
    field itself (a subclass may give it another default). Arguments bound
    to a name that nothing reads but an `assert` are not compared: no
    Trainer runs with them (a test that only starts DeepSpeed). `train_batch_size`, the
    optimizer, scheduler and precision keys are not checked here.

    ## Why is this bad?
    transformers (`HfTrainerDeepSpeedConfig.fill_match`) fills the keys set
    to `"auto"` from the arguments and records a mismatch for explicit
    values that differ, but a key the config leaves out is never filled or
    compared. Under DeepSpeed the Trainer leaves clipping to the engine
    (accelerate's `clip_grad_norm_` only reads the engine's norm back), and
    DeepSpeed's default `gradient_clipping` is 0.0: a config without the key
    trains unclipped while `max_grad_norm=1.0` says otherwise, and the
    logged `grad_norm` looks normal.

    An explicit contradiction stops the run with `ValueError: Please correct
    the following DeepSpeed config values that mismatch TrainingArguments`,
    raised by `trainer_config_finalize` inside `trainer.train()`: after the
    job waited in the queue and every rank loaded the model.

    ## Example
    ```json
    {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    ```
    ```python
    args = TrainingArguments("out", per_device_train_batch_size=8, deepspeed="ds_config.json")
    ```

    ## Use instead
    ```json
    {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
     "gradient_clipping": "auto", "zero_optimization": {"stage": 2}}
    ```

    ## Fix safety
    No fix. The values live in another file (the JSON), which the fix of a
    script or launch line does not edit, and which side is right is the
    author's call: `"auto"` makes the Trainer's value win, which for
    `gradient_clipping` turns clipping on where the run trained without it.

    ## References
    - transformers 5.24 `integrations/deepspeed.py::HfTrainerDeepSpeedConfig.fill_match`
      (a missing key returns early: `ds_val is not None and ds_val != hf_val`),
      `trainer_config_process` (the keys matched) and `trainer_config_finalize`
      (raises the mismatch `ValueError`, called from `deepspeed_init` in `Trainer.train`)
    - transformers 5.24 `training_args.py` (`per_device_train_batch_size=8`,
      `gradient_accumulation_steps=1`, `max_grad_norm=1.0`; `__post_init__`
      runs `trainer_config_process`)
    - accelerate 1.15 `accelerator.py::Accelerator.clip_grad_norm_` (DEEPSPEED:
      "DeepSpeed handles gradient clipping internally", returns the norm only)
      and `utils/dataclasses.py::DeepSpeedPlugin.fill_match`/`deepspeed_config_process`
      (fill `"auto"` only, walking the keys the config has: `_prepare_deepspeed`'s
      `gradient_clipping: 1.0` never reaches a config without the key)
    - DeepSpeed `runtime/constants.py` (`GRADIENT_CLIPPING_DEFAULT = 0.`; not pinned)
    - axolotl-ai-cloud/axolotl issue #1381: `max_grad_norm` ignored under DeepSpeed;
      adding `"gradient_clipping": "auto"` to the JSON fixed it
    - deepspeedai/DeepSpeed issue #6743: `max_grad_norm` has no effect with the Trainer
    - mlcommons/training issue #723: llama2_70b_lora's `max_grad_norm` had no effect
      (`clip_grad` 0 in the ZeRO-3 config)
    - huggingface/transformers issue #27830: `ds train_micro_batch_size_per_gpu=1 vs
      hf per_device_train_batch_size=8` raised at `train()`
    - Proof: none on gloo: DeepSpeed is not installable here; the silence is
      read from the sources above
    """

    code = "LD315"
    name = "deepspeed-config-contradicts-trainer"
    severity = Severity.WARNING
    kinds = frozenset({"python", "launch"})
    triggers = ("--deepspeed",)
    python_triggers = ("deepspeed=",)

    VALID = (
        Valid(
            """\
from transformers import TrainingArguments

args = TrainingArguments("out", per_device_train_batch_size=4, deepspeed="ds_config.json")
""",
            project={
                "ds_config.json": '{"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",\n'
                ' "zero_optimization": {"stage": 2}}\n'
            },
        ),
        Valid(
            """\
from transformers import TrainingArguments

args = TrainingArguments("out", max_grad_norm=0.0, deepspeed={"zero_optimization": {"stage": 3}})
"""
        ),
        Valid(
            """\
import torch.distributed as dist
from transformers import AutoModel, TrainingArguments

dist.init_process_group("nccl")
settings = TrainingArguments("out", deepspeed={"zero_optimization": {"stage": 3}})
model = AutoModel.from_pretrained("gpt2")
assert settings is not None and model is not None
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from transformers import Trainer, TrainingArguments

args = TrainingArguments("out", deepspeed="ds_config.json")
Trainer(model=model, args=args, train_dataset=train_set).train()
""",
            lines=(3,),
            project={
                "ds_config.json": '{\n  "zero_optimization": {"stage": 2},\n  "train_micro_batch_size_per_gpu": 8\n}\n'
            },
        ),
        Invalid(
            """\
from transformers import Trainer, TrainingArguments

ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "zero_optimization": {"stage": 2}}
args = TrainingArguments("out", per_device_train_batch_size=16, deepspeed=ds_config)
Trainer(model=model, args=args, train_dataset=train_set).train()
""",
            lines=(4,),
        ),
    )

    def check_python(self) -> None:
        facts = self.facts
        for call in facts.calls:
            if not facts.callee_is(call, TRAINING_ARGUMENTS):
                continue
            given = argument_of(call, "deepspeed", None)
            if given is None or self._never_used(call):
                continue
            config = self._python_config(given, call)
            if config is None:
                continue
            name, values = config
            if any(a.star for a in call.args):
                hf = {field: UNKNOWN for field, _ in MATCHED.values()}
            else:
                hf = {
                    field: self._number(argument_of(call, field, None), default, call)
                    for field, default in MATCHED.values()
                }
            auto_batch = argument_of(call, "auto_find_batch_size", None)
            if auto_batch is not None and not (isinstance(auto_batch, cst.Name) and auto_batch.value == "False"):
                hf["per_device_train_batch_size"] = UNKNOWN
            for message, severity in self._contradictions(
                name, values, hf, {f: argument_of(call, f, None) is None for f in hf}
            ):
                self.report(given, message, severity=severity)

    def _never_used(self, call: cst.Call) -> bool:
        """The arguments are bound to a name that nothing reads but ``assert`` statements: no Trainer gets them (a
        test that only builds them to see DeepSpeed start)."""
        reads = assigned_reads(self.facts, call)
        return reads is not None and all(
            any(isinstance(a, cst.Assert) for a in self.facts.ancestors(read)) for read in reads
        )

    def check_launch(self, launch) -> None:
        text = launch_text(self.context.text, self.context.path)
        for command in launch.commands:
            flags = script_flags(command, text)
            flag = flags.get("deepspeed")
            script = self._trainer_script(command) if flag is not None and flag.value is not None else None
            if script is None:
                continue
            reads, source = script
            found = named_deepspeed_config(flag.value, self.context.path)
            if found is None:
                continue
            # a field the script names itself may have another default there (a subclass, its own parser)
            hf = {
                field: self._flag_number(
                    flags.get(field), default if reads == "parser" and field not in source else UNKNOWN
                )
                for field, default in MATCHED.values()
            }
            if "auto_find_batch_size" in flags:
                hf["per_device_train_batch_size"] = UNKNOWN
            values = {key: top_value(found[1], key) for key in MATCHED}
            end = flag.value_token.end if flag.value_token is not None else flag.token.end
            span = Span(*line_col(text, flag.token.start), *line_col(text, end))
            for message, severity in self._contradictions(
                f"`{flag.value}`", values, hf, {f: f not in flags for f in hf}
            ):
                self.report(None, message, severity=severity, span=span)

    def _python_config(self, given: cst.BaseExpression, call: cst.Call) -> tuple[str, dict[str, object]] | None:
        """The config's name as a message shows it and the values it gives the matched keys."""
        path, shown = string_of(self.facts, given, call), None
        if path is None and (default := self._option_default(given, call)) is not None:
            name = f"{given.value.value}.{given.attr.value}"
            path, shown = default, f"`{default}` (the command-line default of `{name}`)"
        if path is not None:
            found = named_deepspeed_config(path, self.context.path)
            values = None if found is None else {key: top_value(found[1], key) for key in MATCHED}
            return None if values is None else (shown or f"`{path}`", values)
        mapping = known_value(self.facts, given)
        if not isinstance(mapping, cst.Dict) or not readable_mapping(mapping):
            return None
        entries = {dict_key(e): e.value for e in mapping.elements if isinstance(e, cst.DictElement)}
        values = {key: ABSENT if key not in entries else _literal(entries[key]) for key in MATCHED}
        return "the DeepSpeed config dict", values

    def _option_default(self, given: cst.BaseExpression, call: cst.Call) -> str | None:
        """``deepspeed=args.deepspeed`` where ``args`` holds the script's parsed options: the path the script's
        ``add_argument("--deepspeed", default=...)`` gives when the launch passes none; None otherwise."""
        if not (isinstance(given, cst.Attribute) and isinstance(given.value, cst.Name)):
            return None
        if not holds_parsed_arguments(self.facts, given.value.value, call):
            return None
        return string_value(command_line_default(self.facts, given))

    def _number(self, expr: cst.BaseExpression | None, default: object, at: cst.CSTNode) -> object:
        if expr is None:
            return default
        written = number_literal(self.facts, expr, at)
        return UNKNOWN if written is None else float(written)

    def _flag_number(self, flag, default: object) -> object:
        if flag is None:
            return default
        try:
            return float(flag.value)
        except (TypeError, ValueError):
            return UNKNOWN

    def _trainer_script(self, command) -> tuple[str, str] | None:
        """How the launched script reads its options, when it is in sight and uses ``TrainingArguments``, and its
        text: "parser" (``HfArgumentParser``: a flag left out keeps the field's default), "own" (its own parser:
        only the flags on the line are known); None otherwise."""
        if command.script is None:
            return None
        script = resolve_launch_path(command.script.text, self.context.path)
        try:
            text = script.read_text(encoding="utf-8", errors="replace") if script.is_file() else ""
        except OSError:
            return None
        if "TrainingArguments" not in text:
            return None
        return "parser" if "HfArgumentParser" in text else "own", text

    def _contradictions(self, name: str, ds: dict[str, object], hf: dict[str, object], defaulted: dict[str, bool]):
        """(message, severity) for each DeepSpeed value the arguments contradict, and for a clipping left out."""
        for key, (field, _) in MATCHED.items():
            ds_value, hf_value = ds[key], hf[field]
            if hf_value is UNKNOWN:
                continue
            said = f"`{field}` is {_shown(hf_value)}" + (" (its default)" if defaulted[field] else "")
            if key == "gradient_clipping" and ds_value is ABSENT and hf_value > 0:
                yield (
                    f"{name} has no `gradient_clipping`, so DeepSpeed does not clip gradients (its default is 0.0) "
                    f"although {said}: transformers fills and compares only the keys the config writes, and the "
                    'Trainer leaves clipping to DeepSpeed; add `"gradient_clipping": "auto"`',
                    Severity.WARNING,
                )
            elif isinstance(ds_value, (int, float)) and not isinstance(ds_value, bool) and ds_value != hf_value:
                yield (
                    f"`{key}` is {_shown(ds_value)} in {name} but {said}: transformers raises `ValueError` (DeepSpeed "
                    "config values that mismatch TrainingArguments) in `trainer.train()`, after the model is loaded; "
                    f'set it to "auto" or make the two agree',
                    Severity.INFO,
                )


def _literal(expr: cst.BaseExpression) -> object:
    """A dict entry's number or string, UNKNOWN for anything else."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return float(expr.value)
    value = python_value(expr)
    return value if isinstance(value, str) else UNKNOWN


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
