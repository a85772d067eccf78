"""The store state machine shared by :mod:`adaptor.memory` and the JSONL store.

Every mutation is *planned* against the current state first: planning validates, raises the
contract errors and changes nothing.  A successful plan yields one *event*, a JSON object that
performs the whole mutation when applied.  The memory store applies it at once; the JSONL store
appends it to its log as one framed line and applies what it reads back, so replaying the log
reaches exactly the state the writer had, and one finalize can never be half-applied.

Events::

    {"kind": "lease", "target": T, "lease": {...} | null}      # grant, extend, renew, release
    {"kind": "finalize", "records": [R, ...], "bind": {"key": K, "id": I} | null}

A lease is ``{"owner", "token", "generation", "expires", "expires_at", "boot_id"}`` and, from
the JSONL store, ``"holder"``: ``expires`` is wall-clock seconds (``expires_at`` the same instant
for humans) and ``boot_id`` the boot it was granted in, so a lease never outlives a reboot even
if the clock says it should; ``holder`` names the process that took or last renewed it, so it
does not outlive that process either (see :mod:`adaptor.threadstore._holder`).

``"steady_scope"`` and ``"steady_expires"``, when the store keeps time by the real clocks: the
same expiry on the monotonic clock, which every process of one boot and time namespace (the
scope) shares and which no clock step moves.  A reader of the same scope judges expiry by it:
a wall clock stepped forward (NTP correcting a skewed clock, a VM resumed) made every live
lease look expired, its holder's turn was thrown away and another process took the thread
beside it; one stepped back kept a dead lease for as long.  Other readers use ``expires``.
Generations come from one counter per store, not per target, so expired leases can be dropped
from snapshots without ever handing out a generation again.

Reservations.  A store may write lease events without syncing them (see the JSONL store); a
power cut can then lose grants that were handed out.  So that the counter never goes back, a
grant whose generation is beyond ``reserved`` carries ``"reserve": R`` (a block of
:data:`RESERVE_BLOCK` generations up to ``R``) and must be made durable before it is
acknowledged; and the first grant under a boot id other than the last grant's starts past
every reserved generation, which covers any unsynced grant that a reboot may have lost.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from adaptor.threadstore import AlreadyExistsError, BusyError, LeaseLostError, _holder
from adaptor.threadstore._types import (
    FinalizeRequest,
    Lease,
    Query,
    check_record_json,
    format_time,
    record_to_json,
    time_of,
)

Event = dict[str, Any]

# Generations reserved by one synced grant: unsynced grants need a sync once per this many.
RESERVE_BLOCK = 1024


Steady = tuple[str, float]
"""``(scope, monotonic now)``: see the module's docstring; ``None`` where a store has no such clock."""


def steady_clock(wall: Callable[[], float], scope: Callable[[], str | None]) -> Callable[[], Steady | None]:
    """What a store whose wall clock is ``wall`` reads as its steady clock: the monotonic clock,
    shared in ``scope`` (``None``: by nobody it could name), unless the store was given a wall
    clock of its own (a test's, a process told its time is another), which then decides alone."""
    if wall is not time.time:
        return lambda: None

    def now() -> Steady | None:
        shared_in = scope()
        return None if shared_in is None else (shared_in, time.monotonic())

    return now


def _is_live(lease: Mapping[str, Any], now: float, boot_id: str, steady: Steady | None) -> bool:
    if lease["boot_id"] != boot_id:
        return False
    if steady is not None and lease.get("steady_scope") == steady[0]:
        unexpired = steady[1] < lease["steady_expires"]
    else:
        unexpired = now < lease["expires"]
    return unexpired and not _holder.gone(lease.get("holder"))


def _holds(current: Mapping[str, Any] | None, lease: Lease) -> bool:
    return (
        current is not None and current["owner"] == lease.owner and current["token"] == lease.token
    )


def _lease_json(
    owner: str,
    token: str,
    generation: int,
    expires: float,
    boot_id: str,
    holder: Mapping[str, Any] | None,
    steady_expiry: dict[str, Any],
) -> Event:
    lease: Event = {
        "owner": owner,
        "token": token,
        "generation": generation,
        "expires": expires,
        "expires_at": format_time(time_of(expires)),
        "boot_id": boot_id,
        **steady_expiry,
    }
    if holder is not None:
        lease["holder"] = dict(holder)
    return lease


def _steady_expiry(steady: Steady | None, ttl: float) -> dict[str, Any]:
    return {} if steady is None else {"steady_scope": steady[0], "steady_expires": steady[1] + ttl}


