"""LD503's message states the effect the length has: 1/W of training for a count of optimizer steps, k/W (or a
schedule that never finishes) for one multiplied by the accumulation steps, where no wrapper can mend it."""

from __future__ import annotations

from pathlib import Path

from lintdist.engine import check_text
from lintdist.registry import all_rules

RULE = next(rule for rule in all_rules() if rule.code == "LD503")
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ld503"


def _findings(name: str):
    path = FIXTURES / name
    findings, _ = check_text(path.read_text(), path=path, display=name, kind="python", rules=[RULE])
    return findings


def test_a_count_of_optimizer_steps_ends_after_one_over_w_and_is_fixable():
    (finding,) = _findings("no_trainer_prepared_length.py")
    assert "ends after 1/`num_processes` of training" in finding.message
    assert "gradient_accumulation_steps" not in finding.message
    assert finding.fix is not None


def test_a_count_times_the_accumulation_steps_ends_after_k_over_w_and_has_no_wrapping_fix():
    (finding,) = _findings("length_times_accumulation.py")
    assert "ends after `gradient_accumulation_steps`/`num_processes` of training" in finding.message
    assert "does not finish when the accumulation is at least the number of processes" in finding.message
    assert "1/`num_processes`" not in finding.message
    assert "drop the accumulation factor" in finding.message
    assert finding.fix is None


def test_a_given_or_derived_budget_times_the_accumulation_steps_names_both_effects():
    (finding,) = _findings("budget_times_accumulation.py")
    assert "with a given budget the schedule ends after `gradient_accumulation_steps`/" in finding.message
    assert "gets only 1/`gradient_accumulation_steps` of the way" in finding.message
    assert finding.fix is None
