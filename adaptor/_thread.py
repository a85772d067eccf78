"""Threads: durable conversations on top of the run pipeline and a thread store.

A Thread handle holds no resources; state lives in the store.  Every thread run:
prelaunch checks (no events) → key lease → plan (resolve, compatibility) → driver entry with the
planned session → on a healthy checkpoint, one atomic finalize → leases released.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from adaptor import errors
from adaptor.driver import (
    Checkpoint,
    Descriptor,
    Response,
    SessionConfigFingerprintError,
    SessionContext,
    SessionState,
    canonical_fingerprint,
)
from adaptor.threadstore import (
    AlreadyExistsError,
    BusyError,
    FinalizeRequest,
    Lease,
    LeaseLostError,
    Query,
    Record,
    Store,
)
from adaptor.threadstore._types import check_text

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from adaptor._options import RunOptions
    from adaptor.agent import Agent
    from adaptor.result import Result
    from adaptor.stream import Stream
    from adaptor.tool import Definition

ThreadMode = Literal["continue_or_start", "continue_only", "fork"]

DEFAULT_LEASE_TTL = 300.0
DEFAULT_LEASE_RENEWAL = 120.0


class Thread:
    """A durable conversation under a host-chosen key.

    Any number of handles for one key are interchangeable.  ``run``/``stream`` take the same
    options as the Agent's.
    """

    def __init__(self, agent: Agent, key: str, mode: ThreadMode, parent_key: str | None = None):
        _check_key(key)
        self._agent = agent
        self._key = key
        self._mode: ThreadMode = mode
        self._parent_key = parent_key
        self._lock = threading.Lock()

    @property
    def key(self) -> str:
        return self._key

    def run(self, prompt: str, **options: Any) -> Result:
        return self.stream(prompt, **options)._result_for_run()

    def stream(self, prompt: str, **options: Any) -> Stream:
        from adaptor._run import RunPipeline

        effective = self._agent._options(options)
        with self._lock:
            spec = ThreadSpec(self._key, self._mode, self._parent_key, on_persisted=self._persisted)
        return RunPipeline(self._agent, prompt, effective, thread=spec).start()

    def fork(self, new_key: str) -> Thread:
        """A thread under ``new_key`` that starts from this thread's checkpoint.

        The parent is resolved at the fork's first run and never changed; ``new_key`` must not
        have an active conversation.  After its first successful run the fork continues like
        ``agent.thread(new_key)``.
        """
        _check_key(new_key)
        return Thread(self._agent, new_key, "fork", parent_key=self._key)

    def checkpoint(self) -> Checkpoint:
        """The active record's checkpoint (diagnostic only)."""
        store = self._agent.thread_store
        if store is None:
            raise errors.ThreadStoreRequiredError()
        record = _translated(lambda: store.resolve(Query(key=self._key)))
        if record is None:
            raise errors.ThreadNotFoundError(f"thread {self._key!r} has no active conversation")
        codec = codec_of(self._agent.driver)
        name = _codec_name(codec)
        if name is not None and record.session_codec != name:
            raise errors.ThreadIncompatibleError(
                f"thread {self._key!r} was stored with session codec {record.session_codec!r}"
            )
        if record.driver_type != self._agent.driver.descriptor().type:
            raise errors.ThreadIncompatibleError(
                f"thread {self._key!r} was stored with driver {record.driver_type!r}"
            )
        if record.state is None:
            raise errors.ThreadCheckpointMissingError(f"thread {self._key!r} has no checkpoint")
        try:
            state = normalized(codec, record.state)
        except ValueError as exc:
            raise errors.ThreadCheckpointMissingError(f"thread {self._key!r}: {exc}") from exc
        return Checkpoint(state=state, valid=True)

    def _persisted(self) -> None:
        with self._lock:
            if self._mode == "fork":
                self._mode = "continue_or_start"
                self._parent_key = None

    def __repr__(self) -> str:
        return f"Thread({self._key!r}, mode={self._mode!r})"


def _check_key(key: object) -> None:
    # Here rather than at the first run: a key the store cannot write (a lone surrogate, as
    # os.fsdecode makes of bytes that are not UTF-8) failed only after RunStarted, with a
    # bare ValueError naming the store's lease "target".
    check_text("thread key", key)