class State:
    """Records by id, the key index and leases by target, all in their JSON form."""

    __slots__ = ("grant_boot", "keys", "leases", "next_generation", "records", "reserved")

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, str] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.next_generation = 1
        self.reserved = 0  # generations up to this one have been durably reserved
        self.grant_boot: str | None = None  # boot id of the last grant applied

    def __len__(self) -> int:
        return len(self.records) + len(self.keys) + len(self.leases)

    # --- reads ----------------------------------------------------------------------------------

    def lookup(self, query: Query) -> dict[str, Any] | None:
        if query.id is not None:
            record = self.records.get(query.id)
        else:
            record_id = self.keys.get(query.key or "")
            record = None if record_id is None else self.records.get(record_id)
        if record is None or (record["status"] != "active" and not query.include_archived):
            return None
        return record

    def _active_id(self, key: str) -> str | None:
        record_id = self.keys.get(key)
        if record_id is None:
            return None
        record = self.records.get(record_id)
        return record_id if record is not None and record["status"] == "active" else None

    # --- plans ----------------------------------------------------------------------------------

    def plan_acquire(
        self,
        target: str,
        owner: str,
        ttl: float,
        now: float,
        boot_id: str,
        holder: Mapping[str, Any] | None = None,
        steady: Steady | None = None,
    ) -> tuple[Lease, Event]:
        current = self.leases.get(target)
        if current is not None and _is_live(current, now, boot_id, steady):
            if current["owner"] != owner:
                raise BusyError(target)
            # Re-acquiring your own live lease extends it under the same token, so leases the
            # caller already handed to a finalize stay valid.
            token, generation = current["token"], current["generation"]
        else:
            generation = self.next_generation
            if boot_id != self.grant_boot:
                # Unsynced grants made under another boot may have been lost with it.
                generation = max(generation, self.reserved + 1)
            token = f"{generation}-{secrets.token_hex(8)}"
        lease = _lease_json(owner, token, generation, now + ttl, boot_id, holder, _steady_expiry(steady, ttl))
        event: Event = {"kind": "lease", "target": target, "lease": lease}
        if generation > self.reserved:
            event["reserve"] = generation + RESERVE_BLOCK - 1
        return Lease(target, owner, token), event

    def plan_renew(
        self,
        lease: Lease,
        ttl: float,
        now: float,
        boot_id: str,
        holder: Mapping[str, Any] | None = None,
        steady: Steady | None = None,
    ) -> Event:
        current = self.leases.get(lease.target)
        if current is None or not _holds(current, lease) or not _is_live(current, now, boot_id, steady):
            raise LeaseLostError(lease.target)
        renewed = {
            **{name: value for name, value in current.items() if not name.startswith("steady_")},
            "expires": now + ttl,
            "expires_at": format_time(time_of(now + ttl)),
            **_steady_expiry(steady, ttl),
        }
        if holder is not None:  # whoever renews is alive (a forked child, say)
            renewed["holder"] = dict(holder)
        return {"kind": "lease", "target": lease.target, "lease": renewed}

    def plan_release(self, lease: Lease) -> Event | None:
        """``None`` when there is nothing to do: a stale or foreign release must not write."""
        if not _holds(self.leases.get(lease.target), lease):
            return None
        return {"kind": "lease", "target": lease.target, "lease": None}

    def plan_finalize(
        self, request: FinalizeRequest, now: float, boot_id: str, steady: Steady | None = None
    ) -> Event:
        for held in request.held_leases:
            current = self.leases.get(held.target)
            if current is None or not _holds(current, held) or not _is_live(current, now, boot_id, steady):
                raise LeaseLostError(held.target)
        if request.require_key_absent and self._active_id(request.key) is not None:
            raise AlreadyExistsError(request.key)
        records = [record_to_json(request.record)]
        if request.archive_old and request.previous_id is not None:
            previous = self.records.get(request.previous_id)
            if previous is not None:
                archived_at = format_time(time_of(now))
                records.append({**previous, "status": "archived", "updated_at": archived_at})
        bind = {"key": request.key, "id": request.record.id} if request.rebind_active else None
        return {"kind": "finalize", "records": records, "bind": bind}

    # --- apply ----------------------------------------------------------------------------------

    def apply(self, event: Mapping[str, Any], *, owned: bool = False) -> None:
        """Apply an event made by a plan (or read back and checked by :func:`check_event`).

        ``owned``: nobody else holds the event's objects (it was just parsed), so the state
        keeps them instead of copies.
        """
        if event["kind"] == "lease":
            lease = event["lease"]
            if lease is None:
                self.leases.pop(event["target"], None)
            else:
                self.leases[event["target"]] = lease if owned else dict(lease)
                self.next_generation = max(self.next_generation, lease["generation"] + 1)
                self.grant_boot = lease["boot_id"]
            reserve = event.get("reserve")
            if reserve is not None:
                self.reserved = max(self.reserved, reserve)
        else:
            for record in event["records"]:
                self.records[record["id"]] = record if owned else dict(record)
            bind = event["bind"]
            if bind is not None:
                self.keys[bind["key"]] = bind["id"]

    # --- snapshots ------------------------------------------------------------------------------

    def snapshot(self, now: float, boot_id: str, steady: Steady | None = None) -> dict[str, Any]:
        """The state as one JSON object; dead leases are dropped (the counter remembers)."""
        return {
            "next_generation": self.next_generation,
            "reserved_generation": self.reserved,
            "grant_boot": self.grant_boot,
            "records": self.records,
            "keys": self.keys,
            "leases": self.live_leases(now, boot_id, steady),
        }

    def live_leases(self, now: float, boot_id: str, steady: Steady | None = None) -> dict[str, dict[str, Any]]:
        """The leases still in force; the others act as absent in every plan."""
        return {t: le for t, le in self.leases.items() if _is_live(le, now, boot_id, steady)}

    @classmethod
    def from_snapshot(
        cls, obj: Mapping[str, Any], known: Mapping[str, Mapping[str, Any]] | None = None
    ) -> State:
        """Rebuild from :meth:`snapshot` output; ``ValueError`` if it is not well formed.

        ``known``: records already validated (the state this one replaces); a record equal to
        its entry there is not validated again, which keeps reloading a large store cheap.
        """
        known = known or {}
        state = cls()
        generation = obj.get("next_generation")
        if type(generation) is not int or generation < 1:
            raise ValueError("bad next_generation")
        state.next_generation = generation
        # Both absent from snapshots written before reservations existed.
        reserved, grant_boot = obj.get("reserved_generation", 0), obj.get("grant_boot")
        if type(reserved) is not int or reserved < 0:
            raise ValueError("bad reserved_generation")
        if grant_boot is not None and not isinstance(grant_boot, str):
            raise ValueError("bad grant_boot")
        state.reserved, state.grant_boot = reserved, grant_boot
        records, keys, leases = obj.get("records"), obj.get("keys"), obj.get("leases")
        if not (isinstance(records, dict) and isinstance(keys, dict) and isinstance(leases, dict)):
            raise ValueError("records, keys and leases must be objects")
        for record_id, record in records.items():
            if known.get(record_id) == record and isinstance(record, dict):
                pass  # validated before, filed under the same id
            else:
                check_record_json(record)
                if record["id"] != record_id:
                    raise ValueError(f"record filed under the wrong id {record_id!r}")
            state.records[record_id] = record
        for key, record_id in keys.items():
            if not isinstance(record_id, str):
                raise ValueError(f"key {key!r} maps to a non-string id")
            state.keys[key] = record_id
        for target, lease in leases.items():
            _check_lease_json(lease)
            if lease["generation"] >= generation:
                raise ValueError(f"lease on {target!r} is newer than next_generation")
            state.leases[target] = lease
        return state


