"""The options of ``@leased`` and ``lease(...)``: validated when the decorator is applied
(or the block is made), and templates."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

from prefect_baton._rules.core import validate_id, validate_principal, validate_text, validate_ttl
from prefect_baton._rules.keeping import keep_times
from prefect_baton.errors import ValidationError
from prefect_baton.prefect._context import BatonLike, check_baton

__all__ = ["LeaseOptions", "OnConflict", "Resource"]

OnConflict = Literal["raise", "skip", "cancel", "wait"]
_ON_CONFLICT = ("raise", "skip", "cancel", "wait")

#: ``(resource_type, resource_id, scopes)`` of one call, templates filled
Resource = tuple[str, str, list[str]]


def _fields(template: str, what: str) -> set[str]:
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValidationError(f"{what} template {template!r} is malformed: {exc}") from None
    roots = set()
    for _text, name, _spec, _conv in parsed:
        if name is None:
            continue
        root = name.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise ValidationError(f"{what} template {template!r}: use parameter names, not {{}}")
        roots.add(root)
    return roots


class _Filler(string.Formatter):
    """``str.format_map`` for the lease templates, refusing a field whose value is ``None``
    (it would lease a resource literally named ``None``)."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        found = super().get_field(field_name, args, kwargs)
        if found[0] is None:
            root = field_name.split(".", 1)[0].split("[", 1)[0]
            of = "" if root == field_name else f" (of parameter {root!r})"
            raise _NoneField(f"{{{field_name}}} is None{of}")
        return found


class _NoneField(Exception):
    """A template field whose value is ``None`` (its message names it)."""


_FILLER = _Filler()


@dataclass(frozen=True)
class LeaseOptions:
    """The options of one ``@leased(...)`` or ``lease(...)`` (see
    :func:`prefect_baton.prefect.leased` for their meaning), validated when made.

    Raises:
        ValidationError: a bad id, TTL (10..86,400 s), ``on_conflict``, ``baton``, renew
            deadline (below the TTL), ``max_hold_seconds`` or option mix.
    """

    resource_type: str
    resource_id: str
    _: KW_ONLY
    ttl_seconds: int
    purpose: str | None = None
    scopes: Iterable[str] = ()
    on_conflict: OnConflict = "raise"
    wait_timeout_seconds: float | None = None
    cancel_on_loss: bool = False
    baton: BatonLike | None = None
    principal: str | None = None
    renew_deadline_seconds: float | None = None
    max_hold_seconds: float | None = None

    def __post_init__(self) -> None:
        validate_id("resource_type", self.resource_type)
        keep_times(
            self.ttl_seconds,
            renew_deadline_seconds=self.renew_deadline_seconds,
            max_hold_seconds=self.max_hold_seconds,
        )
        if not isinstance(self.resource_id, str) or not self.resource_id:
            raise ValidationError("resource_id must be a non-empty string (or template)")
        validate_ttl(self.ttl_seconds)
        validate_text("purpose", self.purpose)
        if isinstance(self.scopes, str | bytes):
            raise ValidationError("scopes must be a list of glob strings, not a single string")
        scopes = tuple(self.scopes)
        if self.on_conflict not in _ON_CONFLICT:
            raise ValidationError(
                f"on_conflict must be one of {_ON_CONFLICT}, got {self.on_conflict!r}"
            )
        wait = self.wait_timeout_seconds
        if wait is not None:
            if self.on_conflict != "wait":
                raise ValidationError("wait_timeout_seconds only applies to on_conflict='wait'")
            if isinstance(wait, bool) or not wait >= 0:
                raise ValidationError("wait_timeout_seconds must be a number of seconds >= 0")
        if self.principal is not None:
            validate_principal("principal", self.principal)
        check_baton(self.baton)
        # normalised in place (frozen: through object.__setattr__)
        object.__setattr__(self, "ttl_seconds", int(self.ttl_seconds))
        object.__setattr__(self, "scopes", scopes)
        object.__setattr__(self, "cancel_on_loss", bool(self.cancel_on_loss))

    def check_function(self, fn: Callable[..., Any]) -> inspect.Signature:
        """Reject templates naming parameters ``fn`` does not have (names the function)."""
        sig = inspect.signature(fn)
        params = sig.parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        name = getattr(fn, "__qualname__", repr(fn))
        templates = [("resource_type", self.resource_type), ("resource_id", self.resource_id)]
        for what, tpl in templates + [("scope", s) for s in self.scopes]:
            missing = sorted(f for f in _fields(tpl, what) if f not in params)
            if missing and not var_kw:
                raise ValidationError(
                    f"@leased on {name}: {what} template {tpl!r} names "
                    f"{', '.join(missing)}, which {name} has no parameter for"
                )
        return sig

    def literal(self) -> Resource:
        """``(resource_type, resource_id, scopes)`` as given (no templates: ``lease()``)."""
        return self.resource_type, self.resource_id, list(self.scopes)

    def check_literal(self, where: str) -> None:
        """Refuse a template-looking resource type where nothing fills templates (``where``
        names the caller, for the message): it would lease a type literally named so.

        Raises:
            ValidationError: ``resource_type`` holds ``{`` or ``}``.
        """
        if "{" in self.resource_type or "}" in self.resource_type:
            raise ValidationError(
                f"{where}: resource_type {self.resource_type!r} holds '{{' or '}}', but "
                "nothing fills templates here: format it yourself (an f-string)"
            )

    def render(self, sig: inspect.Signature, args: Any, kwargs: Any) -> Resource:
        """``(resource_type, resource_id, scopes)`` with templates filled from the call's
        arguments.

        Raises:
            ValidationError: a field cannot be filled, or its value is ``None`` (the message
                names the template and the parameter: ``None`` would lease a resource
                literally named ``None``).
        """
        if not any("{" in t for t in (self.resource_type, self.resource_id, *self.scopes)):
            return self.literal()
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for p in sig.parameters.values():
            if p.kind is p.VAR_KEYWORD:
                values.update(values.pop(p.name, {}))

        def fill(template: str, what: str) -> str:
            try:
                return _FILLER.vformat(template, (), values)
            except _NoneField as exc:
                raise ValidationError(
                    f"cannot fill the {what} template {template!r}: {exc}; pass a value (a "
                    "None would lease a resource named 'None')"
                ) from None

        try:
            return (
                fill(self.resource_type, "resource_type"),
                fill(self.resource_id, "resource_id"),
                [fill(s, "scopes") for s in self.scopes],
            )
        except (KeyError, AttributeError, IndexError) as exc:
            raise ValidationError(f"cannot fill the lease templates: {exc!r}") from None
