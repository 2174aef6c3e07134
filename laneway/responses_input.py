"""A Responses API request's prompt as the chat an engine renders: `instructions`, every
`input` item and the function `tools`, turned into chat messages and chat tools the way vLLM
does before its chat template frames them.

vLLM's `OpenAIServingResponses._construct_input_messages`
(vllm/entrypoints/openai/serving_responses.py): `instructions` become a system message
first, then the stored history of `previous_response_id` (its input messages, then its
output messages as assistant messages, reasoning skipped), then the new input: a string is
one user message, a list is taken item by item. `construct_chat_message_with_tool_call`
(vllm/entrypoints/responses_utils.py) makes a `function_call` item an assistant message with
one tool call and a `function_call_output` item a tool message. Function tools are flat in
the Responses API (`{type, name, description, parameters}`) and nested in chat: vLLM 0.32's
`construct_tool_dicts` (vllm/entrypoints/openai/responses/utils.py) makes each one a chat
tool whose `function` is a `FunctionDefinition` dumped: `name`, `description` and
`parameters` (null where absent), then `strict` and `defer_loading` only where set, in that
order (the template's `tojson` keeps it), without the flat tool's `type`.

The gateway and the simulator both convert with this, so they frame a request alike. The
previous response's history is the engine's to prepend: only it holds the messages.
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Input items a request may carry. OpenAI's own limit on a list is not documented; this one
# is the gateway's, far above any conversation a context holds (each item is a message at
# least a few tokens long) and below the body's JSON value limit.
MAX_INPUT_ITEMS = 2048
# Text content parts: what the client writes (input_text), what it sends back from an
# earlier response (output_text), and the chat form.
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


class ResponsesInputError(ValueError):
    """The request cannot be turned into a chat; `param` names the field (OpenAI's `param`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ResponsesChat:
    messages: tuple[dict[str, Any], ...]  # as a chat completion's `messages`
    tools: tuple[dict[str, Any], ...] | None  # as a chat completion's `tools`; None: none


def responses_chat(payload: Mapping[str, Any]) -> ResponsesChat:
    """The request's `instructions`, `input` and `tools` as chat messages and chat tools;
    ResponsesInputError for what no engine would take."""
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ResponsesInputError("'instructions' must be a string", "instructions")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given = payload.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        if len(given) > MAX_INPUT_ITEMS:
            raise ResponsesInputError(
                f"'input' holds {len(given)} items, more than the limit of {MAX_INPUT_ITEMS}",
                "input",
            )
        messages.extend(m for i, item in enumerate(given) if (m := _item(item, i)) is not None)
    else:
        raise ResponsesInputError("'input' must be a string or a list of input items", "input")
    return ResponsesChat(messages=tuple(messages), tools=_tools(payload.get("tools")))


def _item(item: object, index: int) -> dict[str, Any] | None:
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise ResponsesInputError(f"'{where}' must be an object", where)
    kind = item.get("type", "message")  # an easy input message may leave out its type
    if kind == "message":
        return _message(item, where)
    if kind == "function_call":
        name, arguments = _string(item, "name", where), _string(item, "arguments", where)
        call = {"id": _string(item, "call_id", where), "type": "function",
                "function": {"name": name, "arguments": arguments}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            raise ResponsesInputError(f"'{where}.output' must be a string", f"{where}.output")
        return {"role": "tool", "content": output, "tool_call_id": _string(item, "call_id", where)}
    if kind == "reasoning":
        # vLLM leaves reasoning out of the chat it renders ("We skip the reasoning output").
        return None
    known = ", ".join(ITEM_TYPES)
    raise ResponsesInputError(
        f"'{where}.type' {kind!r} is not an input item type served here; known: {known}",
        f"{where}.type",
    )


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        roles = ", ".join(sorted(MESSAGE_ROLES))
        raise ResponsesInputError(f"'{where}.role' must be one of {roles}", f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise ResponsesInputError(
            f"'{where}.content' must be a string or a list of content parts", f"{where}.content"
        )
    parts = []
    for index, part in enumerate(content):
        at = f"{where}.content[{index}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ResponsesInputError(f"'{at}' must be an object with a 'type'", at)
        if part["type"] in TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise ResponsesInputError(f"'{at}.text' must be a string", f"{at}.text")
            parts.append({"type": "text", "text": text})
        else:
            parts.append(dict(part))  # an image or a file: no text to count
    return {"role": role, "content": parts}


def _string(item: Mapping[str, Any], field: str, where: str) -> str:
    value = item.get(field)
    if not isinstance(value, str):
        raise ResponsesInputError(f"'{where}.{field}' must be a string", f"{where}.{field}")
    return value


def _tools(tools: object) -> tuple[dict[str, Any], ...] | None:
    if tools is None:
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        raise ResponsesInputError("'tools' must be a list", "tools")
    converted = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ResponsesInputError(
                f"'{where}' must be a function tool ({{'type': 'function', 'name': ...}}): "
                "built-in tools are not served here",
                where,
            )
        converted.append({"type": "function", "function": _function(tool, where)})
    return tuple(converted) or None


def _function(tool: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The chat tool's `function` as vLLM renders it (the module's docstring)."""
    function: dict[str, Any] = {"name": _string(tool, "name", where)}
    for field, kind, named in _FUNCTION_FIELDS:
        value = tool.get(field)
        if value is not None and not isinstance(value, kind):
            raise ResponsesInputError(f"'{where}.{field}' must be {named}", f"{where}.{field}")
        if value is not None or field in ("description", "parameters"):
            function[field] = value
    return function


# A function tool's optional fields, in FunctionDefinition's order, with the type each takes.
_FUNCTION_FIELDS: tuple[tuple[str, type, str], ...] = (
    ("description", str, "a string"),
    ("parameters", dict, "an object"),
    ("strict", bool, "true or false"),
    ("defer_loading", bool, "true or false"),
)