@dataclass
class ThreadSpec:
    key: str
    mode: ThreadMode
    parent_key: str | None = None
    on_persisted: Any = None


@dataclass
class ThreadPlan:
    """What a thread run decided before the driver started."""

    spec: ThreadSpec
    store: Store
    owner: str
    fingerprint: Fingerprints
    codec_name: str
    driver_type: str
    lease_ttl: float = DEFAULT_LEASE_TTL
    codec: Any = None  # the driver's SessionCodec: states go through it (see normalized)
    leases: list[Lease] = field(default_factory=list)
    previous: Record | None = None  # the active record under the key, if any
    resumed: Record | None = None  # the record whose state the driver resumes
    session_mode: str = "continue_or_start"
    # Why a thread with a conversation starts a new one (its stored session is incompatible).
    restarted_because: str | None = None

    @property
    def state(self) -> SessionState | None:
        return None if self.resumed is None else self.resumed.state

    def session_context(self, *, fresh: bool = False) -> SessionContext:
        if fresh:
            return SessionContext(mode="continue_or_start", state=None)
        return SessionContext(mode=self.session_mode, state=self.state)  # type: ignore[arg-type]


def prelaunch(agent: Agent, descriptor: Descriptor) -> tuple[str, str]:
    """Static thread checks (no events, nothing acquired): returns (codec name, config fp)."""
    if agent.thread_store is None:
        raise errors.ThreadStoreRequiredError()
    driver = agent.driver
    if not descriptor.sessions.supports_resume:
        raise errors.ThreadIncompatibleError(
            f"driver {descriptor.type!r} cannot resume sessions, so it cannot run threads"
        )
    codec_name = agent.driver_codec_name()
    if not codec_name:
        raise errors.ThreadIncompatibleError(f"driver {descriptor.type!r} has no session codec")
    fingerprinter = getattr(driver, "session_config_fingerprint", None)
    if not callable(fingerprinter):
        raise errors.ThreadIncompatibleError(
            f"driver {descriptor.type!r} has no session config fingerprint"
        )
    try:
        first, second = fingerprinter(), fingerprinter()
    except SessionConfigFingerprintError as exc:
        raise errors.ThreadIncompatibleError(
            f"the driver configuration cannot be fingerprinted: {exc.why} at {exc.path}", cause=exc
        ) from exc
    except Exception as exc:
        raise errors.ThreadIncompatibleError(
            "the driver's session config fingerprint failed", cause=exc
        ) from exc
    if not isinstance(first, str) or not first.strip() or first != second:
        raise errors.ThreadIncompatibleError("the driver's session config fingerprint is not stable")
    return codec_name, first.strip()


def require_tool_revisions(tools: Sequence[Definition]) -> None:
    """A thread pins its tool catalogue, which needs a revision on every tool (static check)."""
    missing = sorted(t.name for t in tools if not t.revision)
    if missing:
        raise errors.ThreadIncompatibleError(
            "thread runs need a revision on every host-defined tool; missing on "
            + ", ".join(map(repr, missing))
        )


@dataclass(frozen=True)
class Fingerprints:
    """A run's thread fingerprint whole, and as one digest per setting it covers.

    ``whole`` is the record's ``compatibility_fingerprint`` (what must match); ``parts`` goes in
    its ``fingerprint`` so that a mismatch can name the settings that changed.
    """

    whole: str
    parts: str


_PARTS_DOMAIN = "adaptor/thread-parts/v1"
# What a changed part is called in an error or notice, in the order they are named.
_PART_NAMES = {
    "driver": "driver",
    "codec": "session codec",
    "config": "driver configuration",
    "model": "model",
    "workspace": "workspace",
    "instructions": "instructions",
    "append_system_prompt": "appended system prompt",
    "skills": "skills",
    "mcp": "MCP servers",
    "tools": "tools",
}