def _check_lease_json(lease: object) -> None:
    if not isinstance(lease, dict):
        raise ValueError("lease is not an object")
    for name in ("owner", "token", "boot_id"):
        if not isinstance(lease.get(name), str):
            raise ValueError(f"lease field {name!r} is not a string")
    generation, expires = lease.get("generation"), lease.get("expires")
    if type(generation) is not int or generation < 1:
        raise ValueError("lease generation is not a positive integer")
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise ValueError("lease expiry is not a number")
    if "holder" in lease:
        _holder.check_json(lease["holder"])
    if "steady_scope" in lease or "steady_expires" in lease:
        steady_expires = lease.get("steady_expires")
        if not isinstance(lease.get("steady_scope"), str):
            raise ValueError("lease field 'steady_scope' is not a string")
        if isinstance(steady_expires, bool) or not isinstance(steady_expires, int | float):
            raise ValueError("lease steady expiry is not a number")


def check_event(event: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` unless ``event`` (read back from disk) has the shape a plan makes.

    The CRC already rules out torn or flipped bytes; this rules out a line written by something
    else, so :meth:`State.apply` and later resolves cannot fail half-way.
    """
    kind = event.get("kind")
    if kind == "lease":
        if not isinstance(event.get("target"), str):
            raise ValueError("lease event without a target")
        if event.get("lease") is not None:
            _check_lease_json(event["lease"])
        reserve = event.get("reserve")
        if reserve is not None and (type(reserve) is not int or reserve < 1):
            raise ValueError("bad reserve in lease event")
        if not isinstance(event.get("boot", ""), str):
            raise ValueError("bad boot in lease event")
        synced = event.get("synced", 0)
        if type(synced) is not int or synced < 0:
            raise ValueError("bad synced in lease event")
    elif kind == "finalize":
        records, bind = event.get("records"), event.get("bind")
        if not isinstance(records, list) or not records:
            raise ValueError("finalize event without records")
        for record in records:
            check_record_json(record)
        if bind is not None and not (
            isinstance(bind, dict)
            and isinstance(bind.get("key"), str)
            and isinstance(bind.get("id"), str)
        ):
            raise ValueError("bad bind in finalize event")
    else:
        raise ValueError(f"unknown event kind {kind!r}")
