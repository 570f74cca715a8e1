"""Time lintdist against a bare libcst parse of the same files, in one run.

    python benchmarks/bench.py [--jobs N] [--repeat K] [--fixit BIN] [--torchfix BIN] [PACKAGE ...]
    (default packages: transformers accelerate)

Measures, on the installed source trees of the packages:
  bare   every .py file parsed with libcst.parse_module, N worker processes
  cold   `lintdist check --no-cache --jobs N` (files the pre-filter skips are not parsed)
  warm   `lintdist check --jobs N` run twice; the second run is timed
and prints the ratios cold/bare and warm/cold (best of K runs each). With
--fixit and --torchfix (the `fixit` and `torchfix` executables, each installed in
its own virtual environment: torchfix pins libcst < 1.6), it also times
`fixit lint` and `torchfix -j N` on the same files and prints their ratios to
lintdist cold. Not a test: timings depend on the machine.

    python -m venv /tmp/fixit && /tmp/fixit/bin/pip install fixit
    python -m venv /tmp/torchfix && /tmp/torchfix/bin/pip install torchfix
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BARE = """
import sys
from multiprocessing import Pool
import libcst

def parse(path):
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        libcst.parse_module(data)
    except Exception:
        pass

if __name__ == "__main__":
    files = sys.argv[2:]
    with Pool(int(sys.argv[1])) as pool:
        pool.map(parse, files, chunksize=max(1, len(files) // (int(sys.argv[1]) * 8)))
"""


def package_root(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def timed(command: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("packages", nargs="*", default=["transformers", "accelerate"])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fixit", help="path of a `fixit` executable")
    parser.add_argument("--torchfix", help="path of a `torchfix` executable")
    args = parser.parse_args()

    roots = [package_root(name) for name in args.packages]
    files = sorted(str(p) for root in roots for p in root.rglob("*.py"))
    lintdist = [
        sys.executable,
        "-m",
        "lintdist",
        "check",
        "--exit-zero",
        "-q",
        "--jobs",
        str(args.jobs),
        *map(str, roots),
    ]
    with tempfile.TemporaryDirectory() as work:
        bare_script = Path(work) / "bare.py"
        bare_script.write_text(BARE)
        bare = min(timed([sys.executable, str(bare_script), str(args.jobs), *files], work) for _ in range(args.repeat))
        cold = min(timed([*lintdist, "--no-cache"], work) for _ in range(args.repeat))
        warm_times = []
        for _ in range(args.repeat):
            cache = tempfile.mkdtemp(dir=work)
            timed(lintdist, cache)
            warm_times.append(timed(lintdist, cache))
        warm = min(warm_times)
        others = {}
        if args.fixit:
            others["fixit lint"] = min(timed([args.fixit, "lint", *map(str, roots)], work) for _ in range(args.repeat))
        if args.torchfix:
            command = [args.torchfix, "-j", str(args.jobs), *map(str, roots)]
            others["torchfix"] = min(timed(command, work) for _ in range(args.repeat))
    print(f"files: {len(files)} .py files in {', '.join(args.packages)}; jobs: {args.jobs}; best of {args.repeat}")
    print(f"bare libcst parse: {bare:.2f} s")
    print(f"lintdist cold:     {cold:.2f} s   cold/bare = {cold / bare:.2f}x   (target <= 1.2x)")
    print(f"lintdist warm:     {warm:.2f} s   warm/cold = {warm / cold:.3f}x  (target < 0.1x)")
    for name, seconds in others.items():
        print(
            f"{name + ':':<18} {seconds:.2f} s   {name}/lintdist-cold = {seconds / cold:.2f}x   {name}/bare = {seconds / bare:.2f}x"
        )


if __name__ == "__main__":
    main()
