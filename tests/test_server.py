"""`lintdist server`: a real client conversation over stdio (pygls's client talking to `python -m lintdist server`).

initialize, open a broken script, diagnostics pushed (code, severity, range, documentation link), the same
diagnostics pulled, the quick fix applied as a workspace edit, the change sent, diagnostics cleared; a suppression
action; fix all safe; a script linked to its accelerate config and a YAML document; the result equal to `lintdist
check` on the saved file; shutdown and exit.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("pygls", reason="the language server needs pygls (the `server` extra)")
from lsprotocol import types
from pygls.lsp.client import LanguageClient

from lintdist.server import _offset_position, _position

BROKEN = """\
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler


def train(dataset, model, optimizer, epochs=3):
    dist.init_process_group("gloo")
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    for epoch in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
"""

FSDP_CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_sharding_strategy: FULL_SHARD
mixed_precision: bf16
num_processes: 2
"""


def _apply(text: str, edits: list[types.TextEdit]) -> str:
    lines = text.splitlines(keepends=True)

    def offset(position: types.Position) -> int:
        return sum(len(line) for line in lines[: position.line]) + position.character

    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]
    return text


class Conversation:
    def __init__(self) -> None:
        self.client = LanguageClient("lintdist-test", "1")
        self.published: dict[str, asyncio.Queue] = {}
        self.logs: list[str] = []

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
            self.queue(params.uri).put_nowait(params.diagnostics)

        @self.client.feature(types.WINDOW_LOG_MESSAGE)
        def on_log(params: types.LogMessageParams) -> None:
            self.logs.append(params.message)

    def queue(self, uri: str) -> asyncio.Queue:
        return self.published.setdefault(uri, asyncio.Queue())

    async def diagnostics(self, uri: str) -> list[types.Diagnostic]:
        return list(await asyncio.wait_for(self.queue(uri).get(), timeout=30))

    def open(self, path: Path, language: str = "python") -> str:
        uri = path.as_uri()
        item = types.TextDocumentItem(uri=uri, language_id=language, version=1, text=path.read_text())
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(text_document=item))
        return uri

    async def actions(self, uri: str, diagnostics, only=None) -> list[types.CodeAction]:
        whole = types.Range(types.Position(0, 0), types.Position(10_000, 0))
        params = types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=whole,
            context=types.CodeActionContext(diagnostics=diagnostics, only=only),
        )
        return await self.client.text_document_code_action_async(params) or []


def _check(lintdist, path: Path) -> list[tuple[str, int, int]]:
    out = json.loads(lintdist("check", "--no-cache", "--output-format", "json", str(path)).output)
    return [(f["code"], f["line"], f["column"]) for f in out]


