"""Documentation pages checked through the engine: findings at the page's lines and columns, fixes inside the
blocks, the `docs`/`docstrings` settings."""

from __future__ import annotations

from click.testing import CliRunner

from lintdist.cli import cli

GUIDE = """# Accumulating gradients

Some prose that mentions loss.backward() in passing.

```python
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
```

1. Then train:

   ```python
   for batch in loader:
       with accelerator.accumulate(model):
           loss = model(**batch).loss
           loss.backward()  # the pitfall
           optimizer.step()
           optimizer.zero_grad()
   ```

```yaml
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_sharding_strategy: FULL_SHARD
num_processes: 2
```
"""


def _check(tmp_path, name, text, *args):
    page = tmp_path / name
    page.write_bytes(text.encode())
    result = CliRunner().invoke(cli, ["check", "--no-cache", "--output-format", "concise", *args, str(page)])
    return result, page


def test_findings_point_at_the_page_line_and_column(tmp_path):
    result, page = _check(tmp_path, "guide.md", GUIDE, "--select", "LD106,LD301")
    lines = sorted(line.split(" ")[0] for line in result.output.splitlines() if "LD" in line)
    assert lines == [f"{page}:17:12:", f"{page}:26:3:"], result.output


def test_fix_changes_only_the_blocks(tmp_path):
    result, page = _check(tmp_path, "guide.md", GUIDE, "--select", "LD106,LD301", "--fix")
    fixed = page.read_text()
    expected = GUIDE.replace("loss.backward()  # the pitfall", "accelerator.backward(loss)  # the pitfall")
    expected = expected.replace("fsdp_sharding_strategy: FULL_SHARD", "fsdp_reshard_after_forward: true")
    assert fixed == expected, result.output
    again, _ = _check(tmp_path, "guide.md", fixed, "--select", "LD106,LD301", "--fix")
    assert page.read_text() == expected  # idempotent


def test_crlf_page_keeps_its_line_endings(tmp_path):
    text = GUIDE.replace("\n", "\r\n")
    _check(tmp_path, "guide.md", text, "--select", "LD106", "--fix")
    page = (tmp_path / "guide.md").read_bytes().decode()
    assert page == text.replace("loss.backward()  # the pitfall", "accelerator.backward(loss)  # the pitfall")


RST = """Guide
=====

.. code-block:: python

   for batch in loader:
       with accelerator.accumulate(model):
           loss = model(**batch).loss
           loss.backward()
"""

MDX = """import { Tip } from "components"

<Tip>

```py
accelerator = Accelerator(gradient_accumulation_steps=2)
model = accelerator.prepare(model)
for batch in loader:
    with accelerator.accumulate(model):
        model(**batch).loss.backward()
```

</Tip>
"""


def test_rst_and_mdx_pages(tmp_path):
    result, page = _check(tmp_path, "guide.rst", RST, "--select", "LD106")
    assert f"{page}:9:12: LD106" in result.output, result.output
    result, page = _check(tmp_path, "guide.mdx", MDX, "--select", "LD106")
    assert f"{page}:10:9: LD106" in result.output, result.output


def test_docs_setting_and_flag(tmp_path):
    (tmp_path / "guide.md").write_text(GUIDE)
    (tmp_path / "lintdist.toml").write_text("docs = false\n")
    runner = CliRunner()
    off = runner.invoke(cli, ["check", "--no-cache", "--select", "LD106", str(tmp_path)])
    assert "LD106" not in off.output
    on = runner.invoke(cli, ["check", "--no-cache", "--select", "LD106", "--docs", str(tmp_path)])
    assert "LD106" in on.output
    (tmp_path / "lintdist.toml").write_text("docs = 1\n")
    bad = runner.invoke(cli, ["check", "--no-cache", str(tmp_path)])
    assert bad.exit_code == 2 and "`docs` must be true or false" in bad.output


