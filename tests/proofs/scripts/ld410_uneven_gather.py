"""Gathering generated sequences with accelerate on 2 CPU ranks (gloo) when their lengths differ.

`TinyGenerator.generate` stands in for `GenerationMixin.generate`: each rank's sequences end at its own EOS, so
rank r returns 4 + 3 * r tokens per row. Every rank then gathers them with `accelerator.gather_for_metrics`.
Each rank writes what it gathered to $PROOF_OUT/rank<R>.json. The process group times out after a few seconds,
so a rank left waiting fails fast.
"""

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs

OUT = Path(os.environ["PROOF_OUT"])


class TinyGenerator:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def generate(self, input_ids, max_new_tokens):
        new = min(max_new_tokens, 3 + 3 * self.rank)  # this rank's EOS comes after 3 + 3 * rank tokens
        return torch.cat([input_ids, torch.full((input_ids.shape[0], new), 5 + self.rank)], dim=1)


accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=6))])
model = TinyGenerator(accelerator.process_index)
prompts = torch.ones(2, 1, dtype=torch.long)

tokens = model.generate(prompts, max_new_tokens=16)
gathered = accelerator.gather_for_metrics(tokens)

(OUT / f"rank{accelerator.process_index}.json").write_text(json.dumps({"gathered": gathered.tolist()}))
accelerator.wait_for_everyone()
