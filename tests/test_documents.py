"""Documentation pages checked through the engine: findings at the page's lines and columns, fixes inside the
blocks, the `docs`/`docstrings` settings."""

from __future__ import annotations

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

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
    _again, _ = _check(tmp_path, "guide.md", fixed, "--select", "LD106,LD301", "--fix")
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


def test_a_fix_that_needs_a_line_outside_the_block_is_reported_without_a_fix(tmp_path):
    # LD203's fix imports DistributedSampler at the top of the program: above the block, in the page's prose.
    page = (
        "A DDP walkthrough.\n\n```python\nmodel = DDP(model.to(local_rank), device_ids=[local_rank])\n"
        "loader = DataLoader(train_set, batch_size=32, shuffle=True)\nfor epoch in range(epochs):\n"
        "    for x, y in loader:\n        optimizer.zero_grad()\n        F.cross_entropy(model(x), y).backward()\n"
        "        optimizer.step()\n```\n"
    )
    result, path = _check(tmp_path, "ddp.md", page, "--select", "LD203", "--unsafe-fixes", "--output-format", "json")
    import json

    [finding] = json.loads(result.output)
    assert (finding["code"], finding["line"], finding["fix"]) == ("LD203", 5, None)
    fixed, _ = _check(tmp_path, "ddp.md", page, "--select", "LD203", "--unsafe-fixes", "--fix")
    assert path.read_text() == page
    assert "needs a line outside the page's code block" in fixed.output


PIECES = [
    "Some prose.\n",
    "\n",
    (
        "```python\nfor batch in loader:\n    with accelerator.accumulate(model):\n        loss = model(**batch).loss\n"
        "        loss.backward()\n```\n"
    ),
    (
        "```python\naccelerator = Accelerator(gradient_accumulation_steps=2)\n"
        "model, loader = accelerator.prepare(model, loader)\n```\n"
    ),
    "```yaml\ndistributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_use_orig_params: true\n```\n",
    "   ```py\n   if accelerator.is_main_process:\n       accelerator.save_state('ckpt')\n   ```\n",
    "```bash\naccelerate launch --num_processes 2 train.py\n```\n",
    "<Tip>\n",
    "```python\nnot python {\n```\n",
]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=7), st.sampled_from(["\n", "\r\n"]))
def test_any_page_keeps_its_prose_and_fix_is_idempotent(pieces, newline):
    import tempfile
    from pathlib import Path

    text = "".join(pieces).replace("\n", newline)
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "page.md"
        page.write_bytes(text.encode())
        runner = CliRunner()
        runner.invoke(cli, ["check", "--no-cache", "--select", "ALL", str(page)])
        assert page.read_bytes() == text.encode()  # a check writes nothing
        runner.invoke(cli, ["check", "--no-cache", "--select", "ALL", "--fix", str(page)])
        once = page.read_bytes().decode()
        prose = [line for line in text.split(newline) if not line.startswith(("```", " ", "for", "acc", "mod", "dis"))]
        kept = once.split(newline)
        assert all(line in kept for line in prose)  # the page's other text survives every fix
        runner.invoke(cli, ["check", "--no-cache", "--select", "ALL", "--fix", str(page)])
        assert page.read_bytes().decode() == once  # idempotent


def test_a_config_block_that_does_not_parse_is_skipped_and_an_emulated_launcher_is_not_launched(tmp_path):
    # A guide's JSON config with a missing comma, under a yaml fence: no LD001. A notebook block that writes RANK and
    # WORLD_SIZE itself emulates a launcher: its MASTER_ADDR overwrites nothing, even though another block of the
    # page is a script the launcher runs (it reads LOCAL_RANK).
    page = (
        '```yaml\n{"zero_optimization": {"stage": 3 "overlap_comm": true}, "train_batch_size": "auto"}\n```\n\n'
        '```py\nimport os\nos.environ["MASTER_ADDR"] = "localhost"\nos.environ["MASTER_PORT"] = "9994"\n'
        'os.environ["RANK"] = "0"\nos.environ["WORLD_SIZE"] = "1"\n```\n\n'
        '```py\nimport os\nlocal_rank = int(os.getenv("LOCAL_RANK", "0"))\n```\n\n'
        "```bash\ndeepspeed --num_gpus 2 t0.py\n```\n"
    )
    result, _ = _check(tmp_path, "deepspeed.md", page, "--select", "ALL")
    assert "LD001" not in result.output and "LD406" not in result.output, result.output