def fingerprints(
    descriptor: Descriptor,
    codec_name: str,
    config_fingerprint: str,
    options: RunOptions,
    *,
    skills: str = "",
    mcp: str = "",
    tools: str = "",
) -> Fingerprints:
    """What must match for a stored session to be resumed (never secrets, never the schema),
    whole and per setting.

    ``skills``, ``mcp`` and ``tools`` are the fingerprints of the staged skills (content), the
    validated MCP set (env and header names only) and the tool catalogue (with revisions);
    empty when the run has none, which keeps fingerprints of runs without them unchanged.
    """
    workspace = options.workspace
    resolved_workspace = str(Path(workspace).resolve()) if workspace else ""
    payload: dict[str, Any] = {
        "driver": descriptor.type,
        "codec": codec_name,
        "config": config_fingerprint,
        "model": options.model or "",
        "workspace": resolved_workspace,
        "skills": [skills] if skills else [],
        "mcp": [mcp] if mcp else [],
        "instructions": options.instructions or "",
        "append_system_prompt": options.append_system_prompt or "",
    }
    if tools:
        payload["tools"] = tools
    parts = " ".join(
        f"{name}={canonical_fingerprint(_PARTS_DOMAIN, payload[name]).removeprefix('sha256:')[:16]}"
        for name in _PART_NAMES
        if name in payload
    )
    return Fingerprints(
        whole=canonical_fingerprint("adaptor/thread-invocation/v1", payload),
        parts=f"{_PARTS_DOMAIN} {parts}",
    )


def _changed_settings(stored: str, current: str) -> list[str]:
    """The settings whose digests differ; empty when either side has none (older records)."""

    def digests(text: str) -> dict[str, str] | None:
        domain, _, rest = text.partition(" ")
        if domain != _PARTS_DOMAIN:
            return None
        return dict(item.partition("=")[::2] for item in rest.split())

    before, now = digests(stored), digests(current)
    if before is None or now is None:
        return []
    return [shown for name, shown in _PART_NAMES.items() if before.get(name) != now.get(name)]


def plan(
    spec: ThreadSpec,
    store: Store,
    *,
    driver_type: str,
    codec_name: str,
    fingerprint: Fingerprints,
    lease_ttl: float,
    codec: Any = None,
) -> ThreadPlan:
    """Take the leases and decide the session; raises thread errors (pre-entry identities)."""
    result = ThreadPlan(
        spec=spec,
        store=store,
        owner="own_" + secrets.token_hex(8),
        fingerprint=fingerprint,
        codec_name=codec_name,
        driver_type=driver_type,
        lease_ttl=lease_ttl,
        codec=codec,
    )
    unreleased = _release_owed(store)
    try:
        result.leases.append(_acquire(store, _key_target(spec.key), result.owner, lease_ttl, unreleased))
        if spec.mode == "fork":
            assert spec.parent_key is not None
            result.leases.append(
                _acquire(store, _key_target(spec.parent_key), result.owner, lease_ttl, unreleased)
            )
            _plan_fork(result, spec.parent_key)
        else:
            _plan_continue(result)
    except BaseException:
        release(result)
        raise
    return result


def _plan_continue(plan_: ThreadPlan) -> None:
    spec = plan_.spec
    record = _translated(lambda: plan_.store.resolve(Query(key=spec.key)))
    plan_.previous = record
    only = spec.mode == "continue_only"
    plan_.session_mode = "continue_only" if only else "continue_or_start"
    if record is None:
        if only:
            raise errors.ThreadNotFoundError(f"thread {spec.key!r} has no active conversation")
        return
    problem = _incompatibility(plan_, record)
    if problem is not None:
        if only:
            raise errors.ThreadIncompatibleError(f"thread {spec.key!r}: {problem}")
        plan_.restarted_because = problem
        return  # start fresh; the old record is archived only once the new one persists
    if record.state is None:
        raise errors.ThreadCheckpointMissingError(f"thread {spec.key!r} has no checkpoint")
    try:
        state = normalized(plan_.codec, record.state)
    except ValueError as exc:
        raise errors.ThreadIncompatibleError(f"thread {spec.key!r}: {exc}") from exc
    plan_.resumed = dataclasses.replace(record, state=state)


def _plan_fork(plan_: ThreadPlan, parent_key: str) -> None:
    spec = plan_.spec
    store = plan_.store
    parent = _translated(lambda: store.resolve(Query(key=parent_key)))
    if parent is None:
        raise errors.ThreadNotFoundError(f"fork parent {parent_key!r} has no active conversation")
    if parent.state is None:
        raise errors.ThreadCheckpointMissingError(f"fork parent {parent_key!r} has no checkpoint")
    problem = _incompatibility(plan_, parent)
    if problem is not None:
        raise errors.ThreadIncompatibleError(f"fork parent {parent_key!r}: {problem}")
    try:
        state = normalized(plan_.codec, parent.state)
    except ValueError as exc:
        raise errors.ThreadIncompatibleError(f"fork parent {parent_key!r}: {exc}") from exc
    if _translated(lambda: store.resolve(Query(key=spec.key))) is not None:
        raise errors.ThreadAlreadyExistsError(
            f"thread {spec.key!r} already has an active conversation",
            cause=AlreadyExistsError(spec.key),
        )
    plan_.resumed = dataclasses.replace(parent, state=state)
    plan_.session_mode = "fork"


