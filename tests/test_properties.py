"""Property tests: generated training scripts, configs and launch files, checked and fixed by every rule.

hypothesis builds folders from realistic fragments (accelerate, raw DDP, FSDP2 and Lightning loops, samplers,
loaders, accumulation, rank guards, downloads, an accelerate config and a launch line) written in odd but valid
ways (tabs, CRLF, a BOM, a latin-1 coding cookie, comments and blank lines everywhere, continuations, nesting,
decorators, `async def`, `match`, walrus). For every folder, with every rule and `--unsafe-fixes`:

- a check ends with exit code 0 or 1: no rule raises;
- every fixed file parses and keeps its encoding, BOM and line endings;
- fixing removes findings and adds none (per rule, never more findings than before);
- a second fix changes nothing;
- a suppression comment on a reported line silences that finding and nothing else.

Profiles: `ci` (the default, bounded and derandomized, a few seconds) and `long` for local runs:

    HYPOTHESIS_PROFILE=long python -m pytest tests/test_properties.py -p no:cacheprovider -s
"""

from __future__ import annotations

import codecs
import collections
import os
from pathlib import Path

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lintdist.config import resolve_settings
from lintdist.runner import run

settings.register_profile(
    "ci",
    max_examples=60,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "long",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

STATS: collections.Counter = collections.Counter()

# -- fragments: (depth, line) lists, rendered with the drawn indentation --------------------------------------

IMPORTS = {
    "accelerate": [
        ["from accelerate import Accelerator"],
        ["from accelerate import Accelerator as Acc", "Accelerator = Acc"],
        ["import accelerate", "Accelerator = accelerate.Accelerator"],
    ],
    "torch": [
        [
            "import torch",
            "import torch.distributed as dist",
            "from torch.utils.data import DataLoader, DistributedSampler",
        ],
        [
            "import torch",
            "from torch import distributed as dist",
            "import torch.utils.data as tud",
            "DataLoader, DistributedSampler = tud.DataLoader, tud.DistributedSampler",
        ],
    ],
}


def _accelerate_body(draw) -> list[tuple[int, str]]:
    accum = draw(st.sampled_from(["", "gradient_accumulation_steps=4", "gradient_accumulation_steps=args.accum"]))
    lines = [(1, f"accelerator = Accelerator({accum})")]
    if draw(st.booleans()):
        lines.append((1, 'raw = load_dataset("imdb")'))
        lines.append((1, "raw = raw.map(tokenize, batched=True)"))
    lines += [
        (1, 'model = AutoModelForCausalLM.from_pretrained("gpt2")'),
        (1, "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)"),
        (1, "loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=collator)"),
        (1, "model, optimizer, loader = accelerator.prepare(model, optimizer, loader)"),
        (1, "completed = 0"),
        (1, "for epoch in range(args.epochs):"),
        (2, "for step, batch in enumerate(loader):"),
    ]
    if accum and draw(st.booleans()):
        lines += [
            (3, "with accelerator.accumulate(model):"),
            (4, "outputs = model(**batch)"),
            (4, "loss = outputs.loss"),
            (4, "accelerator.backward(loss)"),
            (4, "optimizer.step()"),
            (4, "optimizer.zero_grad()"),
        ]
    else:
        backward = draw(st.sampled_from(["accelerator.backward(loss)", "loss.backward()"]))
        lines += [
            (3, "loss = model(**batch).loss"),
            (3, backward),
            (3, "optimizer.step()"),
            (3, "optimizer.zero_grad()"),
        ]
    if draw(st.booleans()):
        lines += [(3, "if accelerator.sync_gradients:"), (4, "completed += 1")]
    if draw(st.booleans()):
        lines += [
            (2, "if accelerator.is_main_process:"),
            (3, 'path = os.path.join(args.output_dir, f"epoch-{epoch}")'),
            (3, "accelerator.save_state(path)"),
            (3, 'print("saved", path)'),
        ]
    return lines


def _ddp_body(draw) -> list[tuple[int, str]]:
    lines = [
        (1, 'dist.init_process_group("gloo")'),
        (1, "rank = dist.get_rank()"),
    ]
    if draw(st.booleans()):
        lines.append((1, 'data = torchvision.datasets.MNIST("data", download=True)'))
    wrap = draw(st.sampled_from(["DistributedDataParallel(net)", "fully_shard(net)"]))
    shuffle = draw(st.sampled_from(["", ", shuffle=True", ", shuffle=False"]))
    lines += [
        (1, "net = torch.nn.Linear(8, 2)"),
        (1, f"model = {wrap}"),
        (1, "sampler = DistributedSampler(dataset)"),
        (1, f"loader = DataLoader(dataset, batch_size=4, sampler=sampler{shuffle})"),
        (1, "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)"),
        (1, "for epoch in range(3):"),
    ]
    if draw(st.booleans()):
        lines.append((2, "sampler.set_epoch(epoch)"))
    lines += [
        (2, "for x, y in loader:"),
        (3, "loss = torch.nn.functional.cross_entropy(model(x), y)"),
        (3, "loss.backward()"),
        (3, "optimizer.step()"),
        (3, "optimizer.zero_grad()"),
    ]
    if draw(st.booleans()):
        lines += [(2, "if rank == 0:"), (3, "dist.barrier()"), (3, 'torch.save(model.state_dict(), "ckpt.pt")')]
    return lines


def _lightning_body(draw) -> list[tuple[int, str]]:
    accumulate = draw(st.sampled_from(["", ", accumulate_grad_batches=4"]))
    return [
        (1, f'trainer = L.Trainer(devices=2, strategy="ddp"{accumulate})'),
        (1, "trainer.fit(LitModel(), DataLoader(dataset, batch_size=8))"),
    ]


EXTRAS = [
    [(0, "@functools.lru_cache(maxsize=None)"), (0, "def cached_size(n):"), (1, "return n * 2")],
    [(0, "async def fetch(url):"), (1, "return url")],
    [
        (0, "def describe(value):"),
        (1, "match value:"),
        (2, "case {'kind': kind}:"),
        (3, "return kind"),
        (2, "case _:"),
        (3, "return None"),
    ],
    [(0, "def first_long(items):"), (1, "if (n := len(items)) > 3:"), (2, "return n"), (1, "return 0")],
    [(0, "TOTAL = 1 + \\"), (1, "2")],
    [(0, "def nested(a):"), (1, "if a:"), (2, "for i in range(a):"), (3, "while i:"), (4, "i -= 1")],
]

PREAMBLE = [
    "import argparse",
    "import functools",
    "import os",
    "import torch",
    "import torch.distributed as dist",
    "import torchvision",
    "import lightning as L",
    "from torch.distributed.fsdp import fully_shard",
    "from torch.nn.parallel import DistributedDataParallel",
    "from torch.utils.data import DataLoader, DistributedSampler",
    "from datasets import load_dataset",
    "from transformers import AutoModelForCausalLM",
]


@st.composite
def scripts(draw) -> dict:
    style = draw(st.sampled_from(["accelerate", "ddp", "lightning"]))
    head = list(PREAMBLE)
    if style == "accelerate":
        head += draw(st.sampled_from(IMPORTS["accelerate"]))
        body = _accelerate_body(draw)
    elif style == "ddp":
        head += draw(st.sampled_from(IMPORTS["torch"]))
        body = _ddp_body(draw)
    else:
        body = _lightning_body(draw)
    lines = (
        [(0, line) for line in head] + [(0, ""), (0, "def main(args, dataset, collator=None, tokenize=None):")] + body
    )
    for extra in draw(st.lists(st.sampled_from(EXTRAS), max_size=3)):
        lines += [(0, ""), *extra]
    lines += [(0, ""), (0, 'if __name__ == "__main__":'), (1, "main(argparse.Namespace(epochs=1), [])")]
    # comments and blank lines anywhere
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(lines)))
        if at and lines[at - 1][1].endswith("\\"):
            continue  # a backslash continues onto the next line: nothing may come between
        depth = lines[at][0] if at < len(lines) else 0
        lines.insert(at, (depth, draw(st.sampled_from(["# a note", "", "#", "# TODO: tune"]))))
    indent = draw(st.sampled_from(["    ", "  ", "\t"]))
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    encoding = draw(st.sampled_from(["utf-8", "utf-8-sig", "latin-1"]))
    text = newline.join(indent * depth + line if line else "" for depth, line in lines) + newline
    if encoding == "latin-1":
        text = "# -*- coding: latin-1 -*-" + newline + "# d\u00e9j\u00e0 vu" + newline + text
    config = draw(st.none() | configs())
    return {"text": text, "encoding": encoding, "newline": newline, "config": config, "style": style}


