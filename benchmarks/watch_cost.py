"""What `lintdist.runtime.watch` costs a training job: measured here, not asserted in a test.

    python benchmarks/watch_cost.py [--pairs N] [--device cpu|cuda] [--nproc W] [--hook-steps S]

1. Case 8's correct DDP benchmark (tests/watch/cases/no_sync_all.py, 3,500 steps) launched N times under watch
   and N times plain, interleaved (watch first in even pairs, plain first in odd ones) after one untimed launch:
   the loop's wall time, the median and mean log ratio watch/plain with a one-sided 90% lower bound, and the
   watcher thread's CPU seconds against the loop.
2. The training-thread hooks in one process (tests/watch/cases/hook_cost.py): the best of 3 DDP loops of S steps
   with them against the best of 3 without.

On two cores one launch's loop time varies by 5 to 18% from the next, so a single pair says little; read the
interval. Results go in benchmarks/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lintdist.runtime.selftest import free_port  # noqa: E402
from tests.watch.harness import CASES, launch  # noqa: E402

# One-sided 90% quantiles of Student's t by degrees of freedom (pairs - 1).
T_90 = {1: 3.078, 2: 1.886, 3: 1.638, 4: 1.533, 5: 1.476, 6: 1.440, 7: 1.415, 8: 1.397, 9: 1.383}


def launches(pairs: int, device: str, nproc: int, work: Path) -> None:
    seconds: dict[bool, list[float]] = {True: [], False: []}
    cpu: list[float] = []
    warm = launch("no_sync_all.py", "benchmark", work / "warm-up", watch=False, nproc=nproc, device=device)
    if not warm.finished:
        sys.exit(f"the warm-up launch did not finish:\n{warm.output[-3000:]}")
    for pair in range(pairs):
        for watch in (True, False) if pair % 2 == 0 else (False, True):
            run = launch(
                "no_sync_all.py", "benchmark", work / f"{pair}-{watch}", watch=watch, nproc=nproc, device=device
            )
            if not run.finished:
                sys.exit(f"a launch did not finish:\n{run.output[-3000:]}")
            seconds[watch].append(run.loop_seconds())
            if watch:
                cpu.append(run.report["watcher"]["cpu_seconds"])
    logs = [math.log(w / p) for w, p in zip(seconds[True], seconds[False], strict=True)]
    mean = statistics.mean(logs)
    print(f"{device}, {nproc} ranks, {pairs} interleaved pairs")
    print(f"  loop seconds under watch: {seconds[True]}")
    print(f"  loop seconds plain:       {seconds[False]}")
    print(f"  pair ratios: {[round(math.exp(x), 3) for x in logs]}")
    print(f"  median ratio {statistics.median(seconds[True]) / statistics.median(seconds[False]):.3f}, ", end="")
    if len(logs) > 1:
        lower = mean - T_90.get(len(logs) - 1, 1.3) * statistics.stdev(logs) / math.sqrt(len(logs))
        print(f"mean ratio {math.exp(mean):.3f} (one-sided 90% lower bound {math.exp(lower):.3f})")
    else:
        print(f"ratio {math.exp(mean):.3f}")
    share = max(cpu) / min(seconds[True])
    print(f"  watcher thread CPU seconds {cpu}: at most {100 * share:.2f}% of the loop")


def hooks(steps: int) -> None:
    result = subprocess.run(
        [sys.executable, str(CASES / "hook_cost.py"), str(free_port()), str(steps)],
        check=True,
        capture_output=True,
        text=True,
    )
    plain, hooked, posted = result.stdout.split()
    print(
        f"hooks, one process, best of 3 loops of {steps} DDP steps: {float(plain):.3f} s plain, "
        f"{float(hooked):.3f} s hooked, ratio {float(hooked) / float(plain):.3f} ({posted} checksums queued)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--hook-steps", type=int, default=1500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-cost-") as work:
        launches(args.pairs, args.device, args.nproc, Path(work))
    hooks(args.hook_steps)


if __name__ == "__main__":
    main()
