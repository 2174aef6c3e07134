"""Plain-text tables for results people compare: first column left, numbers right-aligned."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """The table's lines, columns two spaces apart; every row has the header's width."""
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {list(row)} has {len(row)} cells, the header {len(header)}")
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return [
        "  ".join(
            [row[0].ljust(widths[0])]
            + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        ).rstrip()
        for row in table
    ]
