"""Which file a call writes or reads, and what a path is (lintdist.file_io)."""

from __future__ import annotations

import textwrap

import libcst as cst

from lintdist.facts import PythonFacts
from lintdist.file_io import (
    in_memory,
    path_values,
    per_item_path,
    read_files,
    saved_on_main_only,
    temporary_path,
    written_file,
)
from lintdist.loop import TrainingLoop
from lintdist.names import NameResolver
from lintdist.syntax import SyntaxIndex


def _facts(code: str) -> PythonFacts:
    index = SyntaxIndex(cst.parse_module(textwrap.dedent(code)))
    return PythonFacts(index, NameResolver(index))


def _call(facts: PythonFacts, prefix: str) -> cst.Call:
    module = facts.index.module
    return next(c for c in facts.calls if module.code_for_node(c).startswith(prefix))


def _code(facts: PythonFacts, node: cst.CSTNode | None) -> str | None:
    return None if node is None else facts.index.module.code_for_node(node)


SCRIPT = """
    import torch
    from accelerate import Accelerator
    from safetensors.torch import save_file, load_file

    accelerator = Accelerator()
    torch.save(state, "model.pt")
    save_file(tensors, filename="w.safetensors")
    accelerator.save(state, "acc.pt")
    accelerator.save_state("ckpt")
    model.save_pretrained("out", is_main_process=accelerator.is_main_process)
    tokenizer.save_pretrained("out")
    store.save("not a file we know")
    torch.load("model.pt")
    load_file("w.safetensors")
    accelerator.load_state("ckpt")
    PeftModel.from_pretrained(base, "adapter")
    AutoModel.from_pretrained(pretrained_model_name_or_path="gpt2")
    json.load(handle)
"""


def test_written_file_says_the_path_and_whether_the_api_writes_on_the_main_process_only() -> None:
    facts = _facts(SCRIPT)
    found = {
        prefix: (_code(facts, w[0]), w[1]) if (w := written_file(facts, _call(facts, prefix))) else None
        for prefix in ("torch.save", "save_file", "accelerator.save(", "accelerator.save_state", "model.save", "tok")
    }
    assert found == {
        "torch.save": ('"model.pt"', False),
        "save_file": ('"w.safetensors"', False),
        "accelerator.save(": ('"acc.pt"', True),
        "accelerator.save_state": ('"ckpt"', True),
        "model.save": ('"out"', True),
        "tok": ('"out"', False),
    }
    assert written_file(facts, _call(facts, "store.save")) is None
    assert written_file(facts, _call(facts, "torch.load")) is None


def test_read_files_gives_every_path_a_call_may_read() -> None:
    facts = _facts(SCRIPT)

    def paths(prefix: str) -> list[str] | None:
        found = read_files(facts, _call(facts, prefix))
        return None if found is None else [_code(facts, p) for p in found]

    assert paths("torch.load") == ['"model.pt"']
    assert paths("load_file") == ['"w.safetensors"']
    assert paths("accelerator.load_state") == ['"ckpt"']
    assert paths("PeftModel") == ["base", '"adapter"']
    assert paths("AutoModel") == ['"gpt2"']
    assert paths("json.load") is None
    assert paths("torch.save") is None


def test_paths_match_by_value_through_names() -> None:
    facts = _facts(
        """
        import os
        path = os.path.join(args.output_dir, "model.pt")
        torch.save(state, path)
        torch.load(os.path.join(args.output_dir, "model.pt"))
        torch.load(other)
        """
    )
    save, load, other = facts.calls[1], _call(facts, "torch.load(os"), _call(facts, "torch.load(other")
    written = path_values(facts, save.args[1].value, save)
    assert written & path_values(facts, load.args[0].value, load)
    assert not written & path_values(facts, other.args[0].value, other)


def test_temporary_folders_and_buffers_are_this_process_own() -> None:
    facts = _facts(
        """
        import io, tempfile
        with tempfile.TemporaryDirectory() as folder:
            torch.save(state, f"{folder}/m.pt")
        scratch = tempfile.NamedTemporaryFile()
        torch.save(state, scratch)
        torch.save(state, "shared/m.pt")
        buffer = io.BytesIO()
        torch.save(state, buffer)
        """
    )
    saves = [c for c in facts.calls if facts.method_name(c) == "save"]
    paths = [(s.args[1].value, s) for s in saves]
    assert [temporary_path(facts, p, s) for p, s in paths] == [True, True, False, False]
    assert [in_memory(facts, p, s) for p, s in paths] == [False, False, False, True]


def test_a_path_per_item_of_a_loop_but_not_per_step_or_batch() -> None:
    facts = _facts(
        """
        for image_path in image_paths:
            torch.save(encode(image_path), f"{image_path}.pt")
        for epoch in range(10):
            torch.save(state, f"epoch{epoch}.pt")
        for step, batch in enumerate(train_loader):
            torch.save(state, f"step{step}.pt")
        for name in names:
            torch.save(state, "fixed.pt")
        """
    )
    loop = TrainingLoop(facts)
    saves = [c for c in facts.calls if facts.method_name(c) == "save"]
    assert [per_item_path(facts, loop, s.args[1].value, s) for s in saves] == [True, False, False, False]


def test_saved_on_main_only_is_the_object_of_an_accelerator_save() -> None:
    facts = _facts(
        """
        from accelerate import Accelerator
        accelerator = Accelerator()
        accelerator.save(state, "a.pt")
        torch.save(state, "b.pt")
        accelerator.save(other, state)
        """
    )
    arguments = [(facts.parent(n), n) for n in facts.index.nodes(cst.Name) if n.value == "state"]
    assert [saved_on_main_only(facts, arg) for arg, _ in arguments] == [True, False, False]


def test_file_writes_and_reads_in_the_order_of_the_file():
    from lintdist.file_io import file_reads, file_writes

    facts = _facts(
        """
        import torch
        from accelerate import Accelerator

        accelerator = Accelerator()
        torch.save(state, "ckpt.pt")
        accelerator.save_state("out")
        model.save_pretrained("out", is_main_process=accelerator.is_main_process)
        state = torch.load("ckpt.pt")
        model = Model.from_pretrained("out")
        plan.save()
        """
    )
    writes = [(_code(facts, call.func), _code(facts, path), main) for call, path, main in file_writes(facts)]
    assert writes == [
        ("torch.save", '"ckpt.pt"', False),
        ("accelerator.save_state", '"out"', True),
        ("model.save_pretrained", '"out"', True),
    ]
    reads = [(_code(facts, call.func), [_code(facts, p) for p in paths]) for call, paths in file_reads(facts)]
    assert reads == [("torch.load", ['"ckpt.pt"']), ("Model.from_pretrained", ['"out"'])]
