"""LD412 single-process-launch-of-multiprocess-config: `python train.py` for an accelerate script whose config asks
for several processes."""

from __future__ import annotations

import os
import re

from lintdist.launch import config_beside, config_settings, launch_folder, launchers_of, number, resolve_launch_path
from lintdist.model import Applicability, Fix, Severity, Span, TextEdit
from lintdist.rule import Invalid, Pattern, Rule, Valid
from lintdist.sources import SourceError, line_col, read_source

# What makes a script an accelerate program that `accelerate launch` would start several copies of.
ACCELERATE_PROGRAM = re.compile(r"\b(?:Accelerator|PartialState)\(")
# A script that starts its own processes, or runs the launcher itself: `python train.py` is then right.
OWN_LAUNCH = re.compile(r"notebook_launcher|debug_launcher|accelerate\.commands\.launch|launch_command\(|mp\.spawn")
# accelerate 1.15 `utils/dataclasses.py::DistributedType`: the kinds `accelerate launch` starts with a launcher.
SEVERAL = re.compile(r"^(?:MULTI_\w+|FSDP|DEEPSPEED|MEGATRON_LM)$")
# The launchers that start the processes a config asks for (accelerate reads torchrun's environment).
REAL_LAUNCHERS = frozenset({"accelerate", "torchrun", "deepspeed", "srun", "mpiexec"})
# A script that trains with a transformers (or trl) Trainer: in one process that sees several GPUs, the Trainer
# wraps the model in `nn.DataParallel` (transformers `TrainingArguments._setup_devices`: `n_gpu` is the device count
# when no launcher set `LOCAL_RANK`; `Trainer._wrap_model`: `nn.DataParallel` when `n_gpu > 1`).
HF_TRAINER = re.compile(r"\bfrom[ \t]+(?:transformers|trl)\b[\w.]*[ \t]+import[ \t]+(?:\([^)]*|[^\n]*)\b\w*Trainer\b")


# What the one process does with the GPUs it sees, by whether the script trains with a transformers Trainer.
ONE_PROCESS = {
    False: "on one GPU",
    True: "in which the transformers `Trainer` drives every visible GPU through `nn.DataParallel` "
    "(`TrainingArguments.n_gpu`), not the config's processes,",
}


