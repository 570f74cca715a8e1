"""Launch lines and accelerate configs normalised into one settings table."""

from __future__ import annotations

from pathlib import Path

from lintdist.launch import LaunchSettings, command_settings, config_settings
from lintdist.sources import parse_config, parse_launch

SCRIPT = """\
#!/bin/bash
export FSDP_VERSION=2   # the new API
NCCL_DEBUG=INFO ACCELERATE_USE_FSDP=true accelerate launch \\
    --config-file "configs/fsdp.yaml" --num_processes=8 \\
    --fsdp_use_orig_params true --multi_gpu train.py --epochs 3
python -m torch.distributed.run --nproc-per-node 4 pretrain.py && echo done
deepspeed --num_gpus 2 ds_train.py --deepspeed ds.json; torchrun --standalone --nproc_per_node=2 tiny.py
echo "accelerate launch is not a command here"
"""


def test_launch_commands_flags_env_and_scripts():
    launch = parse_launch(SCRIPT)
    assert [(c.launcher, c.script.text) for c in launch.commands] == [
        ("accelerate", "train.py"),
        ("torchrun", "pretrain.py"),
        ("deepspeed", "ds_train.py"),
        ("torchrun", "tiny.py"),
    ]
    accelerate = launch.commands[0]
    assert [(f.name, f.value) for f in accelerate.flags] == [
        ("config_file", "configs/fsdp.yaml"),
        ("num_processes", "8"),
        ("fsdp_use_orig_params", "true"),
        ("multi_gpu", None),
    ]
    assert [name for name, _, _ in accelerate.env] == ["NCCL_DEBUG", "ACCELERATE_USE_FSDP"]
    assert [(name, value) for name, value, _ in launch.exports] == [("FSDP_VERSION", "2")]
    assert [(f.name, f.value) for f in launch.commands[3].flags] == [("standalone", None), ("nproc_per_node", "2")]


def test_settings_keep_the_place_that_said_them():
    launch = parse_launch(SCRIPT)
    settings = LaunchSettings()
    for setting in command_settings(launch.commands[0], launch, SCRIPT, "run.sh"):
        settings.set(setting)
    assert (
        settings.get("fsdp_version").value,
        settings.get("fsdp_version").line,
        settings.get("fsdp_version").spelling,
    ) == ("2", 2, "env")
    orig = settings.get("fsdp_use_orig_params")
    assert (orig.line, orig.column, orig.spelling) == (5, 5, "flag")
    assert settings.distributed_type.value == "FSDP" and settings.distributed_type.line == 3


def test_yaml_keys_get_the_fsdp_prefix_and_positions():
    document = parse_config(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  reshard_after_forward: true\n"
    )
    settings = {s.name: s for s in config_settings(document, "c.yaml")}
    assert settings["fsdp_version"].value == 2 and (settings["fsdp_version"].line, settings["fsdp_version"].column) == (
        4,
        3,
    )
    assert "fsdp_reshard_after_forward" in settings
    assert settings["distributed_type"].value == "FSDP"


def test_non_accelerate_yaml_is_not_a_config():
    assert parse_config("name: my-ci\non: push\n") is None
    assert (
        parse_config('{"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 4}').flavour == "deepspeed"
    )


def test_python_dash_m_spellings_of_the_launchers():
    text = "python -u -m accelerate.commands.launch --config_file ds.yaml train.py --lr 1\npython3 -m torch.distributed.run t.py\n"
    commands = parse_launch(text).commands
    assert [(c.launcher, c.script.text) for c in commands] == [("accelerate", "train.py"), ("torchrun", "t.py")]
    assert [(f.name, f.value) for f in commands[0].flags] == [("config_file", "ds.yaml")]


