"""The README, the generated rule docs and CI stay in step with the code."""

from __future__ import annotations

import re
from pathlib import Path

from lintdist.report import rules_documentation, rules_table

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_rule_table_is_generated_from_the_rules():
    table = re.search(r"<!-- rules-table:start -->\n(.*?)\n<!-- rules-table:end -->", README, re.DOTALL).group(1)
    assert table == rules_table(markdown=True), "run `lintdist rules --markdown` and paste it into README.md"


def test_rule_docs_page_is_generated_from_the_rules():
    assert (ROOT / "docs" / "rules.md").read_text() == rules_documentation() + "\n", (
        "run `lintdist rules --docs > docs/rules.md`"
    )


def test_ci_runs_exactly_the_readme_test_command():
    commands = re.findall(r"```sh\n(.*?)\n```", README, re.DOTALL)
    test_command = next(c for c in commands if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == test_command
    assert "pip install torch==2.13.0" in test_command.split("&&")[2]


def test_rule_manifest_is_generated_from_the_rules():
    from lintdist.registry import manifest_source

    assert (ROOT / "rules" / "_manifest.py").read_text() == manifest_source(), (
        "run `lintdist rules --manifest > rules/_manifest.py`"
    )


def test_every_rule_module_is_one_rule():
    from lintdist.registry import all_rules

    modules = [rule.__module__ for rule in all_rules() if rule.__module__.startswith("lintdist.rules.")]
    assert len(modules) == len(set(modules))
    assert len(modules) == len([p for p in (ROOT / "rules").glob("*.py") if not p.name.startswith("_")])
