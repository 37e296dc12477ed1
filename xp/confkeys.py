"""What conf/ declares, read from its YAML text: every key with its default, its comment and whether it can change
a trial's result (its class in a study's question). The help, the configuration reference (xp.confref) and a
study's question (xp.studies.question) read it here."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.\-]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
SECTION = re.compile(r"^#\s*---\s*(?P<title>.*?)\s*-*\s*$")
NOT_USERS = ("defaults", "hydra", "optuna")  # config.yaml's keys a user does not set (Hydra's, a study's trial's)

TAG = re.compile(r"\s*\[(?P<tag>(?:result|measured|how)(?: if [\w.]+(?:=[^\]\s]+)?)?)\]\s*$")
HEADER = re.compile(r"^#\s*xp\.question:\s*(?P<tag>\S.*?)\s*$")  # a file's default for its untagged keys
# Whether a key can change a trial's result, declared at the end of its comment (or by its file's header
# `# xp.question: CLASS`, or by the node above it), read by xp.studies.question:
QUESTION = {"result": "part of a study's question: it changes what a trial trains",
            "measured": "part of it only where an objective is measured (throughput, time, cost): it changes what is "
                        "measured of a trial, not what it trains",
            "how": "never part of it: where or how a trial runs, or what is recorded besides its result",
            "result if KEY[=VALUE]": "part of it only while KEY is set (to VALUE)"}


@dataclass(frozen=True)
class Key:
    key: str  # dotted: checkpoint.keep_last
    default: str  # as written in the file ("" for a node of keys)
    comment: str
    section: str = ""  # the "# --- title ---" it comes under
    question: str = ""  # result | measured | how | result if KEY[=VALUE] ("": not declared)


def keys(path: Path, skip: tuple[str, ...] = NOT_USERS) -> list[Key]:
    """The keys of one YAML file of conf/, nested keys dotted, with their default and comment."""
    out: list[Key] = []
    stack: list[tuple[int, str, str]] = []  # (indent, key, its question) of the nodes above
    section, default = "", ""
    for line in path.read_text().splitlines():
        if m := SECTION.match(line):
            section = m["title"]
            continue
        if m := HEADER.match(line):
            default = m["tag"]
            continue
        m = LINE.match(line)
        if not m or line.lstrip().startswith("#"):
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k, _ in stack] + [m["key"]])
        comment = (m["comment"] or "").strip()
        tag = TAG.search(comment)
        question = tag["tag"] if tag else stack[-1][2] if stack else default  # (its own, its node's, its file's)
        stack.append((indent, m["key"], question))
        if dotted.split(".")[0] in skip:
            continue
        out.append(Key(dotted, m["value"].strip(), comment[:tag.start()] if tag else comment, section, question))
    return out


def questions(conf: Path) -> dict[str, str]:
    """Every key of conf/ (a group's dotted under its group: model.log) with what it is to a study's question
    (QUESTION). A key two options of a group declare differently counts as `result` (the safe side)."""
    out = {k.key: k.question for k in keys(conf / "config.yaml", skip=("defaults", "hydra"))}
    for folder in sorted(p for p in conf.iterdir() if p.is_dir() and p.name != "hydra"):
        for path in sorted(folder.glob("*.yaml")):
            for k in keys(path, skip=()):
                name = f"{folder.name}.{k.key}"
                out[name] = k.question if out.get(name, k.question) == k.question else "result"
    return out
