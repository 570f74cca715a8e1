"""LD304 proven on the real pieces: torch's `context_parallel` shards the buffers (head-tail load balancing by
default), transformers' `ForCausalLMLoss` (the loss a causal LM calls) shifts per shard, and
`lintdist.runtime.shift_labels` computed before sharding gives back the unsharded loss.

Context-parallel attention has no CPU kernel (`_scaled_dot_product_flash_attention_for_cpu` has no DTensor
sharding strategy in torch 2.13), so the model cannot run inside the context here. What CP guarantees is that each
rank computes the logits of the positions it holds, the same as the unsharded model's; the logits are therefore
taken from a tiny `LlamaForCausalLM` run on the whole sequence and sharded with the labels, by the same
`context_parallel` call accelerate's `maybe_context_parallel` makes (`functools.partial(context_parallel,
mesh=torch_device_mesh["cp"])`). Each rank of the CP group is played in turn in one process with torch's fake
process group, which shards without communicating (`distribute_tensor(..., src_data_rank=None)` slices locally).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.experimental import context_parallel
from torch.testing._internal.distributed.fake_pg import FakeStore

from lintdist.runtime import shift_labels

transformers = pytest.importorskip("transformers")
from transformers.loss.loss_utils import ForCausalLMLoss

VOCAB = 64
IGNORE = -100


def _model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40)  # confident predictions: a wrong target costs a visibly different loss
    return model


def _batch(length: int):
    generator = torch.Generator().manual_seed(length)
    input_ids = torch.randint(0, VOCAB, (2, length), generator=generator)
    labels = input_ids.clone()
    labels[0, :3] = IGNORE  # a prompt that is not trained on
    return input_ids, labels


def test_runtime_shift_is_the_models_shift_and_the_model_uses_it():
    model = _model()
    assert model.loss_function is ForCausalLMLoss
    input_ids, labels = _batch(12)
    shifted = shift_labels(labels)
    # the runtime helper is transformers' own shift: same targets, -100 at the end
    assert torch.equal(shifted, F.pad(labels, (0, 1), value=IGNORE)[..., 1:])
    assert (shifted[:, -1] == IGNORE).all()
    with torch.no_grad():
        plain = model(input_ids=input_ids, labels=labels)
        given = model(input_ids=input_ids, labels=labels, shift_labels=shifted)
        # shift_labels are used as given (labels only switch the loss on): other targets, another loss
        other = torch.roll(shifted, 1, dims=1)
        swapped = model(input_ids=input_ids, labels=labels, shift_labels=other).loss
    assert given.loss.item() == pytest.approx(plain.loss.item(), abs=1e-6)
    expected = F.cross_entropy(plain.logits.reshape(-1, VOCAB), other.reshape(-1), ignore_index=IGNORE)
    assert swapped.item() == pytest.approx(expected.item(), abs=1e-6)
    assert abs(swapped.item() - plain.loss.item()) > 1e-3


def _shards(cp: int, buffers: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Each CP rank's shards of ``buffers`` (sequence dim 1), from torch's ``context_parallel``."""
    result = []
    for rank in range(cp):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cp)
        try:
            mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
            local = [b.clone() for b in buffers]
            with context_parallel(
                mesh["cp"], buffers=local, buffer_seq_dims=[1] * len(local), no_restore_buffers=set(local)
            ):
                result.append([b.clone() for b in local])
        finally:
            dist.destroy_process_group()
    return result


@pytest.mark.parametrize(
    ("cp", "length", "balanced"),
    [(2, 16, True), (4, 16, True), (2, 18, False), (4, 20, False)],
    ids=["cp2-head-tail", "cp4-head-tail", "cp2-contiguous", "cp4-contiguous"],
)
def test_per_shard_shift_loses_targets_and_shift_before_sharding_is_exact(cp, length, balanced):
    # torch balances (head-tail) only when the length divides into 2 * cp chunks
    assert (length % (2 * cp) == 0) == balanced
    model = _model()
    input_ids, labels = _batch(length)
    with torch.no_grad():
        reference = model(input_ids=input_ids, labels=labels)
    logits = reference.logits
    positions = torch.arange(length).expand(2, -1).contiguous()
    true_targets = shift_labels(labels)

    broken_sum, fixed_sum, broken_count, fixed_count = 0.0, 0.0, 0, 0
    dropped = misaligned = invented = 0
    held = []
    for local_logits, local_labels, local_shifted, local_positions in _shards(
        cp, [logits, labels, shift_labels(labels), positions]
    ):
        held.append(local_positions)
        # what the model computes on this rank without shift_labels: ForCausalLMLoss shifts the shard
        per_shard = shift_labels(local_labels)
        broken_sum += ForCausalLMLoss(local_logits, local_labels, VOCAB, num_items_in_batch=1).item()
        broken_count += int((per_shard != IGNORE).sum())
        # after the fix: the targets shifted before sharding, sharded with the logits
        fixed_sum += ForCausalLMLoss(
            local_logits, local_labels, VOCAB, num_items_in_batch=1, shift_labels=local_shifted
        ).item()
        fixed_count += int((local_shifted != IGNORE).sum())
        # each position's per-shard target against its true next-token target
        truth = torch.gather(true_targets, 1, local_positions)
        assert torch.equal(local_shifted, truth)  # the fix's targets are the true ones, position by position
        dropped += int(((truth != IGNORE) & (per_shard == IGNORE)).sum())
        misaligned += int(((per_shard != IGNORE) & (per_shard != truth)).sum())
        invented += int(((per_shard != IGNORE) & (truth == IGNORE)).sum())  # a misaligned one where none is due

    # the ranks together hold every position once
    assert sorted(torch.cat(held, dim=1)[0].tolist()) == list(range(length))
    if balanced:
        # rank r holds chunks r and 2cp-1-r: the ranks' two chunks meet and their ends pair with the wrong token
        assert held[0][0, : length // (2 * cp)].tolist() == list(range(length // (2 * cp)))
        assert held[0][0, -1].item() == length - 1

    batch_rows = input_ids.shape[0]
    assert dropped == batch_rows * (cp - 1)
    assert misaligned == (batch_rows * (cp - 1) if balanced else 0)
    global_count = int((true_targets != IGNORE).sum())
    assert fixed_count == global_count
    assert broken_count == global_count - dropped + invented
    assert fixed_sum / fixed_count == pytest.approx(reference.loss.item(), abs=1e-6)
    assert abs(broken_sum / broken_count - reference.loss.item()) > 1e-3
