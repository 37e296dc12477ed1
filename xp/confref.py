"""What the configuration means, read from conf/ itself: every key with its default and its comment, every group
with its options and theirs. `python -m xp --help` and the documentation's configuration reference are both
written from here, so neither can drift from the files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from xp.confkeys import HEADER, QUESTION, keys

DEFAULT = re.compile(r"^\s*-\s*(?P<group>\w+):\s*(?P<option>[^#\s]+)\s*(?:#\s?(?P<comment>.*))?$")


@dataclass(frozen=True)
class Group:
    name: str
    comment: str  # from config.yaml's defaults list
    default: str
    options: dict[str, str]  # option -> its file's first comment line


def groups(conf: Path) -> list[Group]:
    """The config groups of conf/ (and the sweep group: the studies in `sweeps`), in the defaults list's order."""
    from xp.studies.study import SWEEPS_DIR

    out = []
    for line in (conf / "config.yaml").read_text().splitlines():
        if (m := DEFAULT.match(line)) and m["group"] != "_self_":
            folder = SWEEPS_DIR if m["group"] == "sweep" else conf / m["group"]
            options = {f.stem: first_comment(f) for f in sorted(folder.glob("*.yaml"))}
            out.append(Group(m["group"], (m["comment"] or "").strip(), m["option"], options))
    return out


def first_comment(path: Path) -> str:
    """A config file's leading comment: what the option is (its lines joined)."""
    said = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if not HEADER.match(line):
            said.append(line.lstrip("# ").strip())
    return " ".join(s for s in said if s)


def help_text(conf: Path) -> str:
    """The part of `python -m xp --help` that says what the groups and keys mean."""
    lines = ["What the groups are (GROUP=OPTION; the options are listed above):"]
    lines += [f"  {g.name:<10} {g.comment} (default {g.default})" for g in groups(conf)]
    lines += ["", "Keys (KEY=VALUE; nested keys dotted, e.g. checkpoint.keep_last=1), with their defaults:"]
    section = None
    for k in keys(conf / "config.yaml"):
        if k.section != section:
            section = k.section
            lines.append(f" {section}:" if section else "")
        lines.append(f"  {k.key + ('=' + k.default if k.default else ''):<30} {k.comment}".rstrip())
    return "\n".join(lines)


def reference(conf: Path) -> str:
    """The documentation's configuration reference (docs/reference/configuration.md), in Markdown: every group
    with its options and each option's keys, then every key of config.yaml, each with its default and comment."""
    out = ["# Configuration reference", "",
           "Generated from `conf/` by `python -m xp.confref > docs/reference/configuration.md` (a test regenerates "
           "it and compares): what each group, option and key is, as the files' comments say.", "",
           "Choose an option with `GROUP=OPTION` (`model=resnet18`), change a key with `KEY=VALUE` (`batch=64`, "
           "`model.dropout=0.2`, `checkpoint.keep_last=1`).", "", "## Groups", ""]
    for g in groups(conf):
        out += [f"### `{g.name}`", "", f"{_sentence(g.comment)} Default: `{g.default}`.", ""]
        folder = None if g.name == "sweep" else conf / g.name
        for option, comment in g.options.items():
            out += [f"- **`{g.name}={option}`**: {comment or '-'}"]
            for k in keys(folder / f"{option}.yaml", skip=()) if folder else []:
                out.append(f"    - `{g.name}.{k.key}` = `{k.default}`: {k.comment or '-'} ({k.question})" if k.default
                           else f"    - `{g.name}.{k.key}`: {k.comment or '-'} ({k.question})")
        out.append("")
    out += ["## Keys", "", "The last column says whether a key is part of a study's *question* (a study refuses a "
            "command that changes such a key under its name, xp.studies.question), as its comment in `conf/` "
            "declares it (the value in parentheses after a group's key says the same):", "",
            *(f"- **{k}**: {v}." for k, v in QUESTION.items()), ""]
    section = None
    for k in keys(conf / "config.yaml"):
        if k.section != section:
            section = k.section
            out += ["", f"### {section[:1].upper() + section[1:]}", "", "| key | default | meaning | question |",
                    "|---|---|---|---|"]
        out.append(f"| `{k.key}` | {f'`{k.default}`' if k.default else ''} | {k.comment.replace('|', '/') or '-'} | "
                   f"{k.question} |")
    return "\n".join(out) + "\n"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".") if text else ""


if __name__ == "__main__":
    from xp.preflight import CONF_DIR

    print(reference(CONF_DIR), end="")
