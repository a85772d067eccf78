"""Child process for tests/test_threadstore.py: drives a JSONLStore from another process.

Usage::

    threadstore_child.py cycles DIR WITNESS WORKER N COMPACT_AFTER KEY...  # N lease+commit cycles
    threadstore_child.py finalize-loop DIR KEY                # finalize forever, print each ack
    threadstore_child.py op DIR CLOCK_OFFSET JSON             # one operation, print its outcome
    threadstore_child.py hold DIR TARGET OWNER                # take a lease, print it, sleep
"""

from __future__ import annotations

import json
import random
import sys
import time
from datetime import UTC, datetime
from typing import Any

from adaptor._durable import DurableLog
from adaptor.driver import SessionState
from adaptor.threadstore import (
    AlreadyExistsError,
    BusyError,
    FinalizeRequest,
    JSONLStore,
    Lease,
    LeaseLostError,
    Query,
    Record,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def record(record_id: str, key: str, **data: str) -> Record:
    return Record(
        id=record_id,
        key=key,
        status="active",
        driver_type="script",
        agent="agent-1",
        fingerprint="fp",
        compatibility_fingerprint="cfp",
        session_codec="script/v1",
        state=SessionState(resume_id=f"resume-{record_id}", data=data),
        created_at=T0,
        updated_at=T0,
    )


def cycles(
    directory: str, witness_path: str, worker: str, n: int, compact_after: int, keys: list[str]
) -> None:
    store = JSONLStore(directory)
    # Compacting often makes every process keep up with snapshots replaced under it.
    store._compact_after = compact_after
    witness = DurableLog(witness_path, sync=False)
    done = busy = attempt = 0
    while done < n:
        key = keys[attempt % len(keys)]
        owner = f"{worker}/{attempt}"
        attempt += 1
        try:
            lease = store.acquire_lease(f"key:{key}", owner, 600)
        except BusyError:
            busy += 1
            # Back off as a real client does on ErrThreadBusy: flock waiters poll, so workers
            # retrying flat out could keep the lease holder from ever getting the store lock.
            time.sleep(random.uniform(0.001, 0.005))
            continue
        witness.append({"event": "enter", "key": key, "owner": owner})
        current = store.resolve(Query(key=key))
        count = 0 if current is None or current.state is None else int(current.state.data["n"])
        store.finalize(
            FinalizeRequest(
                record=record(f"rec:{key}", key, n=str(count + 1), by=owner),
                previous_id=None if current is None else current.id,
                key=key,
                held_leases=(lease,),
                rebind_active=True,
            )
        )
        # Logged after finalize returned: every "commit" line is an acknowledged finalize.
        witness.append({"event": "commit", "key": key, "owner": owner, "n": count + 1})
        witness.append({"event": "exit", "key": key, "owner": owner})
        store.release_lease(lease)
        done += 1
    print(json.dumps({"worker": worker, "cycles": done, "busy": busy}), flush=True)


def finalize_loop(directory: str, key: str) -> None:
    store = JSONLStore(directory)
    # Small interval: kills land in and around compactions too.
    store._compact_after = 16
    # Same owner every run: re-acquiring our own live lease returns its token.
    lease = store.acquire_lease(f"key:{key}", "looper", 3600)
    current = store.resolve(Query(key=key))
    i = 0 if current is None else int(current.id.removeprefix("r"))
    while True:
        store.finalize(
            FinalizeRequest(
                record=record(f"r{i + 1}", key, n=str(i + 1)),
                previous_id=None if i == 0 else f"r{i}",
                key=key,
                held_leases=(lease,),
                archive_old=True,
                rebind_active=True,
            )
        )
        i += 1
        print(i, flush=True)


def op(directory: str, clock: str, spec: dict[str, Any]) -> None:
    """One store call; ``clock``: ``"real"`` (the store's own clocks) or a number of seconds
    added to the wall clock it is given instead."""
    if clock == "real":
        store = JSONLStore(directory)
    else:
        offset = float(clock)
        store = JSONLStore(directory, clock=lambda: time.time() + offset)
    leases = tuple(Lease(**held) for held in spec.get("held", ()))
    result: dict[str, Any]
    try:
        if spec["op"] == "now":
            result = {"ok": True, "time": time.time()}
        elif spec["op"] == "acquire":
            lease = store.acquire_lease(spec["target"], spec["owner"], spec["ttl"])
            result = {"ok": True, "token": lease.token}
        elif spec["op"] == "renew":
            store.renew_lease(leases[0], spec["ttl"])
            result = {"ok": True}
        elif spec["op"] == "finalize":
            store.finalize(
                FinalizeRequest(
                    record=record(spec["id"], spec["key"]),
                    key=spec["key"],
                    held_leases=leases,
                    rebind_active=True,
                    require_key_absent=spec.get("require_key_absent", False),
                )
            )
            result = {"ok": True}
        else:
            raise SystemExit(f"unknown op {spec['op']!r}")
    except (BusyError, LeaseLostError, AlreadyExistsError) as exc:
        result = {"ok": False, "error": type(exc).__name__, "fields": exc.fields()}
    print(json.dumps(result), flush=True)


def hold(directory: str, target: str, owner: str) -> None:
    lease = JSONLStore(directory).acquire_lease(target, owner, 3600)
    print(
        json.dumps({"target": lease.target, "owner": lease.owner, "token": lease.token}), flush=True
    )
    time.sleep(3600)  # until killed


def hold_across(directory: str, target: str, key: str) -> None:
    """Take a lease, say so, wait for a line on stdin (the wall clock is stepped meanwhile),
    then renew it, save under it and release it, saying how that went."""
    store = JSONLStore(directory)
    lease = store.acquire_lease(target, "holder", 300)
    print(json.dumps({"time": time.time()}), flush=True)
    sys.stdin.readline()
    try:
        store.renew_lease(lease, 300)
        store.finalize(FinalizeRequest(record=record("r1", key), key=key, held_leases=(lease,), rebind_active=True))
        result: dict[str, Any] = {"ok": True, "time": time.time()}
    except LeaseLostError as exc:
        result = {"ok": False, "error": type(exc).__name__}
    store.release_lease(lease)
    print(json.dumps(result), flush=True)


def main(argv: list[str]) -> None:
    mode, directory, *rest = argv
    if mode == "cycles":
        witness, worker, n, compact_after, *keys = rest
        cycles(directory, witness, worker, int(n), int(compact_after), keys)
    elif mode == "finalize-loop":
        finalize_loop(directory, rest[0])
    elif mode == "hold-across":
        hold_across(directory, rest[0], rest[1])
    elif mode == "op":
        op(directory, rest[0], json.loads(rest[1]))
    elif mode == "hold":
        hold(directory, rest[0], rest[1])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