def _incompatibility(plan_: ThreadPlan, record: Record) -> str | None:
    if record.driver_type != plan_.driver_type:
        return f"stored with driver {record.driver_type!r}"
    if record.session_codec != plan_.codec_name:
        return f"stored with session codec {record.session_codec!r}"
    if not record.compatibility_fingerprint or not plan_.fingerprint.whole:
        return "missing fingerprint"
    if record.compatibility_fingerprint != plan_.fingerprint.whole:
        changed = _changed_settings(record.fingerprint, plan_.fingerprint.parts)
        if changed:
            listed = " and ".join([", ".join(changed[:-1]), changed[-1]] if changed[1:] else changed)
            return f"its {listed} changed since the stored session"
        return (
            "driver configuration, model, workspace, instructions, skills, MCP servers or "
            "tools changed"
        )
    return None


def finalize(plan_: ThreadPlan, response: Response, *, fresh: bool) -> None:
    """Persist a healthy checkpoint atomically; raises thread errors (post-entry)."""
    checkpoint = response.checkpoint
    state = None if checkpoint is None else checkpoint.state
    missing = "the run succeeded but did not prove a resumable checkpoint; nothing was persisted"
    if checkpoint is None or not checkpoint.valid or state is None:
        raise errors.ThreadCheckpointMissingError(missing)
    try:
        state = normalized(plan_.codec, state)
    except ValueError as exc:
        raise errors.ThreadCheckpointMissingError(f"{missing} ({exc})") from exc
    spec = plan_.spec
    now = datetime.now(UTC)
    reuse = plan_.resumed is not None and not fresh and plan_.session_mode != "fork"
    previous = plan_.previous
    if reuse:
        assert plan_.resumed is not None
        record_id, created = plan_.resumed.id, plan_.resumed.created_at
    else:
        record_id, created = "ses_" + secrets.token_hex(8), now
    record = Record(
        id=record_id,
        key=spec.key,
        status="active",
        driver_type=plan_.driver_type,
        agent="",
        fingerprint=plan_.fingerprint.parts,
        compatibility_fingerprint=plan_.fingerprint.whole,
        session_codec=plan_.codec_name,
        state=state,
        created_at=created,
        updated_at=now,
    )
    fork = plan_.session_mode == "fork"
    request = FinalizeRequest(
        record=record,
        previous_id=None if fork or previous is None or reuse else previous.id,
        key=spec.key,
        held_leases=tuple(plan_.leases),
        archive_old=not fork and not reuse and previous is not None,
        rebind_active=True,
        require_key_absent=fork,
    )
    _translated(lambda: plan_.store.finalize(request))
    if spec.on_persisted is not None:
        spec.on_persisted()


def renew(plan_: ThreadPlan, ttl: float) -> None:
    for lease in plan_.leases:
        _translated(functools.partial(plan_.store.renew_lease, lease, ttl))


def release(plan_: ThreadPlan) -> None:
    """Release every lease in reverse order; stale leases are ignored by the store.

    A release that fails (a full disk, say) is owed: tried again before this process next
    takes a lease on the store, else the lease expires on its own.
    """
    for lease in reversed(plan_.leases):
        try:
            plan_.store.release_lease(lease)
        except Exception:
            with _owed_lock:
                _owed.append(_Owed(plan_.store, lease, time.monotonic() + plan_.lease_ttl))
    plan_.leases.clear()


@dataclass(frozen=True, eq=False)
class _Owed:
    store: Store
    lease: Lease
    until: float  # time.monotonic() when the lease has expired anyway


# Without a second try, this process's next run on the key (a daemon's next request of the
# conversation) would find it busy for the rest of the lease's TTL, five minutes by default.
_owed: list[_Owed] = []
_owed_lock = threading.Lock()


