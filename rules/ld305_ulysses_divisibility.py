"""LD305 ulysses-divisibility: head counts or a fixed sequence length that DeepSpeed Ulysses cannot split."""

from __future__ import annotations

import libcst as cst

from lintdist.facts import argument_of, string_key, string_value
from lintdist.loop import integer_literal, string_literal
from lintdist.model import Severity
from lintdist.parallelism import PARALLELISM_CONFIGS, parallelism_size
from lintdist.rule import Invalid, Rule, Valid

SP_CONFIGS = frozenset(
    {"accelerate.utils.DeepSpeedSequenceParallelConfig", "accelerate.utils.dataclasses.DeepSpeedSequenceParallelConfig"}
)
HEADS = "num_attention_heads"
KV_HEADS = "num_key_value_heads"
HEAD_KEYS = (HEADS, KV_HEADS)


class UlyssesDivisibility(Rule):
    """
    ## What it does
    Reports, where DeepSpeed sequence parallelism is on with a literal size
    (`ParallelismConfig(sp_size=k)` with `k > 1`, or
    `parallelism_config_sp_size` in the accelerate config or launch flags),
    the head counts and sequence length written in the script that DeepSpeed
    Ulysses will refuse: a `num_attention_heads` not divisible by `k`, a
    `num_key_value_heads` such that neither it divides `k` nor `k` divides it,
    and a `DeepSpeedSequenceParallelConfig(sp_seq_length=n,
    sp_seq_length_is_variable=False)` with `n` not divisible by `k`. Head
    counts are read from config keywords (`LlamaConfig(num_attention_heads=12)`,
    `AutoConfig.from_pretrained(name, num_key_value_heads=2)`), dictionary
    entries and attribute assignments (`config.num_attention_heads = 12`).
    Nothing is reported when a size or a count is not a literal.

    ## Why is this bad?
    Ulysses gives each rank `heads / k` attention heads after its all-to-all,
    so `UlyssesSPAttentionHF.register_with_transformers` raises `ValueError`
    for these values, inside `accelerator.prepare`, after the model has been
    loaded. The check costs a failed launch rather than wrong results, hence
    an info.

    ## Example
    ```python
    config = AutoConfig.from_pretrained("my-org/base", num_attention_heads=12, num_key_value_heads=4)
    accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=8))
    ```

    ## Use instead
    ```python
    config = AutoConfig.from_pretrained("my-org/base", num_attention_heads=12, num_key_value_heads=4)
    accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=4))
    ```

    ## Fix safety
    No fix: the sequence-parallel size is chosen with the number of GPUs, and
    the head counts with the model.

    ## References
    - DeepSpeed `runtime/sequence_parallel/ulysses_sp.py::UlyssesSPAttentionHF.register_with_transformers` and
      `UlyssesSPAttentionHF.__init__` (the three `ValueError`s)
    - accelerate `Accelerator._prepare_deepspeed` (calls it with `sp_size`, `sp_seq_length` and
      `sp_seq_length_is_variable` from `DeepSpeedSequenceParallelConfig`)
    """

    code = "LD305"
    name = "ulysses-divisibility"
    severity = Severity.INFO
    fix_kind = "none"
    triggers = ("num_attention_heads", "num_key_value_heads", "sp_seq_length")
    # head counts are everywhere in model code; a script that turns SP on builds an Accelerator or a config
    also_triggers = (("Accelerator", "ParallelismConfig", "sp_size"),)

    VALID = (
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig
from transformers import AutoConfig

config = AutoConfig.from_pretrained("base", num_attention_heads=32, num_key_value_heads=8)
accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_backend="deepspeed", sp_size=4))
"""
        ),
        Valid(
            """\
from accelerate import Accelerator, ParallelismConfig
from transformers import AutoConfig

config = AutoConfig.from_pretrained("base", num_attention_heads=32, num_key_value_heads=2)
accelerator = Accelerator(parallelism_config=ParallelismConfig(sp_size=args.sp_size))
"""
        ),
    )
    INVALID = (
        Invalid(
            """\
