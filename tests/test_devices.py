"""lintdist/devices.py: which CUDA device code chooses, and whether a process group is NCCL's."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.devices import current_device, device_indices, starts_nccl_group, string_device_index
from lintdist.facts import PythonFacts
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _code(facts: PythonFacts, node: cst.CSTNode) -> str:
    return facts.index.module.code_for_node(node)


def test_device_indices_of_each_kind_of_call():
    facts = _facts(
        """
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.cuda.set_device(a)
        torch.device("cuda", b)
        torch.device(c)
        torch.device("cpu")
        dist.init_process_group("nccl", device_id=d)
        DDP(model, device_ids=[e], output_device=f)
        DDP(model)
        x.to(g)
        x.cuda(h)
        "cuda:{}".format(i)
        "cpu:{}".format(j)
        x.cuda()
        """
    )
    found = [_code(facts, i) for call in facts.calls for i in device_indices(facts, call)]
    assert found == ["a", "b", "c", "d", "e", "f", "g", "h", "i"]


def test_device_strings_built_with_an_index():
    facts = _facts(
        """
        a = f"cuda:{r}"
        b = "cuda:%d" % (s,)
        c = "cuda:" + str(t)
        d = f"cpu:{u}"
        e = "cpu" + v
        """
    )
    strings = facts.index.nodes(cst.FormattedString, cst.BinaryOperation)
    found = [string_device_index(node) for node in strings]
    assert [_code(facts, i) for i in found if i is not None] == ["r", "s", "str(t)"]


def test_current_device_without_an_index():
    facts = _facts(
        """
        import torch
        x.cuda()
        x.cuda(non_blocking=True)
        x.to("cuda")
        torch.device("cuda")
        x.cuda(0)
        x.to("cuda:0")
        torch.cuda()
        """
    )
    assert [current_device(facts, call) for call in facts.calls] == [True, True, True, True, False, False, False]


def test_nccl_groups_of_several_processes():
    facts = _facts(
        """
        import torch.distributed as dist
        backend = "nccl"
        dist.init_process_group()
        dist.init_process_group(backend)
        dist.init_process_group("gloo")
        dist.init_process_group("nccl", world_size=1, rank=0)
        other("nccl")
        """
    )
    assert [starts_nccl_group(facts, call) for call in facts.calls] == [True, True, False, False, False]


def test_other_indexed_device_types_are_device_strings_too():
    import libcst as cst

    from lintdist.devices import string_device_index

    for text, index in (('"xpu:%d" % rank', "rank"), ('f"npu:{local}"', "local"), ('"hpu:" + str(i)', "str(i)")):
        found = string_device_index(cst.parse_expression(text))
        assert found is not None and cst.Module([]).code_for_node(found) == index, text
    assert string_device_index(cst.parse_expression('"cpu:%d" % rank')) is None


def test_uses_cuda_needs_a_gpu_placement_or_an_nccl_group():
    from lintdist.devices import uses_cuda

    assert uses_cuda(_facts("import torch.distributed as dist\ndist.init_process_group('nccl')\n"))
    assert uses_cuda(_facts("import torch.distributed as dist\ndist.init_process_group()\n"))
    assert uses_cuda(_facts("model = model.cuda()\n"))
    assert uses_cuda(_facts("import torch\ntorch.cuda.set_device(local_rank)\n"))
    assert uses_cuda(_facts("model = model.to(f'cuda:{rank}')\n"))
    assert not uses_cuda(_facts("import torch.distributed as dist\ndist.init_process_group('gloo')\nmodel.to('cpu')\n"))
    assert uses_cuda(_facts("model = model.to(local_rank)\n"))
    assert not uses_cuda(_facts("model = model.to(device)\nx = x.to(torch.float16)\n"))
