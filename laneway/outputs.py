"""Files the benchmark commands write their results to (--json, --plot)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from laneway.errors import UsageError


def check_output_folder(path: str | Path | None, flag: str) -> None:
    """Refuse an output file whose folder is missing before the run, not after it."""
    if path and not Path(path).resolve().parent.is_dir():
        raise UsageError(f"{flag}: the folder of {path} does not exist")


def write_json(path: str | Path, document: Any) -> None:
    Path(path).write_text(json.dumps(document, indent=2) + "\n")
