"""The repository's Dockerfile and .dockerignore, parsed as docker reads them."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass

from support import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case, e.g. "COPY"
    arguments: str  # the rest of the logical line, continuation lines joined


def parse_dockerfile(text: str) -> list[Instruction]:
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, arguments = (pending + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def stages(instructions: list[Instruction]) -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            result.append([])
        result[-1].append(instruction)
    return result


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus `**`) as a regular expression."""
    pattern = pattern.strip("/")
    out = ""
    index = 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out += "(?:.*/)?"
            index += 3
        elif pattern.startswith("**", index):
            out += ".*"
            index += 2
        elif pattern[index] == "*":
            out += "[^/]*"
            index += 1
        elif pattern[index] == "?":
            out += "[^/]"
            index += 1
        else:
            out += re.escape(pattern[index])
            index += 1
    return re.compile(out)


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception "!", pattern) in file order; the last rule that matches decides."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), _pattern_regex(line.removeprefix("!"))))
    return rules


def is_ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.split("/")
    # Like Docker, a rule matches a path when it matches the path or one of its parents.
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for exception, regex in rules:
        if any(regex.fullmatch(candidate) for candidate in candidates):
            ignored = not exception
    return ignored


def context_files() -> Iterator[str]:
    rules = dockerignore_rules()
    for top in sorted(ROOT.iterdir()):
        # Skip whole trees no exception rule reaches into (.venv, .git): walking them is slow.
        if is_ignored(top.name, rules) and not any(
            exception and regex.pattern.startswith(re.escape(top.name))
            for exception, regex in rules
        ):
            continue
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            relative = path.relative_to(ROOT).as_posix()
            if not is_ignored(relative, rules):
                yield relative


def image_environment(instructions: list[Instruction]) -> dict[str, str]:
    environment: dict[str, str] = {}
    for instruction in stages(instructions)[-1]:
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.arguments):
                key, _, value = pair.partition("=")
                environment[key] = value
    return environment
