"""Lease reads of the ledger store: :meth:`~LeaseReads.inspect`, :meth:`~LeaseReads.get`,
:meth:`~LeaseReads.list_leases` and the audit's :meth:`~LeaseReads.lease_history`, which
read lease rows in a read transaction and write nothing.

The first three answer as the org's lease authority, so while Redis decides the org's
leases they are refused (``FORBIDDEN``) like every lease decision the ledger would take
(``StoreBase._refuse_unless_ledger_decides``): the ledger's copy lags Redis (the reconciler
drains the journal into it), and would call a resource Redis just granted free. The Redis
authority reads the ledger's history itself, after syncing it, with
:meth:`~LeaseReads.ledger_get` and :meth:`~LeaseReads.ledger_list_leases`. The audit's
:meth:`~LeaseReads.lease_history` stays open: it checks the ledger's own records (what was
drained into them), and says nothing about who holds a resource now."""

from __future__ import annotations

from sqlalchemy import select
from sqlmodel import Session, col

from prefect_baton._rules.access import check_list_owner, may_read
from prefect_baton._rules.core import Generation
from prefect_baton._rules.paging import store_limit
from prefect_baton._stores.ledger.base import StoreBase
from prefect_baton._stores.ledger.conditions import lease_effective
from prefect_baton._stores.ledger.convert import generation_to_lease, lease_info, row_to_generation
from prefect_baton._stores.ledger.paging import after_key
from prefect_baton._stores.ledger.tables import GenerationRow, LeaseTransition
from prefect_baton._stores.protocol import Caller
from prefect_baton._stores.queries import LeaseQuery
from prefect_baton.errors import NotFoundError
from prefect_baton.models import Lease, LeaseInfo


class LeaseReads(StoreBase):
    """The lease reads of :class:`~prefect_baton._stores.ledger.leases.LeaseOps` (and
    :meth:`_row_by_id`, the lease row by id its writes read too)."""

    def _row_by_id(self, session: Session, org: str, lease_id: str) -> GenerationRow | None:
        row = session.get(GenerationRow, lease_id)
        if row is None or row.org_id != org:
            return None
        return row

    def inspect(self, caller: Caller, resource_type: str, resource_id: str) -> LeaseInfo:
        """What any principal of the org may see about a resource (holder details only for
        the holder itself).

        Raises:
            ForbiddenError: Redis decides the org's leases.
        """
        with self._read() as (s, now):
            self._refuse_unless_ledger_decides(s, caller.org)
            row = s.execute(
                select(GenerationRow)
                .where(
                    col(GenerationRow.org_id) == caller.org,
                    col(GenerationRow.resource_type) == resource_type,
                    col(GenerationRow.resource_id) == resource_id,
                )
                .order_by(col(GenerationRow.epoch).desc())
                .limit(1)
            ).scalar_one_or_none()
            head = row_to_generation(row) if row is not None else None
            return lease_info(caller, resource_type, resource_id, head, now)

    def get(self, caller: Caller, lease_id: str) -> Lease:
        """The lease generation ``lease_id`` as its owner sees it.

        Raises:
            NotFoundError: unknown, another org's, or another principal's lease (unless the
                caller is ``owner``/``admin``). ForbiddenError: Redis decides the org's leases.
        """
        return self._get(caller, lease_id, authority=True)

    def ledger_get(self, caller: Caller, lease_id: str) -> Lease:
        """As :meth:`get`, from the ledger's copy whoever decides the org's leases: for the
        Redis authority, which syncs the ledger first.

        Raises:
            NotFoundError: as :meth:`get`.
        """
        return self._get(caller, lease_id, authority=False)

    def _get(self, caller: Caller, lease_id: str, *, authority: bool) -> Lease:
        with self._read() as (s, _now):
            if authority:
                self._refuse_unless_ledger_decides(s, caller.org)
            row = self._row_by_id(s, caller.org, lease_id)
            if row is None or not may_read(caller.role, caller.principal, (row.owner,)):
                raise NotFoundError(f"lease {lease_id} not found")
            return generation_to_lease(row_to_generation(row))

    def list_leases(self, caller: Caller, query: LeaseQuery) -> list[Lease]:
        """Leases of the org: the caller's own by default; ``owner``/``admin`` roles may list
        anyone's (``owner="*"`` for all). Effective ones only unless ``include_ended``.
        Newest first; ``query.after``: the page continues after this ``(acquired_at ms,
        lease_id)``.

        Raises:
            ForbiddenError: another principal's leases asked by an ``agent``; Redis decides
                the org's leases.
        """
        return self._list_leases(caller, query, authority=True)

    def ledger_list_leases(self, caller: Caller, query: LeaseQuery) -> list[Lease]:
        """As :meth:`list_leases`, from the ledger's copy whoever decides the org's leases:
        for the Redis authority, which syncs the ledger first.

        Raises:
            ForbiddenError: another principal's leases asked by an ``agent``.
        """
        return self._list_leases(caller, query, authority=False)

    def _list_leases(self, caller: Caller, query: LeaseQuery, *, authority: bool) -> list[Lease]:
        who = caller.principal if query.owner is None else query.owner
        check_list_owner(caller.role, caller.principal, who)
        with self._read() as (s, now):
            if authority:
                self._refuse_unless_ledger_decides(s, caller.org)
            q = select(GenerationRow).where(col(GenerationRow.org_id) == caller.org)
            if who != "*":
                q = q.where(col(GenerationRow.owner) == who)
            if query.resource_type is not None:
                q = q.where(col(GenerationRow.resource_type) == query.resource_type)
            if not query.include_ended:
                q = q.where(lease_effective(now))
            at, lid = col(GenerationRow.acquired_at_ms), col(GenerationRow.lease_id)
            if query.after is not None:
                q = q.where(after_key(at, lid, query.after, descending=True))
            q = q.order_by(at.desc(), lid.desc()).limit(store_limit("leases", query.limit))
            return [generation_to_lease(row_to_generation(r)) for r in s.execute(q).scalars()]

    def lease_history(self, org: str) -> tuple[list[Generation], list[LeaseTransition]]:
        """Every lease generation and transition of ``org`` (for the audit)."""
        with self._read() as (s, _now):
            rows = [
                row_to_generation(r)
                for r in s.execute(
                    select(GenerationRow)
                    .where(col(GenerationRow.org_id) == org)
                    .order_by(
                        GenerationRow.resource_type,
                        col(GenerationRow.resource_id),
                        col(GenerationRow.epoch),
                    )
                ).scalars()
            ]
            transitions = list(
                s.execute(
                    select(LeaseTransition)
                    .where(col(LeaseTransition.org_id) == org)
                    .order_by(col(LeaseTransition.seq))
                ).scalars()
            )
            return rows, transitions
