"""The options a launch line passes to its script (``train.py --deepspeed ds.json --max_grad_norm 0.5``)."""

from __future__ import annotations

from lintdist.sources import Flag, LaunchCommand, shell_tokens


def script_flags(command: LaunchCommand, text: str) -> dict[str, Flag]:
    """The ``--name value``/``--name=value`` options after the script on ``command``'s line, by name (dashes inside
    turned to underscores, as ``HfArgumentParser`` and argparse read them); a bare ``--flag`` before another option
    has the value None; a later spelling wins. ``text`` is the launch file's shell text (``launch_text``)."""
    script = command.script
    if script is None:
        return {}
    words = next((w for w in shell_tokens(text) if any(t.start == script.start for t in w)), [])
    rest = words[next(i for i, t in enumerate(words) if t.start == script.start) + 1 :] if words else []
    flags: dict[str, Flag] = {}
    i = 0
    while i < len(rest):
        word = rest[i]
        i += 1
        if not word.text.startswith("--"):
            continue
        name, equals, value = word.text[2:].partition("=")
        name = name.replace("-", "_")
        if equals:
            flags[name] = Flag(name, value, word)
        elif i < len(rest) and not rest[i].text.startswith("--"):
            flags[name] = Flag(name, rest[i].text, word, rest[i])
            i += 1
        else:
            flags[name] = Flag(name, None, word)
    return flags
