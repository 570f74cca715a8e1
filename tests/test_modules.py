"""The module graph: imports of the project's own code resolve to its files, questions cross modules."""

from __future__ import annotations

import shutil
from pathlib import Path

import libcst as cst
import pytest
from libcst.helpers import get_full_name_for_node

from lintdist.facts import PythonFacts
from lintdist.modules import absolute, import_root, imported_files, module_names, resolve_module, resolve_name
from lintdist.project import Project, reset_process_project


@pytest.fixture(autouse=True)
def fresh_project():
    reset_process_project()
    yield
    reset_process_project()


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def function(facts: PythonFacts, name: str) -> cst.FunctionDef:
    return next(f for f in facts.functions[name])


def test_packages_src_layout_and_scripts_resolve(tmp_path):
    write(
        tmp_path,
        {
            "src/pkg/__init__.py": "",
            "src/pkg/train.py": "",
            "src/pkg/utils/__init__.py": "",
            "src/pkg/utils/ckpt.py": "",
            "scripts/run.py": "",
            "scripts/helpers.py": "",
            "scripts/data/loaders.py": "",  # a namespace package: no __init__.py
        },
    )
    train = (tmp_path / "src/pkg/train.py").resolve()
    assert import_root(train) == tmp_path / "src"
    assert module_names(train) == ("pkg.train", "train")
    assert resolve_module("pkg.utils.ckpt", train) == (tmp_path / "src/pkg/utils/ckpt.py").resolve()
    assert resolve_module("pkg.utils", train) == (tmp_path / "src/pkg/utils/__init__.py").resolve()
    assert resolve_module("torch.nn", train) is None  # an installed library stays a name
    run = (tmp_path / "scripts/run.py").resolve()
    assert resolve_name("helpers.save", run) == ((tmp_path / "scripts/helpers.py").resolve(), "save")
    assert resolve_name("data.loaders.build", run) == ((tmp_path / "scripts/data/loaders.py").resolve(), "build")
    # a script in no package also sees the folder above it (run from the repository): `src` here
    assert resolve_module("src.pkg.utils", run) == (tmp_path / "src/pkg/utils/__init__.py").resolve()
    assert resolve_module("pkg.utils", run) is None


def test_imports_found_in_the_text_resolve_to_files(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/train.py": (
                "import os, torch\n"
                "import pkg.data as data\n"
                "from . import utils\n"
                "from .engine import (\n    Trainer,\n    evaluate,\n)\n"
                "def main():\n    from pkg.ckpt import save  # a function-level import\n"
            ),
            "pkg/data.py": "",
            "pkg/utils.py": "",
            "pkg/engine.py": "",
            "pkg/ckpt.py": "",
        },
    )
    train = (tmp_path / "pkg/train.py").resolve()
    found = [p.name for p in imported_files(train, train.read_text())]
    assert found == ["data.py", "__init__.py", "utils.py", "engine.py", "ckpt.py"]


def test_relative_names_are_made_absolute(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/sub/__init__.py": "", "pkg/sub/train.py": ""})
    train = (tmp_path / "pkg/sub/train.py").resolve()
    assert absolute("..utils.save", train) == "pkg.utils.save"
    assert absolute(".loops.run", train) == "pkg.sub.loops.run"
    assert absolute(".", (tmp_path / "pkg/sub/__init__.py").resolve()) == "pkg.sub"
    assert absolute("torch.save", train) == "torch.save"


def test_definitions_follow_reexports(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from .engine import Trainer\n",
            "pkg/engine.py": "class Trainer:\n    def __init__(self, accelerator):\n        self.accelerator = accelerator\n",
            "train.py": "from pkg import Trainer\n",
        },
    )
    project = Project()
    found = project.definition("pkg.Trainer", (tmp_path / "train.py").resolve())
    assert found is not None
    facts, node = found
    assert isinstance(node, cst.ClassDef) and node.name.value == "Trainer"
    assert facts.project.path == (tmp_path / "pkg/engine.py").resolve()


