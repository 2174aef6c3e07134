"""What the tests share that is no test: pure builders and types (imported from here), and
the resources they need as fixtures (support.fixtures, loaded by tests/conftest.py; e2e/
uses only the pure part). No test module imports another."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