from accelerate import Accelerator
from accelerate.utils import DeepSpeedSequenceParallelConfig, ParallelismConfig
from transformers import LlamaConfig

config = LlamaConfig(hidden_size=1536, num_attention_heads=12, num_key_value_heads=3)
parallelism = ParallelismConfig(
    sp_backend="deepspeed",
    sp_size=8,
    sp_handler=DeepSpeedSequenceParallelConfig(sp_seq_length=1500, sp_seq_length_is_variable=False),
)
accelerator = Accelerator(parallelism_config=parallelism)
""",
            lines=(5, 5, 9),
        ),
    )

    def finish(self) -> None:
        facts = self.facts
        if any(self._other_backend(call) for call in facts.calls if facts.callee_is(call, PARALLELISM_CONFIGS)):
            return
        size = parallelism_size(facts, self.context.settings, lambda n: self.context.span(n).line, "sp")
        if size is None or size.value is None or size.value <= 1:
            return
        sp = size.value
        for key, value, node in self._head_counts():
            if key == HEADS and value % sp != 0:
                self.report(
                    node,
                    f"{HEADS}={value} is not divisible by the sequence-parallel size {sp} ({size.where}): DeepSpeed "
                    "Ulysses splits the heads over the SP ranks and raises ValueError in `accelerator.prepare`",
                )
            elif key == KV_HEADS and value > 0 and not (value % sp == 0 or sp % value == 0):
                self.report(
                    node,
                    f"{KV_HEADS}={value} and the sequence-parallel size {sp} ({size.where}) do not divide one "
                    "another: DeepSpeed Ulysses can neither split nor replicate the KV heads and raises ValueError in "
                    "`accelerator.prepare`",
                )
        for call in facts.calls:
            if not facts.callee_is(call, SP_CONFIGS):
                continue
            length = argument_of(call, "sp_seq_length", 0)
            variable = argument_of(call, "sp_seq_length_is_variable", 1)
            number = integer_literal(length, facts, call) if length is not None else None
            fixed = isinstance(variable, cst.Name) and variable.value == "False"
            if number is not None and fixed and number % sp != 0:
                self.report(
                    length,
                    f"sp_seq_length={number} is not divisible by the sequence-parallel size {sp} ({size.where}): "
                    "with `sp_seq_length_is_variable=False` DeepSpeed Ulysses raises ValueError in "
                    "`accelerator.prepare`",
                )

    def _other_backend(self, call: cst.Call) -> bool:
        """``sp_backend`` set to something else than DeepSpeed (accelerate rejects it anyway)."""
        value = argument_of(call, "sp_backend", 6)
        if value is None:
            return False
        text = string_literal(value, self.facts, call)
        return text is not None and text != "deepspeed"

    def _head_counts(self) -> list[tuple[str, int, cst.CSTNode]]:
        """(key, literal value, node) for every head count written in the file."""
        facts = self.facts
        found: list[tuple[str, int, cst.CSTNode]] = []
        for call in facts.calls:
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value in HEAD_KEYS:
                    value = integer_literal(arg.value, facts, call)
                    if value is not None:
                        found.append((arg.keyword.value, value, arg.value))
        for mapping in facts.index.nodes(cst.Dict):
            for element in mapping.elements:
                if isinstance(element, cst.DictElement):
                    key = string_value(element.key)
                    if key in HEAD_KEYS:
                        value = integer_literal(element.value, facts, mapping)
                        if value is not None:
                            found.append((key, value, element.value))
        for statement in facts.index.nodes(cst.Assign):
            for target in statement.targets:
                node = target.target
                key = node.attr.value if isinstance(node, cst.Attribute) else string_key(node)
                if key in HEAD_KEYS:
                    value = integer_literal(statement.value, facts, statement)
                    if value is not None:
                        found.append((key, value, statement.value))
        return found
