"""Errors the CLI turns into one clear line and a non-zero exit, never a traceback."""

import os


class UsageError(Exception):
    """A flag, file or value the user gave cannot work; the message says what to change."""


class ChildError(RuntimeError):
    """A child died, never got ready, or was stopped before it was; says which and why."""


def cannot_listen(host: str, port: int, error: OSError, flag: str = "--port") -> UsageError:
    """A bind failure as one line that says what to change (not the event loop's wording)."""
    reason = os.strerror(error.errno).lower() if error.errno else str(error)
    return UsageError(f"cannot listen on {host}:{port} ({reason}); pick another with {flag}")


def missing_extra(feature: str, extra: str, error: ImportError) -> UsageError:
    """An optional dependency that is not installed, with the install line that brings it."""
    return UsageError(f"{feature} needs {error.name}: pip install 'laneway[{extra}]'")