def _forget_owed_in_child() -> None:
    # The lock may have been held by a thread the fork did not copy; the leases stay the
    # parent's to release.
    global _owed_lock
    _owed_lock = threading.Lock()
    _owed.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_owed_in_child)


def _same_store(owed_on: Store, store: Store) -> bool:
    """Whether a lease taken through ``owed_on`` can be released through ``store``.

    The same object, or another one over the same files: a JSONL store that refuses writes
    after a failed one is replaced by a new instance on its directory, which must pay what
    the old one owes, or the key stays busy for this very process until the lease expires.
    """
    if owed_on is store:
        return True
    place = getattr(owed_on, "directory", None)
    return (
        place is not None
        and type(owed_on) is type(store)
        and place == getattr(store, "directory", None)
    )


def _release_owed(store: Store) -> dict[str, tuple[Exception, float]]:
    """Try again the failed releases of leases on ``store``; those that fail stay owed, and are
    returned by target: why, and in how many seconds the lease expires on its own."""
    if not _owed:  # the usual case, without the lock
        return {}
    now = time.monotonic()
    with _owed_lock:
        _owed[:] = [owed for owed in _owed if now < owed.until]  # expired: nothing to release
        due = [owed for owed in _owed if _same_store(owed.store, store)]
    unreleased: dict[str, tuple[Exception, float]] = {}
    for owed in due:
        try:
            store.release_lease(owed.lease)
        except Exception as exc:
            unreleased[owed.lease.target] = (exc, owed.until - now)
            continue
        with _owed_lock:
            if owed in _owed:
                _owed.remove(owed)
    return unreleased


def _key_target(key: str) -> str:
    return "thread-key:" + key


def _acquire(
    store: Store, target: str, owner: str, ttl: float, unreleased: Mapping[str, tuple[Exception, float]]
) -> Lease:
    try:
        return _translated(lambda: store.acquire_lease(target, owner, ttl))
    except errors.ThreadBusyError as exc:
        if target not in unreleased:
            raise
        # Busy with this process's own lease, which the store refused to let go (a full disk,
        # a file-size limit): "another owner" would send the user looking for one.
        why, expires_in = unreleased[target]
        key = target.removeprefix(_key_target(""))
        raise errors.ThreadBusyError(
            f"thread {key!r} is busy: this process could not release its lease from an earlier turn "
            f"({type(why).__name__}: {why}); it expires within {math.ceil(expires_in)} s",
            cause=exc.cause,
        ) from why


_T = TypeVar("_T")


def _translated(call: Callable[[], _T]) -> _T:
    """Run a store call, translating store identities into Thread errors (store error kept)."""
    try:
        return call()
    except BusyError as exc:
        key = exc.target.removeprefix(_key_target(""))
        message = f"thread {key!r} is busy: another owner holds its lease" if key != exc.target else ""
        raise errors.ThreadBusyError(message, cause=exc) from exc
    except LeaseLostError as exc:
        raise errors.ThreadLeaseLostError(cause=exc) from exc
    except AlreadyExistsError as exc:
        raise errors.ThreadAlreadyExistsError(
            f"thread key {exc.key!r} already has an active conversation", cause=exc
        ) from exc


def codec_of(driver: Any) -> Any:
    """The driver's session codec (its ``session_codec()``), or ``None``."""
    factory = getattr(driver, "session_codec", None)
    return factory() if callable(factory) else None


def codec_name_of(driver: Any) -> str | None:
    return _codec_name(codec_of(driver))


def _codec_name(codec: Any) -> str | None:
    if codec is None:
        return None
    name = codec.name() if callable(getattr(codec, "name", None)) else None
    return name if isinstance(name, str) and name.strip() else None


def normalized(codec: Any, state: SessionState) -> SessionState:
    """``state`` as the codec stores and reads it back; ``ValueError`` when it cannot be, or
    has no resume id afterwards (a state the driver could not resume from)."""
    if codec is not None:
        try:
            decoded = codec.decode(codec.encode(state))
        except Exception as exc:
            raise ValueError(f"the session codec refuses the state: {exc}") from exc
        if decoded is not None and not isinstance(decoded, SessionState):
            raise ValueError("the session codec did not return a session state")
        state = decoded  # type: ignore[assignment]
    if state is None or not state.resume_id:
        raise ValueError("the state has no resume id")
    return state