def test_a_backend_flag_wins_over_the_configs_distributed_type():
    config = parse_config("distributed_type: DEEPSPEED\nnum_processes: 2\n")
    text = "accelerate launch --config_file ds.yaml --multi_gpu train.py\n"
    launch = parse_launch(text)
    settings = LaunchSettings()
    for setting in [*config_settings(config, "ds.yaml"), *command_settings(launch.commands[0], launch, text, "run.sh")]:
        settings.set(setting)
    assert (settings.distributed_type.value, settings.distributed_type.spelling) == ("MULTI_GPU", "flag")

    megatron = "ACCELERATE_USE_MEGATRON_LM=true accelerate launch train.py\n"
    launch = parse_launch(megatron)
    settings = LaunchSettings()
    for setting in command_settings(launch.commands[0], launch, megatron, "run.sh"):
        settings.set(setting)
    assert settings.distributed_type.value == "MEGATRON_LM"


def test_a_plain_python_line_is_a_one_process_run():
    commands = parse_launch(
        "python -W ignore -u train.py --lr 1\npython -m pip install x\npython -c 'print(1)'\n"
    ).commands
    assert [(c.launcher, c.script.text) for c in commands] == [("python", "train.py")]


def test_merged_yaml_keys_have_no_position_and_do_not_crash_the_project_pass():
    document = parse_config(
        "base: &b\n  fsdp_use_orig_params: true\ndistributed_type: FSDP\nfsdp_config:\n  <<: *b\n  fsdp_version: 2\n"
    )
    assert document.key_position("fsdp_config", "fsdp_use_orig_params") is None
    assert document.key_position("fsdp_config", "fsdp_version") == (6, 3)
    settings = {s.name: s for s in config_settings(document, "c.yaml")}
    assert settings["fsdp_use_orig_params"].value is True


def test_a_shell_variable_reaches_the_launch_only_once_exported():
    launch = parse_launch("FSDP_VERSION=2\nFSDP_USE_ORIG_PARAMS=true\nexport FSDP_USE_ORIG_PARAMS\ntorchrun train.py\n")
    assert [(name, value) for name, value, _ in launch.exports] == [("FSDP_USE_ORIG_PARAMS", "true")]


MARKDOWN = """\
# Train

```bash
$ accelerate launch --use_deepspeed \\
    --num_processes 2 train.py
```

~~~console
(venv) $ torchrun --nproc_per_node 2 eval.py
torchrun --nproc_per_node 9 output.py
~~~

```python
subprocess.run("accelerate launch other.py")
```

```
deepspeed --num_gpus 2 ds.py
```
"""


def test_markdown_shell_blocks_keep_the_markdown_offsets():
    from pathlib import Path

    from lintdist.sources import launch_text

    shell = launch_text(MARKDOWN, Path("README.md"))
    assert len(shell) == len(MARKDOWN)
    assert [i for i, c in enumerate(shell) if c == "\n"] == [i for i, c in enumerate(MARKDOWN) if c == "\n"]
    launch = parse_launch(shell)
    assert [(c.launcher, c.script.text) for c in launch.commands] == [
        ("accelerate", "train.py"),
        ("torchrun", "eval.py"),
        ("deepspeed", "ds.py"),
    ]
    first = launch.commands[0].flags[0]
    assert MARKDOWN[first.token.start : first.token.end] == "--use_deepspeed"
    assert launch_text(MARKDOWN, Path("run.sh")) is MARKDOWN


def test_a_readme_block_links_the_script_it_names(lintdist, tmp_path):
    import json

    (tmp_path / "train.py").write_text(
        "from accelerate import Accelerator\nfrom accelerate.local_sgd import LocalSGD\n\n"
        "accelerator = Accelerator()\nwith LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=4) as sgd:\n"
        "    sgd.step()\n"
    )
    (tmp_path / "README.md").write_text(MARKDOWN)
    result = lintdist("check", "--no-cache", "--output-format", "json", str(tmp_path / "train.py"))
    [finding] = json.loads(result.output)
    assert finding["code"] == "LD303"
    assert "README.md:4" in finding["message"]


