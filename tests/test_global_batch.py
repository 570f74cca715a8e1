"""lintdist/global_batch.py: how the global batch grows with the number of processes."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.global_batch import batch_grows_with_processes
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _grows(code: str) -> str | None:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return batch_grows_with_processes(PythonFacts(index, NameResolver(index)))


def test_each_process_loads_its_own_batch_through_prepare():
    assert (
        _grows(
            """
            from accelerate import Accelerator
            from torch.utils.data import DataLoader
            accelerator = Accelerator()
            model, loader = accelerator.prepare(model, DataLoader(ds, batch_size=8))
            """
        )
        == "accelerate"
    )


def test_split_batches_keeps_the_global_batch():
    source = """
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration({split}))
        model, train_loader = accelerator.prepare(model, train_loader)
        """
    assert _grows(source.format(split="split_batches=True")) is None
    assert _grows(source.format(split="split_batches=args.split")) is None
    assert _grows(source.format(split="split_batches=False")) == "accelerate"
    assert _grows(source.format(split="")) == "accelerate"


def test_a_distributed_sampler_beside_a_ddp_model():
    source = """
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data.distributed import DistributedSampler
        model = DDP(model)
        sampler = DistributedSampler(ds)
        """
    assert _grows(source) == "ddp"
    assert _grows(source.replace("model = DDP(model)", "")) is None
