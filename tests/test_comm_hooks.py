"""lintdist/comm_hooks.py: what a value handed as a DDP communication hook is."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.comm_hooks import hook_value
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def test_members_strings_torch_functions_and_local_hooks():
    index = SyntaxIndex(
        cst.parse_module(
            textwrap.dedent(
                """
                from accelerate.utils import DDPCommunicationHookType
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import powerSGD_hook
                def my_hook(state, bucket):
                    return bucket
                name = "fp16"
                alias = default_hooks.bf16_compress_hook
                f(
                    DDPCommunicationHookType.FP16,
                    "power_sgd",
                    name,
                    "nonsense",
                    powerSGD_hook,
                    alias,
                    my_hook,
                    lambda s, b: b,
                    args.hook,
                )
                """
            )
        )
    )
    facts = PythonFacts(index, NameResolver(index))
    call = facts.calls[-1]
    values = [arg.value for arg in call.args]
    assert [hook_value(facts, v, call) for v in values] == [
        ("enum", None),
        ("string", "POWER_SGD"),
        ("string", "FP16"),
        ("string", None),
        ("torch", "POWER_SGD"),
        ("torch", "BF16"),
        ("local", None),
        ("local", None),
        ("unknown", None),
    ]
    assert hook_value(facts, values[1], call, wrapper=True) == ("string", None)
    assert hook_value(facts, values[2], call, wrapper=True) == ("string", "FP16")
    assert hook_value(facts, values[5], call, wrapper=True) == ("unknown", None)