@st.composite
def configs(draw) -> tuple[str, str]:
    kind = draw(st.sampled_from(["MULTI_GPU", "FSDP", "DEEPSPEED"]))
    lines = ["compute_environment: LOCAL_MACHINE", f"distributed_type: {kind}"]
    if kind == "FSDP":
        version = draw(st.sampled_from(["1", "2"]))
        lines += ["fsdp_config:", f"  fsdp_version: {version}", "  fsdp_sharding_strategy: FULL_SHARD"]
        if draw(st.booleans()):
            lines.append("  fsdp_use_orig_params: true")
    if kind == "DEEPSPEED":
        lines += ["deepspeed_config:", f"  zero_stage: {draw(st.sampled_from([1, 2, 3]))}"]
    if draw(st.booleans()):
        lines.append(f"gradient_accumulation_steps: {draw(st.sampled_from([1, 4]))}")
    lines += ["mixed_precision: bf16", "num_processes: 2"]
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), "# generated")
    newline = draw(st.sampled_from(["\n", "\r\n"]))
    launch = draw(
        st.sampled_from(
            [
                "accelerate launch --config_file config.yaml train.py",
                "accelerate launch --config_file config.yaml \\\n  --num_processes 2 \\\n  train.py --epochs 1",
                "torchrun --nproc_per_node 2 train.py",
            ]
        )
    )
    return newline.join(lines) + newline, "#!/usr/bin/env bash" + newline + launch.replace("\n", newline) + newline


