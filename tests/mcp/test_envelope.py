"""The one envelope rule of both MCP transports (:func:`prefect_baton.mcp._envelope.read_message`):
each client document is parsed once, and what is not a JSON-RPC message of MCP gets its
JSON-RPC error with a short message."""

from __future__ import annotations

import json
from typing import Any

import mcp.types as types
import pytest

from prefect_baton.mcp import _envelope, _stdio


def test_a_line_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stdin line is read by one ``json.loads`` and passed on as the message it holds
    (no second parse by the ``mcp`` package, no third for the duplicate-key check)."""
    calls: list[str] = []
    loads = json.loads

    def counting(text: Any, **kw: Any) -> Any:
        calls.append(text)
        return loads(text, **kw)

    monkeypatch.setattr(_envelope.json, "loads", counting)
    line = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/list"}\n'
    message = _stdio._read_stdin_line(line)
    assert isinstance(message, types.JSONRPCRequest)
    assert (message.id, message.method) == (7, "tools/list")
    assert len(calls) == 1


def test_a_key_twice_names_the_id_when_it_is_given_once() -> None:
    """A repeated key at any depth is ``-32600`` with the request's id (given once)."""
    text = '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"a": 1, "a": 2}}'
    answer = _envelope.read_message(text)
    assert isinstance(answer, types.JSONRPCError)
    assert (answer.id, answer.error.code) == (3, types.INVALID_REQUEST)
    assert "the key 'a' appears twice in one object" in answer.error.message


def test_a_key_twice_inside_an_array_is_an_invalid_request_with_id_null() -> None:
    """A repeated key inside a top-level array: ``-32600``, ``id`` null (no id to read)."""
    answer = _envelope.read_message('[{"a": 1, "a": 2}]')
    assert isinstance(answer, types.JSONRPCError)
    assert (answer.id, answer.error.code) == (None, types.INVALID_REQUEST)
    assert "the key 'a' appears twice in one object" in answer.error.message


@pytest.mark.parametrize("params", [[1], "x", 5])
def test_params_that_are_not_an_object_are_invalid_params_in_one_line(params: Any) -> None:
    """``params`` that are not an object: ``-32602`` with the request's id and a short
    message naming the field, without pydantic's layout or URL."""
    doc = {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": params}
    answer = _envelope.read_message(json.dumps(doc))
    assert isinstance(answer, types.JSONRPCError)
    assert (answer.id, answer.error.code) == (4, types.INVALID_PARAMS)
    assert answer.error.message == "Invalid params: params: Input should be a valid dictionary"


@pytest.mark.parametrize("rid", [None, 1.5, True, {"a": 1}])
def test_a_request_id_that_is_not_a_string_or_integer_is_an_invalid_request(rid: Any) -> None:
    """``-32600`` with id null: MCP ids are strings or integers."""
    doc = {"jsonrpc": "2.0", "id": rid, "method": "tools/list"}
    answer = _envelope.read_message(json.dumps(doc))
    assert isinstance(answer, types.JSONRPCError)
    assert (answer.id, answer.error.code) == (None, types.INVALID_REQUEST)
    assert answer.error.message == "Invalid Request: id must be a string or an integer"


@pytest.mark.parametrize("request_id", [{"x": 1}, [1], True, 1.0, None])
def test_a_cancel_naming_no_request_id_changes_nothing(request_id: Any) -> None:
    """``notifications/cancelled`` whose ``requestId`` is not a string or an integer (an
    object or a list, which crashed the stdio server; ``true``, which cancelled request
    ``1``) leaves the requests read waiting for their answers."""
    waiting = _stdio._Unanswered()
    waiting.read(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list"))
    cancel = types.JSONRPCNotification(
        jsonrpc="2.0", method="notifications/cancelled", params={"requestId": request_id}
    )
    waiting.read(cancel)
    assert dict(waiting._ids) == {1: 1}
    waiting.read(
        types.JSONRPCNotification(
            jsonrpc="2.0", method="notifications/cancelled", params={"requestId": 1}
        )
    )
    assert not waiting._ids


def test_an_object_without_method_result_or_error_says_so() -> None:
    """``{"jsonrpc": "2.0", "id": 13}`` is ``-32600`` saying what a message needs, not the
    validation errors of four internal message types."""
    answer = _envelope.read_message('{"jsonrpc": "2.0", "id": 13}')
    assert isinstance(answer, types.JSONRPCError)
    assert answer.error.code == types.INVALID_REQUEST
    assert "needs a method" in answer.error.message
    assert "JSONRPCRequest" not in answer.error.message
