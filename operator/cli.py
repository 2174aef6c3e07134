"""Command-line entry points of this component."""

from __future__ import annotations

import argparse
from typing import Any


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add this component's subcommands; filled as the component lands."""