def test_a_client_conversation_over_stdio(tmp_path, lintdist):
    script = tmp_path / "train.py"
    script.write_text(BROKEN)
    fsdp = tmp_path / "fsdp" / "train.py"
    fsdp.parent.mkdir()
    fsdp.write_text(
        "from accelerate import Accelerator\n\naccelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
        "if accelerator.is_main_process:\n    accelerator.save_state('ckpt')\n"
    )
    (fsdp.parent / "config.yaml").write_text(FSDP_CONFIG)
    project = tmp_path / "project"
    fixture = Path(__file__).resolve().parent.parent / "fixtures" / "project" / "ddp_epoch_helper"
    shutil.copytree(fixture, project, ignore=shutil.ignore_patterns("*.expected", "*.fixed.*"))
    expected = _check(lintdist, script)
    expected_fsdp = _check(lintdist, fsdp)
    assert expected and expected_fsdp

    async def talk() -> None:
        talk = Conversation()
        client = talk.client
        await client.start_io(sys.executable, "-m", "lintdist", "server")
        result = await client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                root_uri=tmp_path.as_uri(),
                initialization_options={"debounce": 0.05},
            )
        )
        assert result.capabilities.code_action_provider is not None
        assert result.capabilities.diagnostic_provider is not None
        client.initialized(types.InitializedParams())

        # open: pushed diagnostics equal the CLI's findings
        uri = talk.open(script)
        pushed = await talk.diagnostics(uri)
        assert [(d.code, d.range.start.line + 1, d.range.start.character + 1) for d in pushed] == expected
        first = pushed[0]
        assert first.code == "LD201" and first.source == "lintdist"
        assert first.severity == types.DiagnosticSeverity.Error
        assert first.code_description.href.endswith("#ld201")

        # pull
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        assert [(d.code, d.range) for d in report.items] == [(d.code, d.range) for d in pushed]

        # quick fix and suppression for the finding
        actions = await talk.actions(uri, [first], only=[types.CodeActionKind.QuickFix])
        titles = [a.title for a in actions]
        assert any(t.startswith("Fix LD201") for t in titles), titles
        assert "Suppress LD201 on this line" in titles
        fix = next(a for a in actions if a.title.startswith("Fix LD201"))
        fixed = _apply(BROKEN, fix.edit.changes[uri])
        suppress = next(a for a in actions if a.title.startswith("Suppress"))
        suppressed = _apply(BROKEN, suppress.edit.changes[uri])
        assert "# lintdist: ignore[LD201]" in suppressed.splitlines()[first.range.start.line]

        # fix all safe gives the same text as `lintdist check --fix`
        every = await talk.actions(uri, [], only=["source.fixAll.lintdist"])
        assert [a.kind for a in every] == ["source.fixAll.lintdist"]
        copy = tmp_path / "copy" / "train.py"
        copy.parent.mkdir()
        copy.write_text(BROKEN)
        lintdist("check", "--no-cache", "--fix", str(copy))
        assert _apply(BROKEN, every[0].edit.changes[uri]) == copy.read_text()

        # the change with the fix applied: diagnostics cleared (after the debounce)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=fixed)],
            )
        )
        assert await talk.diagnostics(uri) == []

        # a script linked to its FSDP config (project pass), and the config itself
        fsdp_uri = talk.open(fsdp)
        linked = await talk.diagnostics(fsdp_uri)
        assert [(d.code, d.range.start.line + 1, d.range.start.character + 1) for d in linked] == expected_fsdp
        config_uri = talk.open(fsdp.parent / "config.yaml", language="yaml")
        await talk.diagnostics(config_uri)  # a YAML document is read without error

        # a notebook document: each cell gets the diagnostics of its own lines
        notebook_uri = (tmp_path / "explore.ipynb").as_uri()
        cells = [
            "!pip install -q \\\n    datasets\n",
            "from datasets import load_dataset\nfrom accelerate import Accelerator\n",
            "accelerator = Accelerator()\nraw = load_dataset('imdb').map(len)\n",
        ]
        cell_uris = [f"vscode-notebook-cell:{tmp_path / 'explore.ipynb'}#c{i}" for i in range(len(cells))]
        client.notebook_document_did_open(
            types.DidOpenNotebookDocumentParams(
                notebook_document=types.NotebookDocument(
                    uri=notebook_uri,
                    notebook_type="jupyter-notebook",
                    version=1,
                    cells=[types.NotebookCell(kind=types.NotebookCellKind.Code, document=u) for u in cell_uris],
                ),
                cell_text_documents=[
                    types.TextDocumentItem(uri=u, language_id="python", version=1, text=t)
                    for u, t in zip(cell_uris, cells)
                ],
            )
        )
        per_cell = [await talk.diagnostics(u) for u in cell_uris]
        assert [[(d.code, d.range.start.line) for d in found] for found in per_cell] == [[], [], [("LD401", 1)]]
        pulled = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=cell_uris[2]))
        )
        assert [(d.code, d.range.start.line) for d in pulled.items] == [("LD401", 1)]

        # a dependency edited in the editor (unsaved) re-checks the open script that reads it
        main_uri = talk.open(project / "main.py")
        assert [d.code for d in await talk.diagnostics(main_uri)] == ["LD405"]
        helper = project / "engine" / "checkpoint.py"
        helper_uri = talk.open(helper)
        assert await talk.diagnostics(helper_uri) == []
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=helper_uri, version=2),
                content_changes=[
                    types.TextDocumentContentChangeWholeDocument(
                        text=helper.read_text().replace("    dist.all_gather_object(gathered, metrics)\n", "")
                    )
                ],
            )
        )
        assert await talk.diagnostics(helper_uri) == []
        assert await talk.diagnostics(main_uri) == []  # main.py's guarded call reaches no collective any more

        # an unreadable document is a logged message, not a dead server
        broken_uri = (tmp_path / "bad.py").as_uri()
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(uri=broken_uri, language_id="python", version=1, text="def (:\n")
            )
        )
        syntax = await talk.diagnostics(broken_uri)
        assert [d.code for d in syntax] == ["LD001"]

        await client.shutdown_async(None)
        client.exit(None)
        await asyncio.wait_for(client._server.wait(), timeout=10)
        assert client._server.returncode == 0
        await client.stop()

    asyncio.run(talk())


def test_positions_count_utf16_code_units():
    assert _position(["x = 'é𝔸' + y"], 1, 12) == types.Position(0, 12)  # 𝔸 is two UTF-16 units
    assert _offset_position("a\nbé𝔸c", 5) == types.Position(1, 4)


def test_engine_failure_is_logged_and_the_server_keeps_serving(monkeypatch, tmp_path):
    from lintdist import server as module

    served = module.build()
    path = tmp_path / "train.py"
    path.write_text("import torch\n")
    logged: list[str] = []
    monkeypatch.setattr(served, "log", lambda kind, message: logged.append(message))

    def explode(*args, **kwargs):
        raise RuntimeError("a rule failed")

    monkeypatch.setattr(module, "process_text", explode)
    document = SimpleNamespace(source="import torch\n")
    workspace = SimpleNamespace(get_text_document=lambda uri: document, get_notebook_document=lambda **_: None)
    monkeypatch.setattr(module.LintdistServer, "workspace", property(lambda self: workspace))
    assert served.diagnostics(path.as_uri()) == []
    assert any("a rule failed" in message for message in logged)


def test_an_open_markdown_page_gets_the_diagnostics_of_its_code_blocks(monkeypatch, tmp_path):
    from lintdist import server as module

    served = module.build()
    page = tmp_path / "guide.md"
    text = (
        "# Guide\n\n```python\nfrom accelerate import Accelerator\naccelerator = Accelerator()\n"
        "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)\nfor batch in loader:\n"
        "    loss = model(**batch).loss\n    loss.backward()\n```\n"
    )
    page.write_text("# saved before the edit\n")  # the unsaved text is what is checked
    document = SimpleNamespace(source=text)
    workspace = SimpleNamespace(get_text_document=lambda uri: document, get_notebook_document=lambda **_: None)
    monkeypatch.setattr(module.LintdistServer, "workspace", property(lambda self: workspace))
    diagnostics = served.diagnostics(page.as_uri())
    assert [(d.code, d.range.start.line, d.range.start.character) for d in diagnostics] == [("LD106", 8, 4)]  # 0-based: the page's line 9
