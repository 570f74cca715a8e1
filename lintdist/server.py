"""`lintdist server`: the Language Server Protocol over stdio (pygls), for editors.

A document is checked from its unsaved text with the CLI's own per-file path (`runner.process_text`, the file
named explicitly, configuration found from its folder, the project pass linking a script to its accelerate config
and launch files), so the editor shows what `lintdist check <file>` prints for the saved file. Diagnostics are
pushed on open, change (debounced) and save, and pulled with `textDocument/diagnostic`. Code actions: each
finding's fix (safe or unsafe, said in the title), "fix all safe" as `source.fixAll.lintdist`, and a suppression
comment. An exception while checking becomes a `window/logMessage`; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from dataclasses import replace
from pathlib import Path

from lsprotocol import types
from pygls import uris
from pygls.lsp.server import LanguageServer

from lintdist import __version__
from lintdist.config import ConfigError, resolve_settings
from lintdist.discover import Candidate, kind_of
from lintdist.model import Finding, Severity
from lintdist.project import process_project, reset_process_project
from lintdist.runner import Task, launch_settings_for, process_text

FIX_ALL = "source.fixAll.lintdist"
DEBOUNCE_S = 0.3
SEVERITIES = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
}


class LintdistServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "lintdist",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Full,
            notebook_document_sync=types.NotebookDocumentSyncOptions(
                notebook_selector=[
                    types.NotebookDocumentFilterWithCells(
                        notebook="jupyter-notebook", cells=[types.NotebookCellLanguage(language="python")]
                    )
                ]
            ),
        )
        self.debounce_s = DEBOUNCE_S
        self.pending: dict[str, asyncio.TimerHandle] = {}
        self.findings: dict[str, list[Finding]] = {}
        # uri -> the project files its last check read: a change to one of them re-checks the document
        self.dependencies: dict[str, set[str]] = {}

    # -- checking -----------------------------------------------------------------------------------

    def run_task(self, uri: str, text: str, mode: str = "check", unsafe: bool = False):
        """(findings, new text or None) of one document, as the CLI would give them; None for a document
        lintdist does not read (not a file, or a kind it does not check)."""
        path_text = uris.to_fs_path(uri)
        if path_text is None:
            return None
        path = Path(path_text)
        kind = kind_of(path, explicit=True)
        if kind is None:
            return None
        settings = resolve_settings(None, path.parent)
        try:
            relative = path.absolute().relative_to(settings.root).as_posix()
        except ValueError:
            relative = path.as_posix()
        launch = launch_settings_for(path, settings) if kind == "python" else None
        task = Task(Candidate(path, str(path), kind, True), settings.enabled_for(relative), launch, mode, unsafe, True)
        # the project's other modules are read as the editor holds them, unsaved edits included
        reset_process_project()
        process_project().overlay = self._open_texts()
        report, new_text = process_text(task, text)
        if mode == "check":
            self.dependencies[uri] = set(report.dependencies)
        if report.error:
            self.log(types.MessageType.Error, f"lintdist: {path}: {report.error}")
        return [Finding.from_json(f) for f in report.findings], new_text

    def diagnostics(self, uri: str) -> list[types.Diagnostic]:
        document = self.workspace.get_text_document(uri)
        if self.workspace.get_notebook_document(cell_uri=uri) is not None:
            # a notebook cell: checked with its notebook (`publish_notebook`), not as a file of its own
            return [self._diagnostic(document.source, f) for f in self.findings.get(uri, [])]
        try:
            result = self.run_task(uri, document.source)
        except ConfigError as error:
            self.log(types.MessageType.Error, f"lintdist: configuration: {error}")
            return []
        except Exception:  # noqa: BLE001 - a rule or the engine failed: say so, keep serving
            self.log(types.MessageType.Error, f"lintdist: checking {uri} failed:\n{traceback.format_exc()}")
            return []
        if result is None:
            return []
        findings = result[0]
        self.findings[uri] = findings
        return [self._diagnostic(document.source, f) for f in findings]

    def publish_notebook(self, uri: str) -> None:
        """A notebook document (`notebookDocument/*`): its cells are checked as one notebook, and each cell gets
        the diagnostics of its own lines."""
        self.pending.pop(uri, None)
        notebook = self.workspace.get_notebook_document(notebook_uri=uri)
        if notebook is None:
            return
        cells, uris = [], {}
        for number, cell in enumerate(notebook.cells, start=1):
            code = cell.kind == types.NotebookCellKind.Code
            text = self.workspace.get_text_document(cell.document).source
            cells.append({"cell_type": "code" if code else "markdown", "metadata": {}, "source": text})
            uris[number] = cell.document
        data = {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
        try:
            result = self.run_task(uri, json.dumps(data))
        except Exception:  # noqa: BLE001 - logged, the server keeps serving
            self.log(types.MessageType.Error, f"lintdist: checking {uri} failed:\n{traceback.format_exc()}")
            return
        by_cell: dict[str, list[Finding]] = {cell_uri: [] for cell_uri in uris.values()}
        for finding in result[0] if result is not None else []:
            if finding.cell in uris:
                by_cell[uris[finding.cell]].append(replace(finding, cell=None))
        for cell_uri, findings in by_cell.items():
            self.findings[cell_uri] = findings
            text = self.workspace.get_text_document(cell_uri).source
            items = [self._diagnostic(text, f) for f in findings]
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=cell_uri, diagnostics=items))

    def publish(self, uri: str, dependents: bool = True) -> None:
        self.pending.pop(uri, None)
        if uri not in self.workspace.text_documents:
            return
        items = self.diagnostics(uri)
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=items))
        if dependents:
            self.publish_dependents(uri)

    def publish_dependents(self, uri: str) -> None:
        """Re-check the open documents whose last check read this document's file (``train.py`` when
        ``utils.py`` changes), once each."""
        path = uris.to_fs_path(uri)
        if path is None:
            return
        changed = str(Path(path).resolve())
        for other, read in list(self.dependencies.items()):
            if other != uri and changed in read and other in self.workspace.text_documents:
                self.publish(other, dependents=False)

    def _open_texts(self) -> dict[Path, str]:
        texts = {}
        for uri, document in getattr(self.workspace, "text_documents", {}).items():
            path = uris.to_fs_path(uri)
            if path is not None and path.endswith(".py"):
                texts[Path(path).resolve()] = document.source
        return texts

    def schedule(self, uri: str, publish=None) -> None:
        """Check after a quiet spell: rapid edits cost one check."""
        handle = self.pending.pop(uri, None)
        if handle is not None:
            handle.cancel()
        self.pending[uri] = asyncio.get_running_loop().call_later(self.debounce_s, publish or self.publish, uri)

    def log(self, kind: types.MessageType, message: str) -> None:
        self.window_log_message(types.LogMessageParams(type=kind, message=message))

    # -- conversions --------------------------------------------------------------------------------

    def _diagnostic(self, text: str, finding: Finding) -> types.Diagnostic:
        span = finding.span
        message = finding.message
        if finding.cell is not None:  # a notebook opened as JSON text: name the cell, point at the file's start
            message = f"cell {finding.cell}, line {span.line}: {message}"
            where = types.Range(types.Position(0, 0), types.Position(0, 0))
        else:
            lines = text.splitlines()
            where = types.Range(
                _position(lines, span.line, span.column), _position(lines, span.end_line, span.end_column)
            )
        return types.Diagnostic(
            range=where,
            message=message,
            severity=SEVERITIES.get(finding.severity, types.DiagnosticSeverity.Warning),
            code=finding.code,
            code_description=types.CodeDescription(href=finding.url) if finding.url else None,
            source="lintdist",
            data={"code": finding.code, "line": span.line, "column": span.column},
        )

    def code_actions(self, params: types.CodeActionParams) -> list[types.CodeAction]:
        uri = params.text_document.uri
        document = self.workspace.get_text_document(uri)
        text = document.source
        only = params.context.only or []
        actions: list[types.CodeAction] = []
        if not only or any(kind.startswith("quickfix") for kind in only):
            wanted = {(d.code, d.range.start.line) for d in params.context.diagnostics if d.source == "lintdist"}
            for finding in self.findings.get(uri, []):
                if finding.cell is not None or (finding.code, finding.span.line - 1) not in wanted:
                    continue
                if finding.edits:
                    unsafe = finding.fix_applicability is not None and finding.fix_applicability.value == "unsafe"
                    actions.append(
                        types.CodeAction(
                            title=f"Fix {finding.code}: {finding.fix_message}" + (" (unsafe)" if unsafe else ""),
                            kind=types.CodeActionKind.QuickFix,
                            edit=_workspace_edit(uri, text, [(e.start, e.end, e.replacement) for e in finding.edits]),
                            is_preferred=not unsafe,
                        )
                    )
                actions.append(self._suppression(uri, text, finding))
        if not only or any(FIX_ALL.startswith(kind) or kind == FIX_ALL for kind in only):
            result = self.run_task(uri, text, mode="fix")
            if result is not None and result[1] is not None:
                actions.append(
                    types.CodeAction(
                        title="lintdist: fix all safe fixes",
                        kind=FIX_ALL,
                        edit=_workspace_edit(uri, text, [(0, len(text), result[1])]),
                    )
                )
        return actions

    def _suppression(self, uri: str, text: str, finding: Finding) -> types.CodeAction:
        lines = text.splitlines(keepends=True)
        index = finding.span.line - 1
        line = lines[index] if index < len(lines) else ""
        body = line.rstrip("\r\n")
        offset = sum(len(x) for x in lines[:index]) + len(body)
        return types.CodeAction(
            title=f"Suppress {finding.code} on this line",
            kind=types.CodeActionKind.QuickFix,
            edit=_workspace_edit(uri, text, [(offset, offset, f"  # lintdist: ignore[{finding.code}]")]),
        )


def _position(lines: list[str], line: int, column: int) -> types.Position:
    """LSP position (UTF-16 code units) of a 1-based line and character column."""
    index = max(line - 1, 0)
    text = lines[index] if index < len(lines) else ""
    prefix = text[: max(column - 1, 0)]
    return types.Position(index, len(prefix.encode("utf-16-le")) // 2)


def _offset_position(text: str, offset: int) -> types.Position:
    before = text[:offset]
    line = before.count("\n")
    start = before.rfind("\n") + 1
    return types.Position(line, len(before[start:].encode("utf-16-le")) // 2)


def _workspace_edit(uri: str, text: str, edits: list[tuple[int, int, str]]) -> types.WorkspaceEdit:
    return types.WorkspaceEdit(
        changes={
            uri: [
                types.TextEdit(
                    range=types.Range(_offset_position(text, start), _offset_position(text, end)),
                    new_text=replacement,
                )
                for start, end, replacement in edits
            ]
        }
    )


def build() -> LintdistServer:
    server = LintdistServer()

    @server.feature(types.INITIALIZE)
    def initialize(ls: LintdistServer, params: types.InitializeParams) -> None:
        options = params.initialization_options or {}
        if isinstance(options, dict) and isinstance(options.get("debounce"), (int, float)):
            ls.debounce_s = float(options["debounce"])

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: LintdistServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.publish(params.text_document.uri, dependents=False)  # opening changes nothing another file read

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: LintdistServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: LintdistServer, params: types.DidSaveTextDocumentParams) -> None:
        ls.publish(params.text_document.uri)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
    def notebook_open(ls: LintdistServer, params: types.DidOpenNotebookDocumentParams) -> None:
        ls.publish_notebook(params.notebook_document.uri)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
    def notebook_change(ls: LintdistServer, params: types.DidChangeNotebookDocumentParams) -> None:
        ls.schedule(params.notebook_document.uri, ls.publish_notebook)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
    def notebook_save(ls: LintdistServer, params: types.DidSaveNotebookDocumentParams) -> None:
        ls.publish_notebook(params.notebook_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: LintdistServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.findings.pop(uri, None)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    @server.feature(
        types.TEXT_DOCUMENT_DIAGNOSTIC,
        types.DiagnosticOptions(identifier="lintdist", inter_file_dependencies=True, workspace_diagnostics=False),
    )
    def pull(ls: LintdistServer, params: types.DocumentDiagnosticParams) -> types.FullDocumentDiagnosticReport:
        return types.FullDocumentDiagnosticReport(items=ls.diagnostics(params.text_document.uri))

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL]),
    )
    def code_action(ls: LintdistServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        try:
            return ls.code_actions(params)
        except Exception:  # noqa: BLE001 - logged, the server keeps serving
            ls.log(types.MessageType.Error, f"lintdist: code actions failed:\n{traceback.format_exc()}")
            return []

    return server


def serve() -> None:
    build().start_io()
