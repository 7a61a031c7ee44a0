"""Checkpoint state must be a JSON object as written, not one JSON would rewrite."""

from __future__ import annotations

import pytest

from prefect_baton._rules.core import validate_scopes, validate_state
from prefect_baton.errors import ValidationError


@pytest.mark.parametrize("state", [{1: "a"}, {"a": [{2: 3}]}, {"a": {(1, 2): 1}}])
def test_non_string_keys_are_rejected(state: dict[object, object]) -> None:
    """Integer or tuple keys are refused instead of being coerced to strings."""
    with pytest.raises(ValidationError):
        validate_state(state)


def test_del_character_in_scope_is_rejected() -> None:
    """A scope with the DEL control character is refused like other control characters."""
    with pytest.raises(ValidationError):
        validate_scopes(["src/\x7f"])
