"""spec.tokenizer: how the gateway counts a pool's prompts."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from laneway.api.names import DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS
from laneway.api.wire import Wire, rule, rules


class TokenizerKind(StrEnum):
    TIKTOKEN = "tiktoken"
    HUGGINGFACE = "huggingface"
    ENGINE = "engine"  # the engine's own /tokenize, asked when the bounds do not decide


# Which kind each optional field belongs to, and what it is for that kind: the CEL rules
# below and laneway.api.checks say the same.
TOKENIZER_FIELD_KINDS = {
    "path": (TokenizerKind.HUGGINGFACE, "a tokenizer.json"),
    "encoding": (TokenizerKind.TIKTOKEN, "a tiktoken encoding"),
    "configPath": (TokenizerKind.HUGGINGFACE, "a tokenizer_config.json"),
    "timeoutMillis": (TokenizerKind.ENGINE, "the wait for the engine's /tokenize"),
}


class TokenizerSpec(Wire):
    """How the gateway counts this pool's prompts: the engine's own tokenizer, ideally."""

    model_config = ConfigDict(
        json_schema_extra=rules(
            rule(
                "self.kind != 'huggingface' || has(self.path)",
                ".path",
                "tokenizer.path is required for kind huggingface (a tokenizer.json)",
            ),
            rule(
                "self.kind == 'huggingface' || !has(self.path)",
                ".path",
                "tokenizer.path is for kind huggingface (a tokenizer.json)",
            ),
            rule(
                "self.kind == 'tiktoken' || !has(self.encoding)",
                ".encoding",
                "tokenizer.encoding is for kind tiktoken (a tiktoken encoding)",
            ),
            rule(
                "self.kind == 'huggingface' || !has(self.configPath)",
                ".configPath",
                "tokenizer.configPath is for kind huggingface (a tokenizer_config.json)",
            ),
            rule(
                "self.kind == 'engine' || !has(self.timeoutMillis)",
                ".timeoutMillis",
                "tokenizer.timeoutMillis is for kind engine (the wait for /tokenize)",
            ),
        )
    )

    kind: TokenizerKind = Field(
        description="tiktoken (an encoding), huggingface (a tokenizer.json, and optionally the "
        "chat template of a tokenizer_config.json), or engine (the engine's own /tokenize, "
        "asked only when cheap bounds do not decide the route)."
    )
    encoding: str | None = Field(
        default=None,
        min_length=1,
        description="A tiktoken encoding shipped offline, e.g. cl100k_base.",
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        description="A Hugging Face tokenizer.json in the gateway's filesystem, e.g. a "
        "ConfigMap mounted into the gateway pod.",
    )
    config_path: str | None = Field(
        default=None,
        min_length=1,
        description="The model's tokenizer_config.json in the gateway's filesystem, mounted "
        "like path: its chat_template (Jinja) and special tokens frame each chat as the "
        "engine frames it. Absent, chats are framed by OpenAI's rule.",
    )
    # A factory, not a default: the API server must leave it out, since the CEL rule above
    # refuses it on kinds other than engine.
    timeout_millis: int = Field(
        default_factory=lambda: DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS,
        ge=1,
        le=60_000,
        description="How long the gateway waits for the engine's /tokenize before it counts "
        f"with its default tokenizer instead (default {DEFAULT_ENGINE_TOKENIZE_TIMEOUT_MILLIS}).",
    )