SLURM_AND_MPI = """\
#!/bin/bash
#SBATCH --nodes=2
srun -N 2 --ntasks-per-node=1 --gres=gpu:8 torchrun --nnodes "$SLURM_NNODES" --nproc_per_node 8 train.py --lr 1
mpirun --allow-run-as-root --mca btl tcp,self -np 4 python -u eval.py
srun -n1 ./probe.py
srun --label hostname
mpiexec -n 2 python -m accelerate.commands.launch --num_processes 2 tune.py
"""


def test_srun_and_mpiexec_lines_keep_their_own_options_apart_from_the_launcher_they_start():
    commands = parse_launch(SLURM_AND_MPI).commands
    assert [(c.launcher, c.script.text, c.wrapper and c.wrapper.launcher) for c in commands] == [
        ("torchrun", "train.py", "srun"),
        ("mpiexec", "eval.py", None),
        ("srun", "./probe.py", None),
        ("accelerate", "tune.py", "mpiexec"),
    ]
    torchrun = commands[0]
    assert [(f.name, f.value) for f in torchrun.flags] == [("nnodes", "$SLURM_NNODES"), ("nproc_per_node", "8")]
    assert [(f.name, f.value) for f in torchrun.wrapper.flags] == [
        ("N", "2"),
        ("ntasks_per_node", "1"),
        ("gres", "gpu:8"),
    ]
    assert ("np", "4") in [(f.name, f.value) for f in commands[1].flags]
    assert [(f.name, f.value) for f in commands[2].flags] == [("n", "1")]


def _launch_of(text: str, path: str = "run.sh"):
    from lintdist.launch import command_launch

    launch = parse_launch(text)
    [command] = launch.commands
    settings = LaunchSettings()
    for setting in command_settings(command, launch, text, path):
        settings.set(setting)
    found = command_launch(command, launch, settings, text, path)
    values = tuple(
        getattr(found, name).value if getattr(found, name) is not None else None
        for name in ("launcher", "under", "processes", "nodes", "rendezvous")
    )
    return values, found


def test_each_launch_line_says_its_launcher_counts_and_whether_it_sets_the_rendezvous():
    cases = {
        "mpirun -np 2 python train.py": ("mpiexec", None, 2, None, False),
        "mpiexec -n 1 python train.py": ("mpiexec", None, 1, 1, False),
        "srun -N 2 python train.py": ("srun", None, None, 2, False),
        "srun --nodes=2 --ntasks-per-node 4 python train.py": ("srun", None, 8, 2, False),
        "srun --ntasks=1 python train.py": ("srun", None, 1, 1, False),
        "srun -N 2-4 -n 8 python train.py": ("srun", None, 8, None, False),
        "srun -N 2 torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 train.py": ("torchrun", "srun", 16, 2, True),
        # an elastic range: the agents srun starts, one per node, are the nodes that meet
        "srun -N 2 torchrun --nnodes 1:4 --nproc_per_node 8 train.py": ("torchrun", "srun", 16, 2, True),
        "torchrun --nnodes 1:4 --nproc_per_node 8 train.py": ("torchrun", None, None, None, True),
        "torchrun --nproc_per_node 2 train.py": ("torchrun", None, 2, 1, True),
        "torchrun train.py": ("torchrun", None, 1, 1, True),
        "torchrun --nnodes 2 --nproc-per-node=gpu train.py": ("torchrun", None, None, 2, True),
        "PET_NNODES=2 torchrun --nproc_per_node 4 train.py": ("torchrun", None, 8, 2, True),
        "accelerate launch --num_processes 2 train.py": ("accelerate", None, 2, None, True),
        "accelerate launch --num_processes 16 --num_machines 2 train.py": ("accelerate", None, 16, 2, True),
        "deepspeed --num_gpus 2 train.py": ("deepspeed", None, None, None, True),
        "deepspeed --num_nodes 1 --num_gpus 2 train.py": ("deepspeed", None, 2, 1, True),
        "python train.py": ("python", None, 1, 1, False),
    }
    assert {text: _launch_of(text + "\n")[0] for text in cases} == cases


