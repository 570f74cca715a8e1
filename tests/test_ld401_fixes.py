"""LD401 fixes where the accelerator is out of reach: callers unseen (unsafe) or main-process-only (no fix)."""

from __future__ import annotations

from pathlib import Path

from lintdist.engine import check_text, fix_text
from lintdist.model import Applicability
from lintdist.registry import all_rules

RULE = next(rule for rule in all_rules() if rule.code == "LD401")

UNSEEN_CALLERS = """\
from accelerate import Accelerator
from datasets import load_dataset


def build_corpus(name):
    corpus = load_dataset(name)
    return corpus.map(len)


def report():
    Accelerator().print("imported by the training entry point")
"""

MAIN_ONLY_CALLER = """\
from accelerate import Accelerator
from datasets import load_dataset


def build_corpus(name):
    return load_dataset(name).map(len)


def main():
    accelerator = Accelerator()
    corpus = build_corpus("acme/corpus")
    if accelerator.is_main_process:
        preview = build_corpus("acme/preview")
"""


def _findings(code: str):
    findings, _ = check_text(code, path=Path("train.py"), display="train.py", kind="python", rules=[RULE])
    return findings


def test_helper_with_unseen_callers_gets_no_fix():
    # its callers may sit under a rank guard in another module (open_clip's main.py): a barrier could hang
    (finding,) = _findings(UNSEEN_CALLERS)
    assert finding.span.line == 7  # the map: `load_dataset` locks its cache, the other ranks wait there
    assert finding.fix is None
    assert "no automatic fix: `build_corpus()` is called from code lintdist cannot see" in finding.message


def test_helper_called_by_every_rank_in_another_module_gets_the_runtime_fix(tmp_path):
    (tmp_path / "corpus.py").write_text(UNSEEN_CALLERS)
    (tmp_path / "train.py").write_text("from corpus import build_corpus\n\nrows = build_corpus('acme/corpus')\n")
    path = tmp_path / "corpus.py"
    (finding,) = check_text(UNSEEN_CALLERS, path=path, display="corpus.py", kind="python", rules=[RULE])[0]
    assert finding.fix is not None and finding.fix.applicability is Applicability.UNSAFE
    fixed = fix_text(UNSEEN_CALLERS, path=path, display="corpus.py", kind="python", rules=[RULE], unsafe=True)
    assert "from lintdist.runtime import main_process_first" in fixed.text
    assert (
        "    corpus = load_dataset(name)\n    with main_process_first():\n        return corpus.map(len)\n"
        in fixed.text
    )
    assert fixed.findings == []


def test_helper_also_called_on_the_main_process_only_gets_no_fix():
    (finding,) = _findings(MAIN_ONLY_CALLER)
    assert finding.span.line == 6
    assert finding.fix is None
    assert "main-process-only caller" in finding.message


LOADED_BEFORE_STATE = """\
from accelerate import Accelerator
from datasets import load_dataset


def main(args):
    raw = load_dataset(args.dataset_name).map(normalize)
    accelerator = Accelerator({keywords})
    return accelerator, raw


if __name__ == "__main__":
    main(parse_args())
"""


def test_load_before_the_accelerator_gets_an_unsafe_early_partial_state():
    code = LOADED_BEFORE_STATE.format(keywords="gradient_accumulation_steps=4, mixed_precision=args.precision")
    (finding,) = _findings(code)
    assert finding.fix is not None and finding.fix.applicability is Applicability.UNSAFE
    assert "`with PartialState().main_process_first():`" in finding.message
    fixed = fix_text(code, path=Path("train.py"), display="train.py", kind="python", rules=[RULE], unsafe=True)
    assert fixed.text.startswith("from accelerate import PartialState, Accelerator\n")
    assert (
        "    with PartialState().main_process_first():\n        raw = load_dataset(args.dataset_name).map(normalize)\n"
        in fixed.text
    )
    assert fixed.findings == []
    again = fix_text(fixed.text, path=Path("train.py"), display="train.py", kind="python", rules=[RULE], unsafe=True)
    assert again.text == fixed.text


def test_no_early_partial_state_where_the_accelerator_sets_up_the_process_state():
    # `cpu=True` on a state already on a GPU raises in accelerate; kwargs handlers carry process-group options
    for keywords in ("cpu=args.cpu", "kwargs_handlers=[handler]", "**options"):
        (finding,) = _findings(LOADED_BEFORE_STATE.format(keywords=keywords))
        assert finding.fix is None, keywords
        assert "create the accelerator first" in finding.message


def test_no_early_partial_state_where_the_name_is_taken():
    code = "PartialState = None\n" + LOADED_BEFORE_STATE.format(keywords="")
    (finding,) = _findings(code)
    assert finding.fix is None
