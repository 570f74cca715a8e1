"""The ``lintdist`` command line: check, rule, rules."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from lintdist import __version__

# The rules, the engine and libcst are imported by the commands that need them, so `--version` and `--help`
# start a bare process.

FORMATS = ("text", "concise", "json", "sarif", "github")


def _codes(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--select LD2,LD401 --select LD3`` -> ("LD2", "LD401", "LD3")."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lintdist")
def cli() -> None:
    """lintdist: find and fix distributed-training bugs in PyTorch scripts before launch.

    \b
    Examples:
      lintdist check train.py            report findings
      lintdist check --fix .             apply safe fixes
      lintdist rule LD201                explain a rule
    """


@cli.command()
@click.argument("paths", nargs=-1, type=click.Path(path_type=str))
@click.option(
    "--select", multiple=True, help="Rule codes or prefixes to enable (replaces the default set), e.g. LD2,LD401."
)
@click.option("--ignore", multiple=True, help="Rule codes or prefixes to disable.")
@click.option("--extend-select", multiple=True, help="Rule codes or prefixes to enable on top of the selection.")
@click.option(
    "--output-format", type=click.Choice(FORMATS), default="text", show_default=True, help="How to print findings."
)
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--statistics", is_flag=True, help="Print the number of findings per rule instead of the findings.")
@click.option("--fix", is_flag=True, help="Apply safe fixes, re-check, and write the files.")
@click.option("--unsafe-fixes/--no-unsafe-fixes", default=None, help="Also apply fixes that may change behaviour.")
@click.option("--diff", is_flag=True, help="Print the fixes as a unified diff; write nothing.")
@click.option("--no-cache", is_flag=True, help="Neither read nor write .lintdist_cache/.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="Worker processes (default: all cores).")
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    default=None,
    help="A lintdist.toml or pyproject.toml to use instead of the one found upward from the paths.",
)
@click.option(
    "--isolated",
    is_flag=True,
    help="Read no file outside the project: not the default accelerate config that `accelerate launch` "
    "reads for a line without --config_file.",
)
@click.option("--quiet", "-q", is_flag=True, help="Print the findings only: no code frames, no summary.")
@click.option(
    "--docs/--no-docs",
    default=None,
    help="Check the code blocks of Markdown, MDX and reStructuredText pages (default: on; `docs` setting).",
)
@click.option(
    "--docstrings/--no-docstrings",
    default=None,
    help="Check the examples in Python docstrings (default: off; `docstrings` setting).",
)
def check(
    paths,
    select,
    ignore,
    extend_select,
    output_format,
    exit_zero,
    statistics,
    fix,
    unsafe_fixes,
    diff,
    no_cache,
    jobs,
    config_file,
    isolated,
    quiet,
    docs,
    docstrings,
) -> None:
    """Check PATHS (files or directories; default: the current directory).

    Finds Python scripts, notebooks (*.ipynb), accelerate/DeepSpeed configs
    (*.yaml, *.yml, *.json), launch files (*.sh) and the code blocks of
    documentation pages (*.md, *.mdx, *.rst), honouring .gitignore and the
    configured excludes.
    A file named explicitly is always checked.

    Exit status: 0 no findings, 1 findings, 2 usage error or internal failure.
    With --fix, 0 only if no finding remains; with --diff, 1 when there is a diff.
    """
    from lintdist.config import ConfigError, resolve_settings
    from lintdist.report import (
        render_concise,
        render_github,
        render_json,
        render_sarif,
        render_statistics,
        render_text,
        summary,
    )
    from lintdist.runner import run

    paths = list(paths) or ["."]
    start = Path(os.path.commonpath([os.path.abspath(p) for p in paths]))
    try:
        settings = resolve_settings(
            config_file,
            start,
            select=_codes(select) or None,
            ignore=_codes(ignore),
            extend_select=_codes(extend_select),
            unsafe_fixes=unsafe_fixes,
            isolated=isolated,
            docs=docs,
            docstrings=docstrings,
        )
    except ConfigError as error:
        raise click.UsageError(str(error)) from error
    mode = "diff" if diff else "fix" if fix else "check"
    result = run(
        paths,
        settings,
        mode=mode,
        unsafe=settings.unsafe_fixes,
        jobs=jobs,
        use_cache=not no_cache,
        want_edits=output_format == "sarif",
    )
    findings = result.findings

    if diff:
        click.echo("".join(r.diff for r in result.reports), nl=False)
    for report in result.reports:
        for message in report.dropped:
            click.echo(f"warning: {report.display}: {message}", err=True)
    if statistics:
        if findings:
            click.echo(render_statistics(findings))
    elif output_format == "json":
        click.echo(render_json(findings))
    elif output_format == "sarif":
        click.echo(render_sarif(findings))
    elif output_format == "github":
        if findings:
            click.echo(render_github(findings))
    elif output_format == "concise" or quiet:
        if findings:
            click.echo(render_concise(findings))
    else:
        text = render_text(findings, colour=sys.stdout.isatty())
        if text:
            click.echo(text)
    applied = sum(r.applied for r in result.reports)
    if output_format in {"text", "concise"} and not quiet and not diff:
        click.echo(
            summary(findings, unsafe=settings.unsafe_fixes, fixed=applied if mode == "fix" else 0), err=statistics
        )
    for error in result.internal_errors:
        click.echo(f"error: internal failure: {error}", err=True)
    if result.internal_errors:
        sys.exit(2)
    pending_diff = diff and any(r.diff for r in result.reports)
    sys.exit(0 if exit_zero or not (findings or pending_diff) else 1)


@cli.command("rule")
@click.argument("code")
def rule_command(code: str) -> None:
    """Print the documentation of the rule CODE (e.g. LD201)."""
    from lintdist.registry import rule_by_code

    rule = rule_by_code(code)
    if rule is None:
        raise click.UsageError(f"unknown rule code {code!r} (see `lintdist rules`)")
    fix = {"safe": "safe fix (--fix)", "unsafe": "unsafe fix (--fix --unsafe-fixes)", "none": "no fix"}[rule.fix_kind]
    state = "on by default" if rule.default_enabled else "off by default (enable with --extend-select)"
    click.echo(f"# {rule.code} {rule.name}\n\nSeverity: {rule.severity.value}; {state}; {fix}.\n")
    click.echo(rule.documentation())


@cli.command("rules")
@click.option("--markdown", is_flag=True, help="Print the table as Markdown (as in the README).")
@click.option("--docs", is_flag=True, help="Print every rule's documentation as Markdown (docs/rules.md).")
@click.option("--manifest", is_flag=True, help="Print the rules' manifest (rules/_manifest.py).")
def rules_command(markdown: bool, docs: bool, manifest: bool) -> None:
    """List every rule: code, name, severity, default on/off and fix kind."""
    from lintdist.report import rules_documentation, rules_table

    if manifest:
        from lintdist.registry import manifest_source

        click.echo(manifest_source(), nl=False)
        return
    click.echo(rules_documentation() if docs else rules_table(markdown=markdown))


@cli.command("server")
def server_command() -> None:
    """Run the language server (LSP over stdio) for editors: diagnostics, quick fixes, fix all, suppressions."""
    try:
        from lintdist.server import serve
    except ImportError as error:
        click.echo(
            f"error: `lintdist server` needs pygls ({error.name or error}): pip install 'lintdist[server]'", err=True
        )
        sys.exit(2)
    serve()


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as error:
        error.show()
        sys.exit(2)
    except click.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(2)
    except SystemExit:
        raise
    except Exception as error:  # noqa: BLE001 - a crash is exit 2 with a message, never a traceback-only exit 1
        click.echo(f"error: internal failure: {type(error).__name__}: {error}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
