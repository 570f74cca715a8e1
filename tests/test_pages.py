"""Code blocks of documentation pages and docstrings, read line for line, and fixes written back into them."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lintdist.pages import read_docstrings, read_page, write_back

PAGE = """# Training on several GPUs

Prose with `inline code` that is not a block.

```python
from accelerate import Accelerator
accelerator = Accelerator()
```

<Tip warning={true}>

```py
for batch in loader:
    loss = model(batch).loss
    loss.backward()
```

</Tip>

1. Then a config, in a list item:

   ```yaml
   distributed_type: FSDP
   fsdp_config:
     fsdp_version: 2
   ```

```bash
accelerate launch train.py
```

```pycon
>>> x = 1
>>> if x:
...     print(x)
1
```

```python
{% if fast %}
model = compile(model)
{% endif %}
```

```python
this block is not python {
```

```text
loss.backward()
```
"""


def _program_lines(page):
    return {number: line for number, line in enumerate(page.python().split("\n"), 1) if line}


def test_python_blocks_form_one_program_line_for_line_with_the_page():
    page = read_page(PAGE, ".md")
    program = _program_lines(page)
    assert page.python().count("\n") == len(page.lines)
    assert program[6] == "from accelerate import Accelerator"
    assert program[14] == "    loss = model(batch).loss"
    # prompts stripped, output blanked; templating lines blanked; a block that does not parse and a text block
    # are left out
    assert [program[n] for n in (33, 34, 35)] == ["x = 1", "if x:", "    print(x)"]
    assert 36 not in program
    assert program[41] == "model = compile(model)" and 40 not in program and 42 not in program
    assert "this block is not python {" not in program.values()
    assert 46 not in program and 50 not in program


def test_blocks_by_language_with_their_shifts():
    page = read_page(PAGE, ".md")
    assert [block.language for block in page.blocks] == ["python", "python", "yaml", "shell", "python"] + [
        "python",
        "python",
    ]
    yaml = page.blocks[2]
    assert page.program([yaml]).split("\n")[22:25] == ["distributed_type: FSDP", "fsdp_config:", "  fsdp_version: 2"]
    assert page.shift(24) == 3  # the list item's indentation
    assert page.shift(34) == 4  # `>>> `
    assert page.shift(1) == 0


def test_a_fix_lands_inside_its_block_and_leaves_the_rest_byte_for_byte():
    page = read_page(PAGE, ".md")
    fixed = page.python().replace("    loss.backward()", "    accelerator.backward(loss)")
    fixed = fixed.replace(
        "accelerator = Accelerator()\n", "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n"
    )
    out = write_back(page, page.python_blocks(), fixed)
    assert out == PAGE.replace("    loss.backward()\n", "    accelerator.backward(loss)\n").replace(
        "accelerator = Accelerator()\n```", "accelerator = Accelerator()\nmodel = accelerator.prepare(model)\n```"
    )


def test_a_fix_that_needs_a_line_outside_the_blocks_is_refused():
    page = read_page(PAGE, ".md")
    assert write_back(page, page.python_blocks(), "import os\n" + page.python()) is None
    # a line added to a session would need a prompt the fix cannot choose
    assert write_back(page, page.python_blocks(), page.python().replace("x = 1\n", "x = 1\ny = 2\n")) is None
    # a one-for-one change inside a session keeps the prompt
    out = write_back(page, page.python_blocks(), page.python().replace("x = 1\n", "x = 2\n"))
    assert ">>> x = 2\n>>> if x:" in out


def test_windows_line_endings_are_kept():
    text = PAGE.replace("\n", "\r\n")
    page = read_page(text, ".md")
    fixed = page.python().replace("accelerator = Accelerator()\n", "accelerator = Accelerator()\nx = 1\n")
    out = write_back(page, page.python_blocks(), fixed)
    assert "accelerator = Accelerator()\r\nx = 1\r\n```\r\n" in out
    assert out.replace("x = 1\r\n", "", 1) == text


RST = """Guide
=====

