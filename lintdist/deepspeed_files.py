"""A DeepSpeed JSON config a script or a launch line names (``TrainingArguments(deepspeed="ds.json")``,
``--deepspeed ds.json``): the file, parsed with its keys' positions, and the top-level values it gives."""

from __future__ import annotations

from pathlib import Path

from lintdist.launch import resolve_launch_path
from lintdist.sources import ConfigDocument, SourceError, parse_config, read_source

# A key the config does not write (``gradient_clipping`` left out): DeepSpeed's own default applies.
ABSENT = object()


def named_deepspeed_config(name: str, beside: Path) -> tuple[Path, ConfigDocument] | None:
    """The DeepSpeed config at ``name`` (relative to the folder of the file ``beside`` when it exists there, else
    to the working directory) and its path; None when there is no such file or it is no DeepSpeed config."""
    if not name.endswith((".json", ".yaml", ".yml")) or "$" in name or "{" in name:
        return None
    path = resolve_launch_path(name, beside)
    try:
        document = parse_config(read_source(path, "config").text) if path.is_file() else None
    except (SourceError, OSError):
        return None
    return (path, document) if document is not None and document.flavour == "deepspeed" else None


def top_value(document: ConfigDocument, key: str) -> object:
    """The value the config gives a top-level key (``"auto"``, a number...), ``ABSENT`` when it gives none."""
    data = document.data
    return data[key] if isinstance(data, dict) and key in data else ABSENT
