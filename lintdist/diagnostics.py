"""The engine's own findings: files that cannot be read or parsed."""

from __future__ import annotations

from lintdist.model import Severity
from lintdist.rule import Invalid, Rule, Valid


class UnparsableSource(Rule):
    """
    ## What it does
    Reports a file lintdist cannot parse: a Python syntax error, text that does
    not decode in its declared encoding, a binary file, or invalid YAML/JSON in
    an accelerate or DeepSpeed config.

    lintdist checks training code; it is not a syntax checker. A Python file is
    parsed only when an enabled rule could fire on it (its entry points, such as
    `DistributedSampler` or `.backward(`, appear in the text) or when it is named
    on the command line, so syntax errors are reported for those files only.

    ## Why is this bad?
    Nothing else can be checked in the file, and the launcher or the
    interpreter will fail on it the same way at start-up, after the job was
    queued and the GPUs were allocated.

    ## Example
    ```python
    for epoch in range(3)
        train(epoch)
    ```

    ## Use instead
    ```python
    for epoch in range(3):
        train(epoch)
    ```

    ## Fix safety
    No fix: lintdist does not guess what was meant.

    ## References
    - Python's `tokenize.detect_encoding` and PEP 263 (coding cookies)
    """

    code = "LD001"
    name = "unparsable-source"
    severity = Severity.ERROR
    kinds = frozenset({"python", "config", "launch"})
    VALID = (Valid("import torch.distributed as dist\ndist.init_process_group('gloo')\n"),)
    INVALID = (Invalid("import torch.distributed as dist\nfor epoch in range(3)\n    pass\n", lines=(2,)),)


class UnreadableFile(Rule):
    """
    ## What it does
    Reports a path lintdist cannot read: permission denied, a broken link, or
    a directory that links back to one of its own parents.

    ## Why is this bad?
    The file was asked for (or found under a checked directory) but nothing in
    it was checked. The rest of the run goes on.

    ## Example
    ```shell
    chmod 000 train.py && lintdist check train.py
    ```

    ## Use instead
    ```shell
    chmod 644 train.py && lintdist check train.py
    ```

    ## Fix safety
    No fix.

    ## References
    - `os.walk(followlinks=True)` documentation on symbolic-link loops
    """

    code = "LD002"
    name = "unreadable-file"
    severity = Severity.ERROR
    kinds = frozenset({"python", "config", "launch"})