.. code-block:: python
   :linenos:

   import torch.distributed as dist
   dist.init_process_group("nccl")

A literal block::

    model = DDP(model)

.. code-block:: bash

    torchrun --nproc_per_node 2 train.py

.. note::

   Not code.
"""


def test_rst_code_blocks_and_literal_blocks():
    page = read_page(RST, ".rst")
    assert [block.language for block in page.blocks] == ["python", "python", "shell"]
    program = _program_lines(page)
    assert program == {
        7: "import torch.distributed as dist",
        8: 'dist.init_process_group("nccl")',
        12: "model = DDP(model)",
    }
    assert page.shift(7) == 3 and page.shift(12) == 4
    out = write_back(page, page.python_blocks(), page.python().replace("DDP(model)", "DDP(model, device_ids=[rank])"))
    assert out == RST.replace("DDP(model)", "DDP(model, device_ids=[rank])")


DOCSTRINGS = '''"""A module.

Example:

```python
accelerator = Accelerator()
```
"""


def train(model):
    """Train.

    >>> for batch in loader:
    ...     loss = model(batch)
    ...     loss.backward()
    tensor(1.)
    """
    return model
'''


def test_docstring_fences_and_sessions():
    page = read_docstrings(DOCSTRINGS)
    assert [(block.language, block.pycon) for block in page.blocks] == [("python", False), ("python", True)]
    program = _program_lines(page)
    assert program == {
        6: "accelerator = Accelerator()",
        14: "for batch in loader:",
        15: "    loss = model(batch)",
        16: "    loss.backward()",
    }
    assert page.shift(15) == len("    ... ")
    out = write_back(page, page.python_blocks(), page.python().replace("    loss.backward()", "    accelerator.backward(loss)"))
    assert out == DOCSTRINGS.replace("...     loss.backward()", "...     accelerator.backward(loss)")


def test_a_file_that_does_not_parse_has_no_docstring_blocks():
    assert read_docstrings("def f(:\n").blocks == []


LINES = st.sampled_from(
    [
        "text",
        "",
        "```python",
        "```py",
        "```yaml",
        "```",
        "~~~",
        "   ```python",
        "x = 1",
        "    y = x",
        "if x:",
        ">>> z = 2",
        "... w = 3",
        "{% raw %}",
        "<Tip>",
        "::",
        "\tz",
        "def f(:",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(LINES, max_size=30), st.sampled_from([".md", ".mdx", ".rst"]), st.sampled_from(["\n", "\r\n"]))
def test_any_page_reads_back_unchanged_and_edits_stay_inside_blocks(lines, suffix, ending):
    text = ending.join(lines) + ending
    page = read_page(text, suffix)
    program = page.python()
    assert program.count("\n") == len(page.lines)
    assert write_back(page, page.python_blocks(), program) == text
    # change every program line that has code: only block lines of the page change, and doing it twice is the
    # same as once
    changed = "\n".join(line + "  # seen" if line.strip() else line for line in program.split("\n"))
    out = write_back(page, page.python_blocks(), changed)
    if out is None:
        return
    code_lines = {line for block in page.python_blocks() for line in block.lines}
    new_lines = out.split(ending)
    assert len(new_lines) == len(text.split(ending))
    for number, (before, after) in enumerate(zip(text.split(ending), new_lines)):
        if number not in code_lines:
            assert before == after
    again = read_page(out, suffix)
    assert write_back(again, again.python_blocks(), again.python()) == out


def test_mislabelled_blocks_are_read_as_what_they_are():
    text = (
        "```shell\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n```\n\n"
        "```shell\naccelerate launch train.py\n```\n\n"
        "```python\ntorchrun --nproc_per_node=8 train.py\n```\n\n"
        "```python\nx = 1\n```\n"
    )
    assert [block.language for block in read_page(text, ".md").blocks] == ["yaml", "shell", "shell", "python"]