def test_callers_in_other_modules_with_their_guards(tmp_path):
    write(
        tmp_path,
        {
            "lib/__init__.py": "",
            "lib/data.py": "def build(args):\n    return load_dataset('x')\n\ndef other():\n    pass\n",
            "main.py": (
                "import torch.distributed as dist\n"
                "from lib.data import build\n"
                "from lib import data as d\n\n"
                "def main(args):\n"
                "    if dist.get_rank() == 0:\n"
                "        build(args)\n"
                "    d.build(args)\n\n"
                "main(None)\n"
            ),
        },
    )
    project = Project()
    data = project.facts((tmp_path / "lib/data.py").resolve())
    build = function(data, "build")
    sites = data.external_call_sites(build)
    assert [site.path.name for site in sites] == ["main.py", "main.py"]
    reaches = [site.facts.all_ranks_reach(site.call).value for site in sites]
    assert reaches == [False, True]
    answer = data.all_ranks_reach(build.body.body[0])
    assert answer.value is False and answer.why == "main.py:6"
    assert data.all_ranks_reach(function(data, "other").body.body[0]).value is None


def test_methods_called_on_instances_built_elsewhere(tmp_path):
    write(
        tmp_path,
        {
            "trainer.py": (
                "class Trainer:\n"
                "    def __init__(self, accelerator):\n"
                "        self.accelerator = accelerator\n\n"
                "    def fit(self):\n"
                "        self.accelerator.wait_for_everyone()\n"
            ),
            "train.py": (
                "from accelerate import Accelerator\n"
                "from trainer import Trainer\n\n"
                "trainer = Trainer(Accelerator())\n"
                "trainer.fit()\n"
            ),
        },
    )
    project = Project()
    facts = project.facts((tmp_path / "trainer.py").resolve())
    fit = function(facts, "fit")
    assert facts.all_ranks_reach(fit.body.body[0]).value is True
    receiver = fit.body.body[0].body[0].value.func.value  # self.accelerator
    assert facts.is_accelerator(receiver, receiver)


def test_returned_loader_and_module_global_reach_the_importer(tmp_path):
    write(
        tmp_path,
        {
            "setup.py": "from accelerate import Accelerator\n\naccelerator = Accelerator()\n",
            "data.py": (
                "from torch.utils.data import DataLoader, DistributedSampler\n\n"
                "def loader(ds):\n"
                "    return DataLoader(ds, sampler=DistributedSampler(ds))\n"
            ),
            "train.py": (
                "from setup import accelerator\nfrom data import loader\n\nbatches = loader(None)\n"
                "accelerator.wait_for_everyone()\n"
            ),
        },
    )
    project = Project()
    facts = project.facts((tmp_path / "train.py").resolve())
    statement = facts.index.module.body[2].body[0]
    use = facts.distributed_sampler(statement.targets[0].target, statement)
    assert use is not None and use.shuffle is True
    assert facts.stand_in_note(use.loader) == "returned by `data.loader`"
    call = facts.index.module.body[3].body[0].value
    assert facts.is_accelerator(call.func.value, call)
    assert not facts.is_accelerator(cst.parse_expression("accelerator"), call)  # a detached name is not the import


def test_editing_a_dependency_rechecks_its_dependents_only(tmp_path, monkeypatch):
    from lintdist import runner
    from lintdist.config import resolve_settings

    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "project" / "ddp_epoch_helper"
    project = tmp_path / "project"
    shutil.copytree(fixture, project, ignore=shutil.ignore_patterns("*.expected", "*.fixed.*"))
    (project / "notes.py").write_text("import torch.distributed as dist\n\ndist.barrier()\n")  # imports nothing here
    checked: list[str] = []
    real = runner.process

    def counting(task):
        checked.append(Path(task.candidate.display).name)
        return real(task)

    monkeypatch.setattr(runner, "process", counting)
    monkeypatch.chdir(project)
    settings = resolve_settings(None, project)

    def codes() -> list[tuple[str, str]]:
        result = runner.run(["."], settings, jobs=1)
        return sorted((Path(f.filename).name, f.code) for f in result.findings)

    assert codes() == [("loops.py", "LD103"), ("main.py", "LD405")]
    checked.clear()
    assert codes() == [("loops.py", "LD103"), ("main.py", "LD405")]
    assert checked == []  # warm: nothing re-checked
    helper = project / "engine" / "checkpoint.py"
    helper.write_text(helper.read_text().replace("    dist.all_gather_object(gathered, metrics)\n", ""))
    assert codes() == [("loops.py", "LD103")]  # main.py's guarded call reaches no collective any more
    assert sorted(checked) == ["checkpoint.py", "main.py"]  # the edited file and its dependent, not the others