def test_a_launch_fact_says_where_it_was_said():
    text = "#!/bin/sh\nsrun -N 2 \\\n  torchrun --nproc_per_node 4 train.py\n"
    _, found = _launch_of(text, "job.sh")
    assert (found.nodes.words, found.nodes.line, found.nodes.path) == ("-N 2", 2, "job.sh")
    assert (found.launcher.words, found.launcher.line) == ("torchrun", 3)
    assert (found.under.words, found.under.line) == ("srun", 2)
    assert found.processes.value == 8 and found.processes.line == 3


def test_srun_and_mpiexec_options_are_not_launch_settings():
    text = "srun -n 2 --cpu-bind=cores python train.py\n"
    launch = parse_launch(text)
    assert command_settings(launch.commands[0], launch, text, "run.sh") == []


def test_markdown_blocks_carry_srun_and_mpirun_lines():
    from pathlib import Path

    from lintdist.sources import launch_text

    readme = (
        "# Cluster\n\n```console\n$ srun -N 2 \\\n    torchrun --nproc_per_node 8 train.py\n"
        "$ mpirun -np 4 python eval.py\nrank 0 ready\n```\n"
    )
    launch = parse_launch(launch_text(readme, Path("README.md")))
    assert [(c.launcher, c.script.text, c.wrapper and c.wrapper.launcher) for c in launch.commands] == [
        ("torchrun", "train.py", "srun"),
        ("mpiexec", "eval.py", None),
    ]
    srun = launch.commands[0].wrapper
    assert readme[srun.token.start : srun.token.end] == "srun"


def _python_facts(code: str):
    import libcst as cst

    from lintdist.facts import PythonFacts
    from lintdist.names import NameResolver
    from lintdist.syntax import SyntaxIndex

    index = SyntaxIndex(cst.parse_module(code))
    return PythonFacts(index, NameResolver(index))


def test_starts_processes_knows_spawns_launchers_and_process_objects():
    from lintdist.launch import starts_processes

    for code in (
        "import torch.multiprocessing as mp\nmp.spawn(main, nprocs=2)\n",
        "from torch.multiprocessing.spawn import start_processes\nstart_processes(main)\n",
        "from accelerate import notebook_launcher\nnotebook_launcher(main, num_processes=2)\n",
        "import multiprocessing\nmultiprocessing.Process(target=main).start()\n",
    ):
        assert starts_processes(_python_facts(code)), code
    for code in (
        "import torch.distributed as dist\ndist.init_process_group('nccl')\n",
        "from my_pool import Process\nProcess(main)\n",  # a class of the project's, not multiprocessing's
        "spawn(main)\n",  # nothing imports it: not torch's
    ):
        assert not starts_processes(_python_facts(code)), code


def test_most_nodes_reads_the_node_flag_the_elastic_maximum_and_the_starter():
    from lintdist.launch import most_nodes

    text = (
        "torchrun --nnodes 2 --nproc_per_node 8 train.py\n"
        "torchrun --nnodes 1:4 train.py\n"
        "accelerate launch --num_machines 1 train.py\n"
        'srun -N 3 torchrun --nnodes "$SLURM_NNODES" train.py\n'
        'torchrun --nnodes "$NNODES" train.py\n'
        "python train.py\n"
    )
    launch = parse_launch(text)
    found = [most_nodes(command, launch, text, "run.sh") for command in launch.commands]
    assert found[:3] == [(2, "--nnodes 2"), (4, "--nnodes 1:4"), (1, "--num_machines 1")]
    assert found[3][0] == 3 and "-N 3" in found[3][1]
    assert found[4:] == [(None, ""), (None, "")]


