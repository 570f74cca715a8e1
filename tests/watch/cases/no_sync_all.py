"""Pitfall: `model.no_sync()` around every micro-batch (LD110 / LD103).

Raw DDP, 4 micro-batches per optimizer step, per-rank data differs.

Variants:
  broken     - every micro-batch's forward+backward under `with model.no_sync():`, then `optimizer.step()`:
               the gradients are never averaged and the replicas drift apart.
  fixed      - `no_sync` on the non-final micro-batches only; the last backward all-reduces.
  benchmark  - a correct DDP loop (3 x Linear(256, 256), batch 64, accumulation 1,
               3500 steps); rank 0 prints
               `LOOP_SECONDS=<x>` and `LOOP_CPU_SECONDS=<y>`, the loop's wall time and the CPU time of
               rank 0's process (every thread: training, gloo, the watcher). With CASE_SEQUENCE=DIR each rank writes the
               collectives it made (torch's flight recorder) to DIR/rank<R>.json.
"""

import argparse
import json
import os
import pickle
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=["broken", "fixed", "benchmark"], default="broken")
parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
args = parser.parse_args()

dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
rank = dist.get_rank()
if args.variant == "benchmark" and hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1:
    # One core per rank: the timing then varies less from run to run.
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank % len(os.sched_getaffinity(0))]})
torch.manual_seed(0)
width = 256 if args.variant == "benchmark" else 8
device = torch.device("cuda", rank % torch.cuda.device_count()) if args.device == "cuda" else torch.device("cpu")
layers = nn.Sequential(nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, 1)).to(device)
model = DistributedDataParallel(layers)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
ACCUMULATION = 1 if args.variant == "benchmark" else 4
STEPS = 3500 if args.variant == "benchmark" else 3
generator = torch.Generator().manual_seed(rank)
data = torch.randn(8, ACCUMULATION, 64, width, generator=generator).to(device)

start, start_cpu = time.perf_counter(), time.process_time()
for step in range(STEPS):
    for micro in range(ACCUMULATION):
        last = micro == ACCUMULATION - 1
        if args.variant == "broken" or not last:
            with model.no_sync():
                loss = model(data[step % 8, micro]).pow(2).mean()
                loss.backward()
        else:
            loss = model(data[step % 8, micro]).pow(2).mean()
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()
if args.device == "cuda":
    torch.cuda.synchronize()
elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu

if args.variant == "benchmark" and rank == 0:
    print(f"LOOP_SECONDS={elapsed:.2f}")
    print(f"LOOP_CPU_SECONDS={elapsed_cpu:.2f}")
if os.environ.get("CASE_SEQUENCE"):
    # The collectives this rank made, from torch's flight recorder: compared with and without the watcher.
    c10d = torch._C._distributed_c10d
    dump = c10d._dump_nccl_trace if args.device == "cuda" else c10d._dump_fr_trace
    trace = pickle.loads(dump(includeStackTraces=False))
    entries = [[e["collective_seq_id"], e["profiling_name"], e["input_sizes"]] for e in trace["entries"]]
    sequence = {"status": trace["pg_status"], "entries": entries}
    Path(os.environ["CASE_SEQUENCE"], f"rank{rank}.json").write_text(json.dumps(sequence))
dist.destroy_process_group()
print(f"DONE rank={rank}")