def test_attributes_set_in_a_base_class_reach_subclass_methods(tmp_path):
    write(
        tmp_path,
        {
            "base.py": (
                "from accelerate import Accelerator\n\n"
                "class BaseTrainer:\n"
                "    def __init__(self):\n"
                "        self.accelerator = Accelerator()\n"
            ),
            "trainer.py": (
                "from base import BaseTrainer\n\n"
                "class Local(BaseTrainer):\n"
                "    pass\n\n"
                "class Trainer(Local):\n"
                "    def save(self):\n"
                "        self.accelerator.save_state('out')\n"
            ),
        },
    )
    project = Project()
    facts = project.facts((tmp_path / "trainer.py").resolve())
    call = next(c for c in facts.calls if facts.method_name(c) == "save_state")
    assert facts.is_accelerator(call.func.value, call)
    assert facts.stand_in_note(facts.origins(call.func.value, call)[0].node) == "set in `base.BaseTrainer`"


def test_findings_do_not_depend_on_how_files_are_shared_between_workers():
    from lintdist.config import resolve_settings
    from lintdist.runner import run

    projects = Path(__file__).resolve().parent.parent / "fixtures" / "project"
    settings = resolve_settings(None, projects)
    alone = run([str(projects)], settings, jobs=1, use_cache=False)
    shared = run([str(projects)], settings, jobs=2, use_cache=False)
    assert [f.to_json() for f in alone.findings] == [f.to_json() for f in shared.findings]
    assert {f.code for f in alone.findings} >= {"LD103", "LD106", "LD201", "LD203", "LD204", "LD405"}


def test_modules_that_cannot_make_the_value_asked_for_are_not_parsed(tmp_path):
    """A question parses another module only if its text can make what the question looks for: a base class whose
    module builds no Accelerator, wrapper or loader, a class used as a value (`Mode.TRAIN`), a helper whose module
    names no collective. The same shapes with the value in sight are followed."""
    write(
        tmp_path,
        {
            "base.py": "class Base:\n    def __init__(self):\n        self.device = 'cpu'\n",
            "modes.py": "import enum\n\nclass Mode(enum.Enum):\n    TRAIN = 1\n",
            "report.py": "def write(path):\n    open(path, 'w').write('done')\n",
            "sync.py": "import torch.distributed as dist\n\ndef write(path):\n    dist.barrier()\n",
            "train.py": (
                "import torch.distributed as dist\n"
                "from base import Base\nfrom modes import Mode\nimport report\nimport sync\n\n"
                "class Trainer(Base):\n"
                "    def run(self):\n"
                "        if self.device.is_main_process:\n"
                "            self.device.save_state('out')\n"
                "        mode = Mode.TRAIN\n"
                "        if dist.get_rank() == 0:\n"
                "            report.write('log')\n"
                "            sync.write('log')\n"
            ),
        },
    )
    from lintdist import runner
    from lintdist.config import resolve_settings

    project = Project()
    path = (tmp_path / "train.py").resolve()
    facts = project.facts(path)
    call = next(c for c in facts.calls if facts.method_name(c) == "save_state")
    facts.is_accelerator(call.func.value, call)
    mode = next(c for c in facts.index.nodes(cst.Attribute) if get_full_name_for_node(c) == "Mode.TRAIN")
    facts.is_accelerator(mode, mode)
    parsed = {p.name for p, f in project._analysed.items() if f is not None}
    assert parsed == {"train.py"}, parsed
    result = runner.run([str(path)], resolve_settings(None, tmp_path), jobs=1)
    # `self.device` is known by its API (`is_main_process`, `save_state`); `sync.write` reaches a barrier
    assert [(f.code, f.span.line) for f in result.findings] == [("LD405", 10), ("LD405", 14)]


