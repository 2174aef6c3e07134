"""Errors the CLI turns into one clear line and a non-zero exit, never a traceback."""


class UsageError(Exception):
    """A flag, file or value the user gave cannot work; the message says what to change."""


class ChildError(RuntimeError):
    """A child died, never got ready, or was stopped before it was; says which and why."""
