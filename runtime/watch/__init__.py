"""Run a training script unchanged and watch it: hangs named by each rank's line, data and optimisation pitfalls.

    torchrun --nproc-per-node N -m lintdist.runtime.watch train.py ARGS
    accelerate launch -m lintdist.runtime.watch train.py ARGS
    python -m lintdist.runtime.watch spawn_script.py ARGS        # scripts that call torch.multiprocessing.spawn

A watcher thread per rank talks to the others through a store client of its own on the launcher's store; it adds
no collective to the job's process groups. Imports torch only; never the linter.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from lintdist.runtime.watch.hang import Limits
from lintdist.runtime.watch.watcher import Options, Watcher

__all__ = ["Options", "Watcher", "main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lintdist.runtime.watch",
        description="Run a distributed training script under lintdist's watcher.",
    )
    parser.add_argument("--report", default="lintdist-watch.json", help="JSON report path (default: %(default)s)")
    parser.add_argument("--exit-code", type=int, default=3, help="exit code after a hang report (default: 3)")
    parser.add_argument("--no-exit", action="store_true", help="report a hang but let the job wait for its timeout")
    parser.add_argument("--confirm", type=float, default=Limits.confirm, help="seconds a disagreement must last")
    parser.add_argument(
        "--stall",
        type=float,
        default=Limits.stall,
        help="seconds before a rank stuck outside any collective is reported",
    )
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls (default: %(default)s)")
    parser.add_argument("--grad-every", type=int, default=50, help="compare gradients every N optimizer steps")
    parser.add_argument("--no-hangs", action="store_true", help="only the data and optimisation checks")
    parser.add_argument("--no-checks", action="store_true", help="only hang detection")
    parser.add_argument("-m", dest="module", help="run a module as the script (like python -m); the rest is its argv")
    parser.add_argument("script", nargs="?", help="the training script; the rest is its argv")
    return parser


def _split(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the watcher's options with the script or `-m module`, the script's own arguments)."""
    takes_value = {"--report", "--exit-code", "--confirm", "--stall", "--interval", "--grad-every"}
    index = 0
    while index < len(argv):
        token = argv[index]
        if token == "-m":
            return list(argv[: index + 2]), list(argv[index + 2 :])
        if not token.startswith("-"):
            return list(argv[: index + 1]), list(argv[index + 1 :])
        index += 2 if token in takes_value else 1
    return list(argv), []


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        report=os.path.abspath(args.report),
        exit_code=0 if args.no_exit else args.exit_code,
        interval=args.interval,
        limits=Limits(confirm=args.confirm, stall=args.stall),
        hangs=not args.no_hangs,
        checks=not args.no_checks,
        grad_every=max(1, args.grad_every),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m lintdist.runtime.watch`."""
    own, script_args = _split(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(own)
    args.args = script_args
    if not args.module and not args.script:
        _parser().error("give the training script (or -m module)")
    options = options_from(args)
    _watch_spawned_processes(options)
    watcher = Watcher(options)
    watcher.start()
    if args.module:
        sys.argv = [args.module, *args.args]
        return _run(watcher, lambda: runpy.run_module(args.module, run_name="__main__", alter_sys=True))
    sys.argv = [args.script, *args.args]
    sys.path[0] = os.path.dirname(os.path.abspath(args.script))
    return _run(watcher, lambda: runpy.run_path(args.script, run_name="__main__"))


def _run(watcher: Watcher, target: Callable[[], Any]) -> int:
    try:
        target()
    except BaseException as error:
        _end(watcher, error)
        raise
    _end(watcher, None)
    return 0


def _end(watcher: Watcher, error: BaseException | None) -> None:
    code = watcher.finish(error)
    if code:
        if error is not None and not isinstance(error, SystemExit):
            traceback.print_exception(error)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _Watched:
    """A spawned process's function, run under a watcher of its own (picklable for the spawn start method)."""

    def __init__(self, function: Callable[..., Any], options: Options) -> None:
        self.function = function
        self.options = options

    def __call__(self, *args: Any) -> Any:
        watcher = Watcher(self.options)
        watcher.start()
        result = None

        def call() -> None:
            nonlocal result
            result = self.function(*args)

        _run(watcher, call)
        return result


def _watch_spawned_processes(options: Options) -> None:
    """Make `torch.multiprocessing.spawn`/`start_processes` run each process's function under a watcher."""
    import torch.multiprocessing as mp

    # `torch.multiprocessing.spawn` names the function; the module it lives in is only reachable this way.
    spawn_module = sys.modules["torch.multiprocessing.spawn"]

    original = spawn_module.start_processes
    if getattr(original, "_lintdist_watch", False):
        return

    def start_processes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return original(_Watched(fn, options), *args, **kwargs)

    start_processes._lintdist_watch = True
    spawn_module.start_processes = start_processes
    mp.start_processes = start_processes