def test_a_project_too_large_to_search_answers_unknown_and_reads_nothing(tmp_path, monkeypatch):
    """Past ``MAX_PROJECT_FILES`` (a script in a home folder) no file is read for callers, and the answer is
    "unknown", never "no caller": a barrier fix needs every caller known."""
    from lintdist import modules

    files = {
        "helper.py": "def build(args):\n    return 1\n",
        "main.py": "import torch.distributed as dist\nfrom helper import build\n\nif dist.get_rank() == 0:\n    build(1)\n",
    }
    files.update({f"notes_{i}.py": "x = 1\n" for i in range(4)})
    write(tmp_path, files)
    project = Project()
    helper = project.facts((tmp_path / "helper.py").resolve())
    build = function(helper, "build")
    assert [site.path.name for site in helper.external_call_sites(build)] == ["main.py"]
    assert helper.all_ranks_reach(build.body.body[0]).value is False

    reset_process_project()
    monkeypatch.setattr(modules, "MAX_PROJECT_FILES", 3)
    project = Project()
    helper = project.facts((tmp_path / "helper.py").resolve())
    build = function(helper, "build")
    assert helper.external_call_sites(build) == []
    assert helper.all_ranks_reach(build.body.body[0]).value is None  # unknown, so no barrier fix
    assert {p.name for p in project._texts} <= {"helper.py"}  # no other file was read


def test_a_main_flag_defined_in_another_module_is_read_from_its_definition(tmp_path):
    layout = (
        "import os\n\n\n"
        "class Layout:\n"
        "    rank = int(os.environ.get('RANK', '0'))\n\n"
        "    @property\n"
        "    def is_global_main(self):\n"
        "        return self.rank == 0\n\n"
        "    @property\n"
        "    def is_main_stage(self):\n"
        "        return self.rank == self.stages - 1\n\n"
        "    @classmethod\n"
        "    def current(cls):\n"
        "        return cls()\n"
    )
    train = (
        "from layout import Layout\n\n"
        "env = Layout.current()\n"
        "if env.is_global_main:\n"
        "    pass\n"
        "if env.is_main_stage:\n"
        "    pass\n"
    )
    write(tmp_path, {"layout.py": layout, "train.py": train})
    project = Project()
    facts = project.facts((tmp_path / "train.py").resolve())
    first, second = (i.test for i in facts.index.nodes(cst.If))
    assert facts.project_main_flag(first) is True
    assert facts.main_when(first, True)
    assert facts.project_main_flag(second) is False  # the last pipeline stage, not the main process
    assert not facts.main_when(second, True)


def test_a_reach_names_the_calls_in_other_modules_it_was_followed_through(tmp_path):
    write(
        tmp_path,
        {
            "ckpt.py": "import torch\n\ndef keep(state, path):\n    torch.save(state, path)\n",
            "engine.py": "import ckpt\n\ndef run(model, steps):\n    for step in range(steps):\n        ckpt.keep({}, 'a.pt')\n",
            "train.py": (
                "import torch\n"
                "import torch.distributed as dist\n"
                "from engine import run\n\n"
                "dist.init_process_group('nccl')\n"
                "run(torch.nn.parallel.DistributedDataParallel(net), 10)\n"
            ),
            "evaluate.py": "from ckpt import keep\n\nkeep({}, 'b.pt')\n",
        },
    )
    project = Project()
    helper = project.facts((tmp_path / "ckpt.py").resolve())
    save = function(helper, "keep").body.body[0]
    answer = helper.all_ranks_reach(save)
    assert answer.value is True
    assert sorted(other.where(call) for other, call in answer.through) == ["engine.py:5", "evaluate.py:3", "train.py:6"]
    assert [other.where(call) for other, call in answer.from_distributed_callers] == ["train.py:6"]
    assert (
        not helper.sets_up_processes() and not project.facts((tmp_path / "evaluate.py").resolve()).sets_up_processes()
    )


def test_a_word_is_searched_in_every_module_under_the_import_root(tmp_path):
    import re

    from lintdist.project import ProjectView, mentioned_in_project

    write(
        tmp_path,
        {
            "trainer.py": "class Rollout:\n    pass\n",
            "engines.py": "import deepspeed\nengine, *_ = deepspeed.initialize(model=net, config=cfg)\n",
            "main.py": "from trainer import Rollout\nRollout()\n",
        },
    )
    project = Project()
    view = ProjectView(project, tmp_path / "trainer.py")
    kept = re.compile(r"HfDeepSpeedConfig|\bTrainer\(")
    assert mentioned_in_project(view, kept) is False  # `Rollout(` is no `Trainer(`
    (tmp_path / "main.py").write_text("from transformers.integrations import HfDeepSpeedConfig\n", encoding="utf-8")
    assert mentioned_in_project(ProjectView(Project(), tmp_path / "trainer.py"), kept) is True
    with project.recording() as read:
        mentioned_in_project(view, re.compile("nowhere"))
    assert {path.name for path in read} == {"trainer.py", "engines.py", "main.py"}
