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
    message = _envelope.read_bytes(line)
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


@pytest.mark.parametrize("request_id", ["1", "01", 1])
def test_a_cancel_names_a_request_as_the_mcp_package_matches_it(request_id: Any) -> None:
    """``notifications/cancelled`` with ``requestId`` ``"1"`` cancels request ``1`` in
    the ``mcp`` package, so request ``1`` is no longer waited for (it would be, for the
    whole grace period, with its answer lost)."""
    waiting = _stdio._Unanswered()
    waiting.read(types.JSONRPCRequest(jsonrpc="2.0", id=1, method="tools/list"))
    waiting.read(
        types.JSONRPCNotification(
            jsonrpc="2.0", method="notifications/cancelled", params={"requestId": request_id}
        )
    )
    assert not waiting._ids


def test_a_clients_error_response_is_a_message_not_a_refusal() -> None:
    """A JSON-RPC error response the client sent is served as a message (a response), not
    taken for the server's refusal to be written back."""
    text = '{"jsonrpc": "2.0", "id": 5, "error": {"code": 1, "message": "x"}}'
    answer = _envelope.read_message(text)
    assert isinstance(answer, types.JSONRPCError)
    assert not isinstance(answer, _envelope.Refusal)


@pytest.mark.parametrize(
    "text",
    [
        '{"jsonrpc": "2.0", "id": "\\ud800", "method": "ping"}',
        '{"jsonrpc": "2.0", "id": 1, "method": "x\\udfff"}',
        '{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"a": "\ud800"}}',
    ],
)
def test_a_lone_surrogate_is_a_parse_error(text: str) -> None:
    """A string holding a lone surrogate, escaped or as is, is not Unicode text:
    ``-32700`` with id null naming the byte where that string starts."""
    answer = _envelope.read_message(text)
    assert isinstance(answer, _envelope.Refusal)
    assert (answer.id, answer.error.code) == (None, types.PARSE_ERROR)
    assert answer.error.message.endswith("(a lone surrogate is not Unicode text)")
    assert "at byte " in answer.error.message


def test_a_surrogate_pair_and_an_escaped_backslash_are_text() -> None:
    """``"\\ud83d\\ude00"`` (a pair: U+1F600) and ``"\\\\ud800"`` (a backslash, then
    ``ud800``) are Unicode text and served."""
    for value in ['"\\ud83d\\ude00"', '"\\\\ud800"']:
        text = '{"jsonrpc": "2.0", "id": ' + value + ', "method": "ping"}'
        answer = _envelope.read_message(text)
        assert isinstance(answer, types.JSONRPCRequest), answer


def test_an_object_without_method_result_or_error_says_so() -> None:
    """``{"jsonrpc": "2.0", "id": 13}`` is ``-32600`` saying what a message needs, not the
    validation errors of four internal message types."""
    answer = _envelope.read_message('{"jsonrpc": "2.0", "id": 13}')
    assert isinstance(answer, types.JSONRPCError)
    assert answer.error.code == types.INVALID_REQUEST
    assert "needs a method" in answer.error.message
    assert "JSONRPCRequest" not in answer.error.message


BAD_NOTIFICATIONS: list[str] = [
    '{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 5}',
    '{"jsonrpc": "2.0", "method": "notifications/initialized", "params": [1]}',
    '{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"a": 1, "a": 2}}',
]


@pytest.mark.parametrize("text", BAD_NOTIFICATIONS)
def test_a_refused_notification_is_dropped_not_answered(
    text: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A notification (a method, no id) with bad params or a key twice gets no JSON-RPC
    error (JSON-RPC 2.0 answers no notification; an error with id null would reach a
    client that waits for nothing): it is dropped and logged with its method."""
    with caplog.at_level("WARNING", logger="prefect_baton.mcp"):
        answer = _envelope.read_message(text)
    assert isinstance(answer, _envelope.Dropped)
    assert answer.method == json.loads(text)["method"]
    assert answer.method in caplog.text


@pytest.mark.parametrize(
    "text",
    ['{"jsonrpc": "2.0", "method": 5}', '{"jsonrpc": "1.0", "method": "x"}', '{"method": "x"}'],
)
def test_an_object_that_is_not_a_notification_still_gets_its_error(text: str) -> None:
    """An object with no id whose method is not a string, or whose ``jsonrpc`` is not
    ``"2.0"``, is not a valid notification: ``-32600`` with id null, as JSON-RPC 2.0 shows."""
    answer = _envelope.read_message(text)
    assert isinstance(answer, types.JSONRPCError)
    assert (answer.id, answer.error.code) == (None, types.INVALID_REQUEST)


@pytest.mark.parametrize(
    ("text", "literal"),
    [
        ('{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"v": NaN}}', "NaN"),
        ('{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"v": Infinity}}', "Infinity"),
        ('{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"v": -Infinity}}', "-Infinity"),
        ('{"jsonrpc": "2.0", "method": "NaN", "params": {"é NaN": [NaN]}}', "NaN"),
    ],
)
def test_nan_and_infinity_are_not_json(text: str, literal: str) -> None:
    """``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (RFC 8259), though Python's
    ``json`` reads them: ``-32700`` with id null naming the literal and its byte offset
    (not the same word inside a string)."""
    answer = _envelope.read_message(text)
    assert isinstance(answer, types.JSONRPCError)
    assert (answer.id, answer.error.code) == (None, types.PARSE_ERROR)
    at = text.encode().rindex(literal.encode())
    assert answer.error.message == (
        f"Parse error: invalid JSON at byte {at} ({literal} is not a JSON value)"
    )
