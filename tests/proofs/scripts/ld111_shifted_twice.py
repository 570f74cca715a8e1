"""A tiny Llama trained with raw DDP on gloo; the collate function shifts the labels by hand for next-token loss."""

import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 48
WINDOW = 12


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def make_windows(count=16):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (WINDOW + 1,), generator=generator) for _ in range(count)]


def collate(windows):
    ids = torch.stack(windows)
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:]}


def main():
    dist.init_process_group("gloo")
    model = DistributedDataParallel(build_model())
    windows = make_windows()
    sampler = DistributedSampler(windows, shuffle=False)
    loader = DataLoader(windows, batch_size=4, sampler=sampler, collate_fn=collate)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    steps = []
    for batch in loader:
        outputs = model(**batch)
        steps.append(
            {"input_ids": batch["input_ids"].tolist(), "labels": batch["labels"].tolist(), "loss": outputs.loss.item()}
        )
        outputs.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        break  # the first step's loss is the model's objective on the untouched weights

    with open(os.path.join(os.environ["PROOF_OUT"], f"rank{dist.get_rank()}.json"), "w") as out:
        json.dump({"world": dist.get_world_size(), "steps": steps}, out)
    # Tear down in order while the group is alive: CI once caught (through the harness's stack dump) a worker
    # hanging after main() returned, in the destructors of the DDP model and the loader iterator left by `break`.
    del model, loader, optimizer
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
