"""Greedy decoding on a model sharded with FSDP2 (`fully_shard`, gloo, CPU), each rank stopping at its own length.

`TinyLM.generate` follows transformers' decoding loop (`GenerationMixin._sample` with
`_has_unfinished_sequences`): without `synced_gpus` a rank leaves the loop when its sequences are done; with it,
every rank all-reduces a done-flag per step and a finished rank keeps running forwards until all are done. Every
forward of a `fully_shard` model all-gathers its parameters. Rank r stops after 3 + 3 * r new tokens (its own
EOS). Each rank writes how many forwards it ran to $PROOF_OUT/rank<R>.json, then meets the others at a barrier.
The process group times out after a few seconds, so a rank left waiting fails fast.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

OUT = Path(os.environ["PROOF_OUT"])


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 16, width: int = 8) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layer = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)
        self.forwards = 0

    def forward(self, input_ids):
        self.forwards += 1
        return self.head(torch.tanh(self.layer(self.embed(input_ids))))

    @torch.no_grad()
    def generate(self, input_ids, max_new_tokens, synced_gpus=False):
        done = False
        while True:
            if synced_gpus:
                flag = torch.tensor(0.0 if done else 1.0)
                dist.all_reduce(flag)
                if flag.item() == 0.0:
                    break
            elif done:
                break
            logits = self(input_ids)
            if synced_gpus and done:
                continue  # a finished rank runs the forward only to join the all-gather
            input_ids = torch.cat([input_ids, logits[:, -1:].argmax(-1)], dim=1)
            done = input_ids.shape[1] >= max_new_tokens + 1  # this rank's own EOS
        return input_ids


dist.init_process_group("gloo", timeout=timedelta(seconds=6))
rank = dist.get_rank()
torch.manual_seed(0)
model = TinyLM()
fully_shard(model.layer)
fully_shard(model)

prompt = torch.zeros(1, 1, dtype=torch.long)
outputs = model.generate(prompt, max_new_tokens=3 + 3 * rank, synced_gpus=False)

(OUT / f"rank{rank}.json").write_text(json.dumps({"new_tokens": outputs.shape[1] - 1, "forwards": model.forwards}))
dist.barrier()
dist.destroy_process_group()
