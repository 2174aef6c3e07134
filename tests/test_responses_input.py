"""A Responses request's prompt as the chat the engine renders (laneway/responses_input.py):
each input item kind as vLLM converts it, and what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from laneway.responses_input import (
    MAX_INPUT_ITEMS,
    ResponsesChat,
    ResponsesInputError,
    responses_chat,
)


def test_instructions_then_every_item_kind_in_order() -> None:
    chat = responses_chat(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Track 42"},
                                             {"type": "input_image", "image_url": "x"}]},
                {"type": "reasoning", "id": "rs", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "track",
                 "arguments": '{"id": "42"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "Leeds"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "In Leeds."}]},
            ],
            "tools": [{"type": "function", "name": "track", "parameters": {"type": "object"}}],
        }
    )  # fmt: skip
    assert chat == ResponsesChat(
        messages=(
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Track 42"},
                                         {"type": "input_image", "image_url": "x"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "track", "arguments": '{"id": "42"}'}}]},
            {"role": "tool", "content": "Leeds", "tool_call_id": "c1"},
            {"role": "assistant", "content": [{"type": "text", "text": "In Leeds."}]},
        ),
        # vLLM 0.32's FunctionDefinition: no `type`, a null description, unset strict left out.
        tools=({"type": "function", "function": {"name": "track", "description": None,
                                                  "parameters": {"type": "object"}}},),
    )  # fmt: skip


def test_a_function_tool_is_rendered_in_vllms_field_order() -> None:
    """The template's tojson keeps key order, so the count depends on it: FunctionDefinition's
    (name, description, parameters, strict), whatever order the client wrote."""
    tool = {"strict": True, "parameters": {}, "type": "function", "description": "d", "name": "f"}
    chat = responses_chat({"input": "hi", "tools": [tool]})
    assert chat.tools is not None
    assert list(chat.tools[0]["function"].items()) == [
        ("name", "f"), ("description", "d"), ("parameters", {}), ("strict", True),
    ]  # fmt: skip


def test_a_string_input_is_one_user_message() -> None:
    chat = responses_chat({"input": "hi"})
    assert chat == ResponsesChat(messages=({"role": "user", "content": "hi"},), tools=None)


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
         "input[0].content[0].text"),
        ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
        ({"input": ["hi"]}, "input[0]"),
        ({"input": None}, "input"),
        ({"input": [{"role": "user", "content": "x"}] * (MAX_INPUT_ITEMS + 1)}, "input"),
        ({"input": "hi", "instructions": ["no"]}, "instructions"),
        ({"input": "hi", "tools": {"type": "function"}}, "tools"),
        ({"input": "hi", "tools": [{"type": "file_search"}]}, "tools[0]"),
        ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": 5}]},
         "tools[0].parameters"),
        ({"input": "hi", "tools": [{"type": "function", "name": "f", "description": 1}]},
         "tools[0].description"),
        ({"input": "hi", "tools": [{"type": "function", "name": "f", "strict": "yes"}]},
         "tools[0].strict"),
    ],
)  # fmt: skip
def test_what_no_engine_would_take_names_its_field(payload: dict[str, Any], param: str) -> None:
    with pytest.raises(ResponsesInputError) as refused:
        responses_chat(payload)
    assert refused.value.param == param