# -- running lintdist in-process ------------------------------------------------------------------------------


def _write(folder: Path, example: dict) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.iterdir():
        stale.unlink()
    files = {"train.py": example["text"].encode(example["encoding"])}
    if example["config"] is not None:
        files["config.yaml"] = example["config"][0].encode()
        files["launch.sh"] = example["config"][1].encode()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def _run(folder: Path, mode: str = "check"):
    options = resolve_settings(None, folder, select=("ALL",))
    result = run([str(folder)], options, mode=mode, unsafe=True, jobs=1, use_cache=False)
    assert result.internal_errors == [], result.internal_errors
    return result.findings


def _counts(findings) -> collections.Counter:
    return collections.Counter((Path(f.filename).name, f.code) for f in findings)


def _assert_same_form(name: str, before: bytes, after: bytes, example: dict) -> None:
    if name != "train.py":
        if b"\r\n" in before:
            assert after.count(b"\n") == after.count(b"\r\n"), "CRLF line endings kept"
        return
    assert after.startswith(codecs.BOM_UTF8) == before.startswith(codecs.BOM_UTF8), "BOM kept"
    text = after.decode(example["encoding"])
    cst.parse_module(after)  # libcst reads the coding cookie and the BOM itself
    if example["newline"] == "\r\n":
        assert text.count("\n") == text.count("\r\n"), "CRLF line endings kept"
    else:
        assert "\r" not in text, "LF line endings kept"
    if example["encoding"] == "latin-1":
        assert text.startswith("# -*- coding: latin-1 -*-"), "coding cookie kept"


@given(example=scripts())
def test_generated_programs_keep_every_fix_property(example, tmp_path_factory):
    folder = tmp_path_factory.mktemp("generated")
    files = _write(folder, example)
    before = _run(folder)
    STATS["programs"] += 1
    STATS["findings"] += len(before)
    STATS["programs with a finding"] += bool(before)
    STATS.update(f.code for f in before)

    _run(folder, mode="fix")
    fixed = {name: (folder / name).read_bytes() for name in files}
    for name, data in files.items():
        if fixed[name] != data:
            STATS["files fixed"] += 1
            _assert_same_form(name, data, fixed[name], example)
    after = _run(folder)
    grown = {key: n for key, n in _counts(after).items() if n > _counts(before)[key]}
    assert grown == {}, f"a fix added findings: {grown}"
    assert [f for f in after if f.fix_applicability is not None and f.fix_applicability.value == "safe"] == []

    _run(folder, mode="fix")
    assert {name: (folder / name).read_bytes() for name in files} == fixed, "a second fix changed something"

    # a suppression on a reported Python line silences that finding and nothing else
    _write(folder, example)
    python = [f for f in before if f.filename.endswith("train.py") and f.cell is None]
    if python:
        target = python[0]
        lines = example["text"].split(example["newline"])
        line = lines[target.span.line - 1]
        if not line.rstrip().endswith("\\") and "#" not in line:
            lines[target.span.line - 1] = f"{line}  # lintdist: ignore[{target.code}]"
            (folder / "train.py").write_bytes(example["newline"].join(lines).encode(example["encoding"]))
            left = [(f.code, f.span.line) for f in _run(folder) if f.filename.endswith("train.py")]
            expected = [
                (f.code, f.span.line) for f in python if (f.code, f.span.line) != (target.code, target.span.line)
            ]
            assert left == expected
            STATS["suppressions checked"] += 1

    # the same for a finding in the generated config or launch file
    _write(folder, example)
    others = [f for f in before if not f.filename.endswith("train.py")]
    if others:
        target = others[0]
        name = Path(target.filename).name
        newline = "\r\n" if b"\r\n" in files[name] else "\n"
        lines = files[name].decode().split(newline)
        line = lines[target.span.line - 1]
        if not line.rstrip().endswith("\\") and "#" not in line:
            lines[target.span.line - 1] = f"{line}  # lintdist: ignore[{target.code}]"
            (folder / name).write_bytes(newline.join(lines).encode())
            left = [(f.code, f.span.line) for f in _run(folder) if Path(f.filename).name == name]
            expected = [
                (f.code, f.span.line)
                for f in before
                if Path(f.filename).name == name and (f.code, f.span.line) != (target.code, target.span.line)
            ]
            assert left == expected
            STATS["config/launch suppressions checked"] += 1


def test_zz_generated_programs_reach_the_rules():
    """The generator is only worth its time if rules fire and fix on what it builds (runs after the property)."""
    print(f"property test statistics: {dict(STATS)}")
    if not STATS["programs"]:
        pytest.skip("the property test did not run in this session (selected alone?)")
    assert STATS["programs with a finding"] >= STATS["programs"] // 3
    assert STATS["files fixed"] > 0