def test_config_beside_a_script_is_the_one_accelerate_config_of_its_folder(tmp_path):
    from lintdist.launch import config_beside

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    assert config_beside(script) is None
    (tmp_path / "default_config.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    (tmp_path / "data.yaml").write_text("paths: [a, b]\n")  # not an accelerate config
    path, document = config_beside(script)
    assert path.name == "default_config.yaml" and document.data["num_processes"] == 2
    (tmp_path / "fsdp.yaml").write_text("distributed_type: FSDP\n")
    assert config_beside(script) is None  # two: which one is meant is not said


def test_launchers_of_a_script_read_from_the_launch_files_and_pages_of_folders(tmp_path):
    from lintdist.launch import launchers_of

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    (tmp_path / "debug.sh").write_text("python train.py --steps 10\n")
    (tmp_path / "other.sh").write_text("torchrun --nproc_per_node 2 eval.py\n")
    assert launchers_of(script, [tmp_path]) == {"python"}
    (tmp_path / "README.md").write_text("Run:\n\n```bash\naccelerate launch train.py\n```\n")
    assert launchers_of(script, [tmp_path]) == {"python", "accelerate"}


def test_a_launch_path_is_read_beside_the_launch_file_then_from_the_one_folder_above_that_holds_it(tmp_path):
    from lintdist.launch import resolve_launch_path

    (tmp_path / ".git").mkdir()
    (tmp_path / "finetune.py").write_text("print(1)\n")
    (tmp_path / "scripts").mkdir()
    launch = tmp_path / "scripts" / "finetune_ds.sh"
    launch.write_text("torchrun --nproc_per_node 2 finetune.py\n")
    # meant to be run from the repository root, as Qwen's finetune/finetune_ds.sh is
    assert resolve_launch_path("finetune.py", launch) == tmp_path / "finetune.py"
    assert resolve_launch_path("configs/ds.json", launch) == Path("configs/ds.json")  # nowhere: as before
    (tmp_path / "scripts" / "finetune.py").write_text("print(2)\n")
    assert resolve_launch_path("finetune.py", launch) == tmp_path / "scripts" / "finetune.py"  # beside wins


def test_a_launch_path_held_by_two_folders_above_or_above_the_repository_is_not_guessed(tmp_path):
    from lintdist.launch import launch_roots, resolve_launch_path

    repo = tmp_path / "repo"
    deep = repo / "examples" / "sft" / "scripts"
    deep.mkdir(parents=True)
    launch = deep / "run.sh"
    launch.write_text("python train.py\n")
    (repo / "examples" / "sft" / "train.py").write_text("print(1)\n")
    assert resolve_launch_path("train.py", launch) == repo / "examples" / "sft" / "train.py"
    (repo / "train.py").write_text("print(2)\n")
    assert resolve_launch_path("train.py", launch) == Path("train.py")  # two candidates: which one is not said
    (repo / "examples" / "sft" / "train.py").unlink()
    (repo / ".git").mkdir()
    (tmp_path / "eval.py").write_text("print(3)\n")
    assert launch_roots(launch) == [repo / "examples" / "sft", repo / "examples", repo]
    assert resolve_launch_path("eval.py", launch) == Path("eval.py")  # above the repository root: not its file
    (repo / "run.sh").write_text("python eval.py\n")
    assert launch_roots(repo / "run.sh") == []


def test_a_script_named_from_a_launch_file_below_the_root_is_linked_whatever_the_cwd(lintdist, tmp_path):
    import json

    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    (project / "train.py").write_text("from accelerate import Accelerator\naccelerator = Accelerator()\n")
    (project / "default_config.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 4\n")
    (project / "scripts" / "run.sh").write_text("python train.py --lr 1e-4\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd in (project, elsewhere):
        result = lintdist("check", "--no-cache", "--select", "LD412", "--output-format", "json", str(project), cwd=cwd)
        [finding] = json.loads(result.output)
        assert finding["filename"].endswith("run.sh")
        assert "`accelerate launch --config_file default_config.yaml train.py`" in finding["message"]