LIBRARY = '''def train(model, loader, accelerator):
    """Train one epoch.

    Example:

    >>> accelerator = Accelerator(gradient_accumulation_steps=2)
    >>> model = accelerator.prepare(model)
    >>> for batch in loader:
    ...     with accelerator.accumulate(model):
    ...         model(**batch).loss.backward()
    """
    return model
'''


def test_docstrings_only_under_their_setting(tmp_path):
    result, page = _check(tmp_path, "library.py", LIBRARY, "--select", "LD106")
    assert "LD106" not in result.output
    result, page = _check(tmp_path, "library.py", LIBRARY, "--select", "LD106", "--docstrings")
    assert f"{page}:10:17: LD106" in result.output, result.output
    _check(tmp_path, "library.py", LIBRARY, "--select", "LD106", "--docstrings", "--fix")
    assert page.read_text() == LIBRARY.replace(
        "model(**batch).loss.backward()", "accelerator.backward(model(**batch).loss)"
    )


def test_a_block_that_does_not_parse_is_skipped_without_an_error(tmp_path):
    text = "```python\nfor batch in loader:\n```\n\n```python\nthis is { not python\n```\n"
    result, _ = _check(tmp_path, "notes.md", text)
    assert result.exit_code == 0, result.output
    assert "LD001" not in result.output


SAVE_THEN_RESUME = """Save a checkpoint:

```python
if accelerator.is_main_process:
    torch.save(model.state_dict(), "weights.pth")
```

To resume in a later run, load it:

```python
state = torch.load("weights.pth")
```

In one block, the read races the write:

```python
if accelerator.is_main_process:
    torch.save(model.state_dict(), "other.pth")
state = torch.load("other.pth")
```
"""


def test_a_race_needs_both_places_in_one_block(tmp_path):
    # A guide's "save" and "load to resume" blocks are two runs; a write and a read in one block are one.
    result, page = _check(tmp_path, "checkpoints.md", SAVE_THEN_RESUME, "--select", "LD403")
    found = [line.split(" ")[0] for line in result.output.splitlines() if "LD403" in line]
    assert found == [f"{page}:19:9:"], result.output


DEVICE_PAGE = """Run
===

.. code-block:: python

    import torch
    import torch.distributed as dist
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())

Save it as ``run.py`` and launch it:

.. code-block:: python

    LAUNCH
"""


def test_the_page_launch_lines_are_the_launch_of_its_program(tmp_path):
    # A global rank used as the device breaks only on a second node: the page's own launch line (here in a block
    # mislabelled as Python) says whether there is one.
    one_node = DEVICE_PAGE.replace("LAUNCH", "torchrun --nproc_per_node=8 run.py")
    two_nodes = DEVICE_PAGE.replace("LAUNCH", "torchrun --nnodes=2 --nproc_per_node=8 run.py")
    unknown = DEVICE_PAGE.replace("LAUNCH", "print('no launch line')")
    assert "LD407" not in _check(tmp_path, "one.rst", one_node, "--select", "LD407")[0].output
    assert "LD407" in _check(tmp_path, "two.rst", two_nodes, "--select", "LD407")[0].output
    assert "LD407" in _check(tmp_path, "unknown.rst", unknown, "--select", "LD407")[0].output


PLUGIN_PAGE = """Save this config with `accelerate config`:

```yaml
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  WRAP
num_processes: 2
```

Override what the config leaves out in code:

```python
from accelerate import Accelerator, FullyShardedDataParallelPlugin
plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
accelerator = Accelerator(fsdp_plugin=plugin)
```

```bash
accelerate launch train.py
```
"""


def test_an_accelerate_launch_without_config_file_reads_the_page_config(tmp_path):
    # The plugin reads what it leaves out from the launcher's environment, set from the config the page shows.
    with_policy = PLUGIN_PAGE.replace("WRAP", "fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP")
    without = PLUGIN_PAGE.replace("WRAP", "fsdp_offload_params: false")
    assert "LD309" not in _check(tmp_path, "a.md", with_policy, "--select", "LD309")[0].output
    assert "LD309" in _check(tmp_path, "b.md", without, "--select", "LD309")[0].output
