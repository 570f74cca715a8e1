"""LD308 proven on the real pieces where DeepSpeed is not needed, and with DeepSpeed's group registry stubbed where
it is.

* accelerate 1.15 builds no device mesh for DeepSpeed sequence parallelism (`ParallelismConfig.build_device_mesh`,
  which `Accelerator.__init__` stores as `state.device_mesh`, returns None), and the mesh it builds otherwise has no
  "sp" dimension: `accelerator.torch_device_mesh["sp"]` cannot work.
* The fixed script calls `lintdist.runtime.sequence_parallel_group(accelerator)`, which returns the group DeepSpeed
  registered in `deepspeed.utils.groups` (where `accelerator.prepare` puts it through
  `UlyssesSPAttentionHF.register_with_transformers`, and where transformers' `deepspeed_sp_compute_loss` reads it)
  while the mesh is None. DeepSpeed is not installed here, so that module is a stub holding a real process group;
  the world is torch's fake process group (one process standing for rank 0 of 2 or 4).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from types import SimpleNamespace

import pytest
import torch.distributed as dist
from accelerate import ParallelismConfig
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from lintdist.runtime import sequence_parallel_group
from tests.proofs.harness import fixed_copy

SCRIPT = "ld308_sp_group.py"


@pytest.fixture
def world(request):
    size = getattr(request, "param", 2)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    yield size
    dist.destroy_process_group()


@pytest.fixture
def deepspeed_groups(monkeypatch):
    """A stand-in for `deepspeed.utils.groups` whose SP group is a real process group of ranks 0 and 1."""
    group = dist.new_group([0, 1])
    groups = types.ModuleType("deepspeed.utils.groups")
    groups._get_sequence_parallel_group = lambda: group
    utils = types.ModuleType("deepspeed.utils")
    utils.groups = groups
    package = types.ModuleType("deepspeed")
    package.utils = utils
    for name, module in (("deepspeed", package), ("deepspeed.utils", utils), ("deepspeed.utils.groups", groups)):
        monkeypatch.setitem(sys.modules, name, module)
    return group


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_accelerate_builds_no_sp_mesh(world):
    # DeepSpeed sequence parallelism: no mesh at all (the subscript raises TypeError)
    assert ParallelismConfig(sp_backend="deepspeed", sp_size=2).build_device_mesh("cpu") is None
    # without it, a mesh whose dimensions never include "sp" (KeyError)
    mesh = ParallelismConfig(dp_shard_size=2).build_device_mesh("cpu")
    assert "sp" not in mesh.mesh_dim_names
    with pytest.raises(KeyError):
        mesh["sp"]


def test_fixed_script_gets_deepspeeds_group_where_the_mesh_is_none(tmp_path, world, deepspeed_groups):
    broken, fixed = fixed_copy(SCRIPT, tmp_path, codes="LD308")
    assert "return sequence_parallel_group(accelerator)" in fixed.read_text()
    accelerator = SimpleNamespace(torch_device_mesh=None)  # what Accelerator.torch_device_mesh is under DS-SP

    with pytest.raises(TypeError):
        _load(broken, "ld308_broken").sp_group(accelerator)
    assert _load(fixed, "ld308_fixed").sp_group(accelerator) is deepspeed_groups


def test_without_deepspeed_the_helper_says_why(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed...` raises ImportError
    with pytest.raises(ValueError, match="no sequence-parallel group"):
        sequence_parallel_group(SimpleNamespace(torch_device_mesh=None))


@pytest.mark.parametrize("world", [4], indirect=True)
def test_where_a_mesh_has_an_sp_dimension_the_helper_returns_its_group(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "sp"))
    assert sequence_parallel_group(SimpleNamespace(torch_device_mesh=mesh)) is mesh["sp"].get_group()
