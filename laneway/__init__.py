"""laneway: lanes for LLM inference traffic, at the gateway and in the engines."""

__version__ = "0.1.0"
