"""Command-line parts of the state layer: its flags on `laneway gateway`, `laneway bench redis`.

Kept light (argparse only): the CLI imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

TENANTS_ENV = "LANEWAY_TENANTS_FILE"
BATCH_CONCURRENCY = 8  # batch items one replica runs in the batch lane at once
BATCH_LEASE_S = 30.0  # silence after which another replica takes over a replica's items
MAX_FILE_BYTES = 100 * 1024 * 1024


def add_gateway_flags(parser: argparse.ArgumentParser) -> None:
    """The state layer's flags on `laneway gateway` (beside --redis-url, declared there)."""
    parser.add_argument(
        "--tenants",
        metavar="PATH",
        default=os.environ.get(TENANTS_ENV),
        help="API keys and limits per tenant: a YAML file, or a directory such as a mounted "
        f"Secret; turns auth on (default ${TENANTS_ENV}; unset: no auth)",
    )
    parser.add_argument(
        "--batch-concurrency",
        type=int,
        default=BATCH_CONCURRENCY,
        metavar="N",
        help="batch items this replica runs in the batch lane at once "
        f"(default {BATCH_CONCURRENCY})",
    )
    parser.add_argument(
        "--batch-lease",
        type=float,
        default=BATCH_LEASE_S,
        metavar="SECONDS",
        help="silence after which another replica takes over a replica's batch items "
        f"(default {BATCH_LEASE_S:g})",
    )
    parser.add_argument(
        "--max-file-bytes",
        type=int,
        default=MAX_FILE_BYTES,
        metavar="BYTES",
        help=f"largest batch input file accepted (default {MAX_FILE_BYTES})",
    )


def register(
    commands: argparse._SubParsersAction[Any], bench: argparse._SubParsersAction[Any]
) -> None:
    """Add `bench redis`."""
