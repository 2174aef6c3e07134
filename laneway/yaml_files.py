"""A user's YAML file read for a command: one place for the messages of a file that cannot be
read, is not YAML, or holds something other than a mapping where one is needed. Each is a
UsageError on one line that names the file (and where in it), so the CLI prints what to
change and no traceback. What each field must be stays with the reader that knows it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from laneway.errors import UsageError

T = TypeVar("T")


def read_yaml(path: Path, what: str) -> object:
    """The one YAML document of `path` (None when empty); `what` names the file in the
    message when it cannot be read ("cannot read tenants file PATH: ...")."""
    return _parse(path, what, yaml.safe_load)


def read_yaml_documents(path: Path, what: str) -> list[object]:
    """Every document of `path` but the empty ones (a `---` too many is no document)."""
    return _parse(path, what, lambda text: [d for d in yaml.safe_load_all(text) if d is not None])


def mapping(value: object, where: str) -> Mapping[str, Any]:
    """`value`, which must be a mapping; `where` says which value ("FILE: tenants[2]")."""
    if not isinstance(value, Mapping):
        raise UsageError(f"{where}: must be a mapping")
    return value


def _parse(path: Path, what: str, load: Callable[[str], T]) -> T:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read {what} {path}: {error}") from None
    try:
        return load(text)  # safe_load_all parses lazily: inside the try, as the list is built
    except yaml.YAMLError as error:
        # PyYAML's message spans lines (the problem, then a marked copy of the line).
        raise UsageError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
