"""Time lintdist against a bare libcst parse, fixit and TorchFix, each comparison in one run.

    python benchmarks/bench.py [--scripts DIR ...] [--library DIR ...] [--startup FILE]
                               [--fixit BIN] [--torchfix BIN] [--lintdist BIN] [--jobs N] [--repeat K]

Every figure is the median of K runs after one untimed run, and every comparison is a ratio of two times taken in the
same invocation, so that the machine's speed cancels out:

  scripts   a folder of training scripts (fetched public repositories: never vendored here):
            `lintdist check --no-cache --jobs N` with the default rules, against a bare libcst
            parse of the same .py files on N processes, `fixit lint` and `torchfix -j N`
  library   a library source tree (the transformers and accelerate sources, copied out of the
            virtual environment: lintdist's default excludes skip anything under `.venv`):
            `lintdist check --no-cache --select ALL --jobs N` against the bare N-process parse
            of every .py file in it
  startup   one script, whole process: `lintdist check --no-cache FILE` against the floor,
            a python process that imports libcst and parses FILE; also `lintdist --version`
            (medians of at least 15 runs, the three commands taking turns)
  warm      `lintdist check` run twice with its cache; the second run against a cold one

--fixit and --torchfix name executables installed in their own virtual environments (TorchFix
pins libcst < 1.6):

    python -m venv /tmp/fixit && /tmp/fixit/bin/pip install fixit
    python -m venv /tmp/torchfix && /tmp/torchfix/bin/pip install torchfix

Not a test: timings depend on the machine. Results go in benchmarks/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
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
    jobs, files = int(sys.argv[1]), sys.argv[2:]
    if jobs == 1:
        for path in files:
            parse(path)
    else:
        with Pool(jobs) as pool:
            pool.map(parse, files, chunksize=max(1, len(files) // (jobs * 8)))
"""

FLOOR = "import sys, libcst; libcst.parse_module(open(sys.argv[1], 'rb').read())"


def python_files(folders: list[Path]) -> list[str]:
    return sorted(str(p) for folder in folders for p in folder.rglob("*.py"))


# Bytecode is written as an installed package has it (some environments set PYTHONDONTWRITEBYTECODE, which would
# make every lintdist process compile its own modules from source).
ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def timed(command: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=ENV)
    return time.perf_counter() - start


def median(command: list[str], cwd: str, repeat: int) -> float:
    """The median of ``repeat`` runs, after one untimed run (bytecode written, files in the OS cache)."""
    timed(command, cwd)
    return statistics.median(timed(command, cwd) for _ in range(repeat))


def interleaved(commands: list[list[str]], cwd: str, repeat: int) -> list[float]:
    """Medians of short commands run in turn, so that a noisy moment hits all of them alike."""
    for command in commands:
        timed(command, cwd)
    times: list[list[float]] = [[] for _ in commands]
    for _ in range(repeat):
        for command, samples in zip(commands, times):
            samples.append(timed(command, cwd))
    return [statistics.median(samples) for samples in times]


def warm_run(check: list[str], folders: list[str], work: str, repeat: int) -> float:
    """A second run with the cache of a first one, in a fresh folder each time (median)."""
    times = []
    for _ in range(repeat):
        cache = tempfile.mkdtemp(dir=work)
        command = [*check, *[os.path.abspath(f) for f in folders]]
        timed(command, cache)
        times.append(timed(command, cache))
        shutil.rmtree(cache)
    return statistics.median(times)


def line(name: str, seconds: float, ratios: dict[str, float]) -> str:
    text = "   ".join(f"{label} = {value:.3f}x" for label, value in ratios.items())
    return f"  {name + ':':<26} {seconds:8.2f} s   {text}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", type=Path, action="append", default=[], help="a folder of training scripts")
    parser.add_argument("--library", type=Path, action="append", default=[], help="a library source tree")
    parser.add_argument("--startup", type=Path, help="one script for the start-up comparison")
    parser.add_argument("--fixit", help="path of a `fixit` executable")
    parser.add_argument("--torchfix", help="path of a `torchfix` executable")
    parser.add_argument("--lintdist", help="path of a `lintdist` executable (default: this python's lintdist)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if not (args.scripts or args.library or args.startup):
        parser.error("name --scripts, --library or --startup folders (see benchmarks/RESULTS.md for the sets)")

    lintdist = [args.lintdist] if args.lintdist else [sys.executable, "-m", "lintdist"]
    check = [*lintdist, "check", "--exit-zero", "-q", "--jobs", str(args.jobs)]
    jobs, repeat = str(args.jobs), args.repeat
    print(f"jobs: {args.jobs}; median of {repeat}; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as work:
        bare_script = Path(work) / "bare.py"
        bare_script.write_text(BARE)
        bare = [sys.executable, str(bare_script)]

        if args.scripts:
            files = python_files(args.scripts)
            folders = list(map(str, args.scripts))
            base = median([*bare, jobs, *files], work, repeat)
            cold = median([*check, "--no-cache", *folders], work, repeat)
            print(f"scripts: {len(files)} .py files in {', '.join(folders)}")
            print(line("bare libcst parse", base, {}))
            print(line("lintdist cold", cold, {"lintdist/bare": cold / base}))
            if args.fixit:
                fixit = median([args.fixit, "lint", *folders], work, repeat)
                print(line("fixit lint", fixit, {"lintdist/fixit": cold / fixit, "fixit/bare": fixit / base}))
            if args.torchfix:
                torchfix = median([args.torchfix, "-j", jobs, *folders], work, repeat)
                print(
                    line("torchfix", torchfix, {"lintdist/torchfix": cold / torchfix, "torchfix/bare": torchfix / base})
                )
            warm = warm_run(check, folders, work, repeat)
            print(line("lintdist warm", warm, {"warm/cold": warm / cold}))

        if args.library:
            files = python_files(args.library)
            folders = list(map(str, args.library))
            base = median([*bare, jobs, *files], work, repeat)
            cold = median([*check, "--no-cache", "--select", "ALL", *folders], work, repeat)
            print(f"library: {len(files)} .py files in {', '.join(folders)}")
            print(line("bare libcst parse", base, {}))
            print(line("lintdist cold --select ALL", cold, {"lintdist/bare": cold / base}))
            warm = warm_run([*check, "--select", "ALL"], folders, work, repeat)
            print(line("lintdist warm --select ALL", warm, {"warm/cold": warm / cold}))

        if args.startup:
            script = str(args.startup.resolve())
            lines = len(args.startup.read_text().splitlines())
            floor, one, version = interleaved(
                [
                    [sys.executable, "-c", FLOOR, script],
                    [*lintdist, "check", "--no-cache", "--exit-zero", "-q", script],
                    [*lintdist, "--version"],
                ],
                work,
                max(repeat, 15),
            )
            print(f"startup: {script} ({lines} lines)")
            print(line("python + libcst + parse", floor, {}))
            print(line("lintdist check FILE", one, {"lintdist/floor": one / floor}))
            print(line("lintdist --version", version, {"version/floor": version / floor}))


if __name__ == "__main__":
    main()
