"""Plain-text tables for results people compare: first column left, numbers right-aligned."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], *, rule: bool = False
) -> list[str]:
    """The table's lines, columns two spaces apart; every row has the header's width.

    With `rule`, a line of dashes under each column separates the header from the rows.
    """
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"row {list(row)} has {len(row)} cells, the header {len(header)}")
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = [
        "  ".join(
            [row[0].ljust(widths[0])]
            + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        ).rstrip()
        for row in table
    ]
    if rule:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return lines