class SingleProcessLaunchOfMultiprocessConfig(Rule):
    """
    ## What it does
    Reports a launch line (a shell script, or a shell block of a README)
    that runs an accelerate script with plain `python train.py` when the
    accelerate config beside the script asks for several processes
    (`num_processes` or `num_machines` above 1, or `distributed_type` of
    `MULTI_GPU`, `MULTI_NPU`..., `FSDP`, `DEEPSPEED`), and no launch file or
    page of the script's folder (or the line's) starts it with `accelerate
    launch`, `torchrun`, `deepspeed`, `srun` or `mpiexec`. The script counts
    as an accelerate program when it builds an `Accelerator` or
    `PartialState`. Not reported: a script that starts its own processes
    (`notebook_launcher`, `debug_launcher`, `mp.spawn`) or calls accelerate's
    launcher itself, a line that pins the run to chosen GPUs
    (`CUDA_VISIBLE_DEVICES=0 python train.py`, a deliberate one-GPU run), and
    a config that asks for one process.

    ## Why is this bad?
    accelerate reads its config only in `accelerate launch`: `Accelerator()`
    decides the setup from the environment the launcher exports (`LOCAL_RANK`,
    `WORLD_SIZE`, `ACCELERATE_USE_FSDP`...). Under `python train.py` there is
    none, so the run is one process on one GPU (`DistributedType.NO`), FSDP
    or DeepSpeed from the config are not used either, and nothing says so:
    the job is just N times slower, or runs out of memory where the config's
    sharding was meant to fit it. A script that trains with a transformers
    `Trainer` is one process too, in which the Trainer drives every visible
    GPU through `nn.DataParallel` (a replica per GPU each step, outputs
    gathered on GPU 0) instead of the config's processes.

    ## Example
    ```bash
    # default_config.yaml beside train.py: distributed_type: MULTI_GPU, num_processes: 4
    python train.py --lr 1e-4
    ```

    ## Use instead
    ```bash
    accelerate launch --config_file default_config.yaml train.py --lr 1e-4
    ```

    ## Fix safety
    Unsafe: the fix rewrites `python train.py ...` to `accelerate launch
    --config_file <the config> train.py ...`, offered only when nothing
    stands between `python` and the script. It changes how many processes
    run (the global batch, the memory per GPU), and the line may have been
    meant as a one-process run.

    ## References
    - accelerate 1.15 `commands/launch.py::_validate_launch_command`: the config file is read
      (`load_config_from_file`) only by `accelerate launch`.
    - accelerate 1.15 `state.py::PartialState._prepare_backend`: the distributed type comes from the environment
      (`LOCAL_RANK` set by a launcher), else `DistributedType.NO`; the YAML is never loaded.
    - transformers 5.24 `training_args.py::TrainingArguments._setup_devices`: without a launcher's environment
      `n_gpu` is `torch.cuda.device_count()`; `trainer.py::Trainer._wrap_model` then wraps the model in
      `nn.DataParallel` (also in 4.x).
    - huggingface/accelerate#197 (https://github.com/huggingface/accelerate/issues/197): "only one gpu used when
      run python script.py"; the maintainer: "using `python script.py` will only launch one process, you have to
      use `accelerate launch`".
    - huggingface/accelerate#707 (https://github.com/huggingface/accelerate/issues/707): `accelerate config`
      then `python my_script.py` used one GPU; `accelerate launch` fixed it.
    - huggingface/accelerate#41 (https://github.com/huggingface/accelerate/issues/41): `python3 train.py` with a
      MULTI_GPU config; the maintainer: launch it with `accelerate launch`.
    - Proof: `tests/proofs/test_ld412_plain_python.py` (gloo, 2 CPU processes): with a config asking for two
      processes, `python train.py` runs one (`DistributedType.NO`); the line the fix writes runs two.
    """

    code = "LD412"
    name = "single-process-launch-of-multiprocess-config"
    severity = Severity.WARNING
    fix_kind = "unsafe"
    kinds = frozenset({"launch"})
    plain_python_launches = True
    triggers = (Pattern(("python",), re.compile(r"python[0-9.]*[ \t]+[^\n]*\.py")),)

    VALID = (
        Valid(
            "accelerate launch --config_file default_config.yaml train.py\n",
            filename="run.sh",
            project={
                "default_config.yaml": "distributed_type: MULTI_GPU\nnum_processes: 4\n",
                "train.py": "from accelerate import Accelerator\naccelerator = Accelerator()\n",
            },
        ),
        Valid(
            "python train.py\n",
            filename="run.sh",
            project={
                "default_config.yaml": "distributed_type: 'NO'\nnum_processes: 1\n",
                "train.py": "from accelerate import Accelerator\naccelerator = Accelerator()\n",
            },
        ),
        Valid(
            "CUDA_VISIBLE_DEVICES=0 python train.py\n",
            filename="run.sh",
            project={
                "default_config.yaml": "distributed_type: MULTI_GPU\nnum_processes: 4\n",
                "train.py": "from accelerate import Accelerator\naccelerator = Accelerator()\n",
            },
        ),
    )
    INVALID = (
        Invalid(
            "python train.py --lr 1e-4\n",
            lines=(1,),
            filename="run.sh",
            project={
                "default_config.yaml": "distributed_type: MULTI_GPU\nnum_processes: 4\n",
                "train.py": "from accelerate import Accelerator\naccelerator = Accelerator()\n",
            },
            unsafe_fixed="accelerate launch --config_file default_config.yaml train.py --lr 1e-4\n",
        ),
    )

    def check_launch(self, launch) -> None:
        text = self.context.text
        for command in launch.commands:
            if command.launcher != "python" or command.script is None or command.wrapper is not None:
                continue
            if any(name == "CUDA_VISIBLE_DEVICES" for name, _, _ in command.env):
                continue  # a run pinned to chosen GPUs: one process on purpose
            script = resolve_launch_path(command.script.text, self.context.path)
            found = self._config(script)
            if found is None:
                continue
            config, why, trainer = found
            if launchers_of(script, list({script.parent, self.context.path.parent})) & REAL_LAUNCHERS:
                continue  # another line starts it with a launcher: this one may be a one-process run on purpose
            # the config as the line names it: from the folder the line is run from
            shown = os.path.relpath(config, launch_folder(command.script.text, self.context.path))
            start, end = command.token.start, command.script.end
            self.report(
                None,
                f"`{text[start:end]}` starts one process, but `{shown}` asks for {why}: accelerate reads its config "
                "only under `accelerate launch`, and `Accelerator()` alone finds no launcher's environment, so the "
                f"run is one process (`DistributedType.NO`) {ONE_PROCESS[trainer]} and none of the config's settings "
                f"apply; start it with `accelerate launch --config_file {shown} {command.script.text}`",
                span=Span(*line_col(text, start), *line_col(text, end)),
                fix=self._fix(command, config),
            )

    def _config(self, script) -> tuple[os.PathLike, str, bool] | None:
        """The config beside an accelerate script, what it asks for in words when that is several processes, and
        whether the script trains with a transformers Trainer."""
        if script.suffix != ".py" or not script.is_file():
            return None
        try:
            code = read_source(script, "python").text
        except SourceError:
            return None
        if not ACCELERATE_PROGRAM.search(code) or OWN_LAUNCH.search(code):
            return None
        beside = config_beside(script)
        if beside is None:
            return None
        path, document = beside
        trainer = bool(HF_TRAINER.search(code))
        settings = {s.name: s for s in config_settings(document, str(path))}
        processes, machines = number(settings.get("num_processes")), number(settings.get("num_machines"))
        kind = settings.get("distributed_type")
        if processes is not None and processes > 1:
            return path, f"{processes} processes (`num_processes: {processes}`)", trainer
        if machines is not None and machines > 1:
            return path, f"{machines} machines (`num_machines: {machines}`)", trainer
        if processes is None and kind is not None and SEVERAL.match(str(kind.value)):
            return path, f"`distributed_type: {kind.value}`", trainer
        return None

    def _fix(self, command, config) -> Fix | None:
        """``python train.py`` becomes ``accelerate launch --config_file <config> train.py``, where nothing but
        spaces stands between the two words."""
        text = self.context.text
        if text[command.token.end : command.script.start].strip():
            return None  # `python -u train.py`: interpreter flags accelerate launch does not take
        folder = os.path.dirname(command.script.text)
        path = os.path.join(folder, os.path.basename(config)) if folder else os.path.basename(config)
        edit = TextEdit(command.token.start, command.script.start, f"accelerate launch --config_file {path} ")
        return Fix(Applicability.UNSAFE, "Start it with `accelerate launch`", edits=(edit,))
