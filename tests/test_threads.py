"""Threads through real script-driver runs on both thread stores."""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor import _thread, errors, events
from adaptor.driver import Request, Response, SessionContext, SessionState
from adaptor.memory import Store as MemoryStore
from adaptor.testing import ScriptedDriver
from adaptor.threadstore import JSONLStore, LeaseLostError, Query
from tests.daemon_harness import DaemonProcess
from tests.durable_hooks import hook_datasyncs


class Recording(ScriptedDriver):
    """A script driver that remembers the session context of every call."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.sessions: list[SessionContext | None] = []

    def run(self, request: Request, sink: Any) -> Response:
        self.sessions.append(request.session)
        return super().run(request, sink)


@pytest.fixture(params=["memory", "jsonl"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "memory":
        return MemoryStore()
    return JSONLStore(tmp_path / "threads")


def agent_with(
    store: Any, steps: list[dict[str, Any]] | None = None, **kw: Any
) -> tuple[adaptor.Agent, Recording]:
    driver = Recording(
        steps or [{"text": "ok"}], session="auto", descriptor=kw.pop("descriptor", None)
    )
    return adaptor.Agent(driver, thread_store=store, **kw), driver


def test_thread_needs_a_store() -> None:
    driver = Recording([{"text": "x"}], session="auto")
    agent = adaptor.Agent(driver)
    thread = agent.thread("k")
    with pytest.raises(adaptor.ThreadStoreRequiredError):
        thread.run("go")
    stream = thread.stream("go")
    assert list(stream) == []
    with pytest.raises(adaptor.ThreadStoreRequiredError):
        stream.result()
    with pytest.raises(adaptor.ThreadStoreRequiredError):
        thread.checkpoint()
    assert driver.sessions == []


def test_programmer_errors_on_keys(store: Any) -> None:
    agent, _ = agent_with(store)
    with pytest.raises(ValueError):
        agent.thread("")
    with pytest.raises(ValueError):
        agent.thread("k").fork("")


def test_a_key_that_is_not_unicode_text_is_refused_by_the_handle(store: Any) -> None:
    # os.fsdecode makes a lone surrogate of bytes that are not UTF-8 (a key from argv or a
    # file name).  It was taken, and its first run failed after RunStarted with a bare
    # ValueError about the store's lease "target"; checkpoint() named "Query.key".
    agent, driver = agent_with(store)
    with pytest.raises(ValueError, match="thread key is not valid Unicode text"):
        agent.thread("tenant/\udcff")
    with pytest.raises(ValueError, match="thread key is not valid Unicode text"):
        agent.thread("k").fork("alt/\ud800")
    with pytest.raises(TypeError, match="thread key must be a str"):
        agent.thread(b"k")  # type: ignore[arg-type]
    assert driver.sessions == []


def test_driver_without_resume_cannot_run_threads(store: Any) -> None:
    agent, driver = agent_with(store, descriptor={"sessions": {"supports_resume": False}})
    with pytest.raises(adaptor.ThreadIncompatibleError):
        agent.thread("k").run("go")
    assert driver.sessions == []


def test_continue_or_start_then_resume(store: Any) -> None:
    agent, driver = agent_with(store)
    thread = agent.thread("tenant-42/issue-123")
    first = thread.run("one")
    assert driver.sessions[0] is not None and driver.sessions[0].state is None
    checkpoint = thread.checkpoint()
    assert checkpoint.valid and checkpoint.state.resume_id.startswith("script-")
    second = agent.thread("tenant-42/issue-123").run("two")  # another handle, same conversation
    session = driver.sessions[1]
    assert session is not None and session.mode == "continue_or_start"
    assert session.state is not None and session.state.resume_id == checkpoint.state.resume_id
    assert first.text == second.text == "ok"
    record = store.resolve(Query(key="tenant-42/issue-123"))
    assert record is not None and record.state.resume_id == checkpoint.state.resume_id


def test_events_carry_the_thread_key(store: Any) -> None:
    agent, _ = agent_with(store)
    stream = agent.thread("k/1").stream("go")
    evs = list(stream)
    stream.result()
    assert {e.meta.thread_key for e in evs} == {"k/1"}


def test_resume_only(store: Any) -> None:
    agent, driver = agent_with(store)
    with pytest.raises(adaptor.ThreadNotFoundError):
        agent.thread("k", resume_only=True).run("go")
    assert driver.sessions == []
    agent.thread("k").run("start")
    agent.thread("k", resume_only=True).run("again")
    last = driver.sessions[-1]
    assert last is not None and last.mode == "continue_only" and last.state is not None


def test_fingerprint_guard(store: Any) -> None:
    agent, driver = agent_with(store)
    agent.thread("k").run("start", model="m1")
    original = store.resolve(Query(key="k"))
    with pytest.raises(adaptor.ThreadIncompatibleError):
        agent.thread("k", resume_only=True).run("go", model="m2")
    assert store.resolve(Query(key="k")) == original  # untouched
    calls = len(driver.sessions)
    stream = agent.thread("k").stream("go", model="m2")  # default mode starts fresh, and says so
    notices = [e for e in stream if isinstance(e, adaptor.Notice) and e.data.get("phase") == "thread.new_session"]
    stream.result()
    assert len(notices) == 1 and "model" in notices[0].data["reason"]
    assert len(driver.sessions) == calls + 1
    assert driver.sessions[-1].state is None  # type: ignore[union-attr]
    fresh = store.resolve(Query(key="k"))
    assert fresh is not None and fresh.id != original.id
    archived = store.resolve(Query(id=original.id, include_archived=True))
    assert archived is not None and archived.status == "archived"


def test_an_incompatible_session_names_the_settings_that_changed(store: Any, tmp_path: Path) -> None:
    # The error said "driver configuration, model, workspace, instructions, skills, MCP servers
    # or tools changed" whatever changed: a user could not tell which setting to put back.
    agent, _ = agent_with(store)
    agent.thread("k").run("start", model="m1", instructions="be brief")
    with pytest.raises(adaptor.ThreadIncompatibleError) as caught:
        agent.thread("k", resume_only=True).run("go", model="m2", instructions="be brief")
    assert str(caught.value) == "thread 'k': its model changed since the stored session"
    with pytest.raises(adaptor.ThreadIncompatibleError) as caught:
        agent.thread("k", resume_only=True).run(
            "go", model="m1", instructions="be thorough", workspace=str(tmp_path)
        )
    assert "its workspace and instructions changed" in str(caught.value)
    agent.thread("k", resume_only=True).run("go", model="m1", instructions="be brief")
    stream = agent.thread("k").stream("go", model="m1")  # instructions left out: a change
    reasons = [
        e.data["reason"]
        for e in stream
        if isinstance(e, adaptor.Notice) and e.data.get("phase") == "thread.new_session"
    ]
    stream.result()
    assert reasons == ["its instructions changed since the stored session"]


class _SavedBeforeDigests:
    """A store whose records read as saved before the per-setting digests were kept: the
    whole hash in both fingerprint fields."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def resolve(self, query: Query) -> Any:
        record = self._store.resolve(query)
        if record is None:
            return None
        return dataclasses.replace(record, fingerprint=record.compatibility_fingerprint)


def test_a_record_without_per_setting_digests_gets_the_general_reason(store: Any) -> None:
    agent, _ = agent_with(store)
    agent.thread("k").run("start", model="m1")
    record = store.resolve(Query(key="k"))
    assert record is not None and record.fingerprint.startswith("adaptor/thread-parts/v1 ")
    assert record.compatibility_fingerprint.startswith("sha256:")
    agent, _ = agent_with(_SavedBeforeDigests(store))
    with pytest.raises(adaptor.ThreadIncompatibleError) as caught:
        agent.thread("k", resume_only=True).run("go", model="m2")
    assert str(caught.value) == (
        "thread 'k': driver configuration, model, workspace, instructions, skills, MCP servers "
        "or tools changed"
    )
    agent.thread("k", resume_only=True).run("go", model="m1")  # the whole hash still matches


@dataclasses.dataclass(frozen=True)
class _HookedConfig:
    model: str
    hooks: dict[str, Any]


class _Hooked(Recording):
    """A host's own driver whose config holds a callable: no stable session fingerprint."""

    def __init__(self, config: _HookedConfig) -> None:
        super().__init__([{"text": "ran"}], session="auto")
        self.config = config

    def session_config_fingerprint(self) -> str:
        from adaptor.driver import canonical_fingerprint

        return canonical_fingerprint("hooked/v1", self.config, root="HookedConfig")


def test_a_config_that_cannot_be_fingerprinted_is_incompatible_naming_no_value(store: Any) -> None:
    # errors.md: SessionConfigFingerprintError is the cause inside ThreadIncompatibleError and
    # names the Python shape only; until now only a hand-built instance was ever checked.
    secret = "sk-hooked-Zq81secretvalue"
    # A key of the map is where the callable sits: the path must not name it.
    driver = _Hooked(_HookedConfig(model=secret, hooks={secret: lambda text: text}))
    with pytest.raises(adaptor.ThreadIncompatibleError) as caught:
        adaptor.Agent(driver, thread_store=store).thread("k").run("go")
    assert driver.sessions == [] and store.resolve(Query(key="k")) is None
    assert errors.exit_code_for(caught.value) == 4
    cause = errors.find(caught.value, adaptor.driver.SessionConfigFingerprintError)
    assert cause is not None and caught.value.cause is cause
    assert (cause.path, cause.type, cause.kind) == ("HookedConfig.hooks{}", "function", "callable")
    assert str(caught.value) == f"the driver configuration cannot be fingerprinted: {cause.why} at HookedConfig.hooks{{}}"
    wire = errors.to_wire(caught.value)
    assert secret not in str(wire) and secret not in str(caught.value) + str(cause)
    rebuilt = errors.from_wire(wire)
    assert type(rebuilt) is adaptor.ThreadIncompatibleError
    again = errors.find(rebuilt, adaptor.driver.SessionConfigFingerprintError)
    assert again is not None and again.fields() == cause.fields()


def test_schema_is_not_part_of_the_fingerprint(store: Any) -> None:
    agent, driver = agent_with(store, [{"output_json": {"a": 1}}])
    agent.thread("k").run("start")
    agent.thread("k", resume_only=True).run("go", schema={"type": "object"})
    assert driver.sessions[-1].state is not None  # type: ignore[union-attr]


def test_fork(store: Any) -> None:
    agent, driver = agent_with(store)
    parent = agent.thread("parent")
    parent.run("start")
    before = store.resolve(Query(key="parent"))
    branch = parent.fork("parent/alt")
    branch.run("branch off")
    fork_session = driver.sessions[-1]
    assert fork_session is not None and fork_session.mode == "fork"
    assert fork_session.state is not None and fork_session.state.resume_id == before.state.resume_id
    assert store.resolve(Query(key="parent")) == before  # parent unchanged
    child = store.resolve(Query(key="parent/alt"))
    assert child is not None and child.state.resume_id != before.state.resume_id
    branch.run("continue the branch")
    assert driver.sessions[-1].mode == "continue_or_start"  # type: ignore[union-attr]
    assert driver.sessions[-1].state.resume_id == child.state.resume_id  # type: ignore[union-attr]


def test_fork_refusals(store: Any) -> None:
    agent, driver = agent_with(store)
    with pytest.raises(adaptor.ThreadNotFoundError):
        agent.thread("nobody").fork("x").run("go")
    agent.thread("a").run("start")
    agent.thread("b").run("start")
    before = (store.resolve(Query(key="a")), store.resolve(Query(key="b")))
    calls = len(driver.sessions)
    with pytest.raises(adaptor.ThreadAlreadyExistsError):
        agent.thread("a").fork("b").run("go")
    assert len(driver.sessions) == calls
    assert (store.resolve(Query(key="a")), store.resolve(Query(key="b"))) == before


def test_busy_loser_never_reaches_the_driver(store: Any) -> None:
    agent, driver = agent_with(store, [{"text": "holding"}, {"sleep": 30}])
    holder = agent.thread("k").stream("hold the lease")
    for event in holder:
        if isinstance(event, events.TextDelta) and event.phase == "end":
            break
    calls = len(driver.sessions)
    with pytest.raises(adaptor.ThreadBusyError) as info:
        agent.thread("k").run("second")
    assert errors.find(info.value, adaptor.threadstore.BusyError) is not None
    assert errors.exit_code_for(info.value) == 75
    assert str(info.value) == "thread 'k' is busy: another owner holds its lease"
    assert len(driver.sessions) == calls
    holder.cancel()
    with pytest.raises(adaptor.RunCancelledError):
        holder.result()
    # the key is usable after the holder released its lease
    agent2, _ = agent_with(store)
    agent2.thread("k").run("third")


def test_a_lease_whose_release_failed_does_not_keep_the_key_busy(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A full disk refused the release: this process's next run of the key (a daemon's next
    # request in the conversation) released it first, instead of finding it busy for the
    # lease's whole TTL.
    agent, driver = agent_with(store)
    release = store.release_lease
    refused: list[Any] = []

    def full_disk_once(lease: Any) -> None:
        if not refused:
            refused.append(lease)
            raise OSError(errno.ENOSPC, "No space left on device")
        release(lease)

    monkeypatch.setattr(store, "release_lease", full_disk_once)
    assert agent.thread("k").run("one").text == "ok"
    assert len(refused) == 1
    assert agent.thread("k").run("two").text == "ok"
    assert len(driver.sessions) == 2


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_owes_no_releases(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, _ = agent_with(store)

    def full_disk(lease: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "release_lease", full_disk)
    agent.thread("k").run("one")
    assert _thread._owed
    with _thread._owed_lock:  # as if another thread were inside when the process forked
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not _thread._owed and _thread._owed_lock.acquire(timeout=5) else 1)
    assert os.waitpid(pid, 0)[1] == 0
    monkeypatch.undo()
    agent.thread("k").run("two")  # the parent still owes it, and releases it first
    assert not [owed for owed in _thread._owed if owed.store is store]


def test_resume_rejected_falls_back_to_a_fresh_session(store: Any) -> None:
    agent, driver = agent_with(store)
    agent.thread("k").run("start")
    old = store.resolve(Query(key="k"))
    rejecting = Recording(
        [{"reject_resume": "session not found"}, {"text": "fresh"}], session="auto"
    )
    agent2 = adaptor.Agent(rejecting, thread_store=store)
    result = agent2.thread("k").run("go on")
    assert result.text == "fresh"
    assert len(rejecting.sessions) == 2
    assert rejecting.sessions[0].state is not None and rejecting.sessions[1].state is None  # type: ignore[union-attr]
    new = store.resolve(Query(key="k"))
    assert new is not None and new.id != old.id
    assert store.resolve(Query(id=old.id, include_archived=True)).status == "archived"


def test_resume_only_keeps_resume_rejected(store: Any) -> None:
    agent, _ = agent_with(store)
    agent.thread("k").run("start")
    old = store.resolve(Query(key="k"))
    rejecting = Recording([{"reject_resume": "session not found"}], session="auto")
    with pytest.raises(adaptor.ResumeRejectedError) as info:
        adaptor.Agent(rejecting, thread_store=store).thread("k", resume_only=True).run("go")
    assert info.value.reason == "session not found"
    assert errors.exit_code_for(info.value) == 4
    assert len(rejecting.sessions) == 1
    assert store.resolve(Query(key="k")) == old


def test_success_without_checkpoint_persists_nothing(store: Any) -> None:
    driver = Recording([{"text": "no session id"}])  # session=None: never checkpointable
    agent = adaptor.Agent(driver, thread_store=store)
    with pytest.raises(adaptor.RunError) as info:
        agent.thread("k").run("go")
    assert type(info.value) is adaptor.RunError
    assert info.value.reason == "infrastructure_error"
    assert errors.matches(info.value, adaptor.ThreadCheckpointMissingError)
    assert errors.exit_code_for(info.value) == 4  # thread state, not a business failure (1)
    assert info.value.result is not None and info.value.result.text == "no session id"
    assert store.resolve(Query(key="k")) is None


def test_failed_runs_never_overwrite_a_good_checkpoint(store: Any) -> None:
    agent, _ = agent_with(store)
    agent.thread("k").run("start")
    good = store.resolve(Query(key="k"))
    failing = Recording([PERMISSION_STEP], session="auto")
    with pytest.raises(adaptor.ApprovalDeniedError):
        adaptor.Agent(failing, thread_store=store, on_approval=adaptor.deny_all()).thread("k").run(
            "x"
        )
    broken = Recording([{"fail": {"code": "agent_error"}}], session="auto")
    with pytest.raises(adaptor.AgentFailedError):
        adaptor.Agent(broken, thread_store=store).thread("k").run("x")
    assert store.resolve(Query(key="k")) == good


PERMISSION_STEP = {"approval": {"kind": "permission", "title": "write"}}


class LosingStore(MemoryStore):
    """A store whose renewals fail: another owner took the lease over."""

    def renew_lease(self, lease: Any, ttl: float) -> None:
        raise LeaseLostError(lease.target)


def test_lease_loss_aborts_without_persisting() -> None:
    store = LosingStore()
    driver = Recording([{"text": "working"}, {"sleep": 30}], session="auto")
    agent = adaptor.Agent(driver, thread_store=store, lease_renewal=0.05)
    with pytest.raises(adaptor.RunError) as info:
        agent.thread("k").run("go")
    assert info.value.reason == "infrastructure_error"
    assert errors.matches(info.value, adaptor.ThreadLeaseLostError)
    assert errors.matches(info.value, LeaseLostError)
    assert errors.exit_code_for(info.value) == 4
    assert store.resolve(Query(key="k")) is None


class GatedStore(MemoryStore):
    """A store whose lease acquisition waits for a gate (a slow shared disk, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def acquire_lease(self, target: str, owner: str, ttl: float) -> Any:
        self.entered.set()
        self.gate.wait(30)
        return super().acquire_lease(target, owner, ttl)


def test_cancel_before_driver_entry_is_plain_cancelled() -> None:
    store = GatedStore()
    driver = Recording([{"text": "x"}], session="auto")
    stream = adaptor.Agent(driver, thread_store=store).thread("k").stream("go")
    assert store.entered.wait(10)
    stream.cancel()
    store.gate.set()
    evs = list(stream)
    with pytest.raises(adaptor.CancelledError) as info:
        stream.result()
    assert not isinstance(info.value, adaptor.RunError)
    assert driver.sessions == []
    assert isinstance(evs[0], events.RunStarted) and isinstance(evs[-1], events.RunFinished)
    assert evs[-1].failed


def test_a_budget_spent_before_driver_entry_is_still_a_run_error_with_a_result() -> None:
    # The active-execution budget starts before the lease is taken.  Spent there, it raised
    # ActiveExecutionTimeoutError with result None: `except adaptor.RunError as e:
    # e.result.text` crashed, and the daemon wrote a RunError verdict with "result": null.
    store = GatedStore()
    driver = Recording([{"text": "x"}], session="auto")
    policy = adaptor.Policy(active_execution_timeout=0.05)
    stream = adaptor.Agent(driver, thread_store=store).thread("k").stream("go", policy=policy)
    assert store.entered.wait(10)
    opener = threading.Timer(1.0, store.gate.set)  # long after the budget's timer fired
    opener.start()
    with pytest.raises(adaptor.ActiveExecutionTimeoutError) as info:
        stream.result()
    opener.join()
    assert driver.sessions == []
    result = info.value.result
    assert result is not None and result.text == "" and result.run_id == stream.run_id
    assert info.value.limit == 0.05 and info.value.details == {"limit": 0.05}
    assert errors.exit_code_for(info.value) == 1


def test_deadline_before_driver_entry_is_plain_deadline_exceeded() -> None:
    store = GatedStore()
    driver = Recording([{"text": "x"}], session="auto")
    stream = adaptor.Agent(driver, thread_store=store).thread("k").stream("go", timeout=0.05)
    assert store.entered.wait(10)
    # the store answers long after the deadline fired; the run must not reach the driver
    opener = threading.Timer(1.0, store.gate.set)
    opener.start()
    with pytest.raises(adaptor.DeadlineExceededError) as info:
        stream.result()
    assert not isinstance(info.value, adaptor.RunError)
    assert driver.sessions == []


@pytest.mark.parametrize("key", ["../x", "a/b", "with space", "ключ/ü", "k" * 1024, "./.", "a\\b"])
def test_opaque_keys(tmp_path: Path, key: str) -> None:
    store = JSONLStore(tmp_path / "threads")
    agent, driver = agent_with(store)
    agent.thread(key).run("one")
    agent.thread(key, resume_only=True).run("two")
    assert driver.sessions[-1].state is not None  # type: ignore[union-attr]
    assert not (tmp_path / "x").exists() and not (tmp_path / "threads" / "a").exists()
    assert agent.thread(key).checkpoint().valid


def test_checkpoint_errors(store: Any) -> None:
    agent, _ = agent_with(store)
    with pytest.raises(adaptor.ThreadNotFoundError):
        agent.thread("missing").checkpoint()


def test_closed_agent_refuses_thread_runs(store: Any) -> None:
    agent, driver = agent_with(store)
    agent.close()
    with pytest.raises(adaptor.AgentClosedError):
        agent.thread("k").run("go")
    assert driver.sessions == []


class _DiskFullsAfterItsSteps(ScriptedDriver):
    """A scripted agent after whose steps every data sync of the store fails (a full disk)."""

    def __init__(self, steps: list[dict[str, Any]], full: threading.Event) -> None:
        super().__init__(steps, session="auto")
        self.full = full

    def run(self, request: Request, sink: Any) -> Response:
        response = super().run(request, sink)
        self.full.set()
        return response


def _sync_refused_while(full: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    def sync(fd: int) -> None:
        if full.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        os.fdatasync(fd)

    hook_datasyncs(monkeypatch, sync)


def test_a_thread_the_store_cannot_save_keeps_its_answer_and_frees_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The save failing (a full disk) escaped the run as a bare OSError, the answer lost, and
    # left the key's lease held by this very process: a new store on the same files (what the
    # broken one's error says to open) found the key busy for the lease's five minutes.
    threads = tmp_path / "threads"
    first = adaptor.Agent(ScriptedDriver([{"text": "first"}], session="auto"), thread_store=JSONLStore(threads))
    first.thread("k").run("go")
    full = threading.Event()
    _sync_refused_while(full, monkeypatch)
    agent = adaptor.Agent(_DiskFullsAfterItsSteps([{"text": "the answer"}], full), thread_store=JSONLStore(threads))
    with pytest.raises(adaptor.RunError) as caught:
        agent.thread("k").run("again")
    assert caught.value.reason == "infrastructure_error"
    assert caught.value.result is not None and caught.value.result.text == "the answer"
    assert errors.matches(caught.value, OSError) and "No space left on device" in str(caught.value)
    full.clear()  # room again
    later = adaptor.Agent(ScriptedDriver([{"text": "served"}], session="auto"), thread_store=JSONLStore(threads))
    assert later.thread("k").run("once more").text == "served"


def test_a_checkpoint_the_store_cannot_write_is_an_infrastructure_run_error(tmp_path: Path) -> None:
    class OddCheckpoint(ScriptedDriver):
        def run(self, request: Request, sink: Any) -> Response:
            response = super().run(request, sink)
            assert response.checkpoint is not None and response.checkpoint.state is not None
            state = response.checkpoint.state
            odd = type(state)(resume_id=state.resume_id + "\udc80", data=state.data)
            return dataclasses.replace(response, checkpoint=dataclasses.replace(response.checkpoint, state=odd))

    agent = adaptor.Agent(OddCheckpoint([{"text": "kept"}], session="auto"), thread_store=JSONLStore(tmp_path / "t"))
    with pytest.raises(adaptor.RunError) as caught:
        agent.thread("k").run("go")
    assert caught.value.reason == "infrastructure_error" and caught.value.result is not None
    assert caught.value.result.text == "kept" and "could not be saved" in str(caught.value)


def test_a_run_whose_lease_cannot_be_renewed_stops_when_the_lease_expires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A renewal the store refused was ignored: the run went on past its lease's expiry while
    # another owner could take the key and drive the same session.  Here the store refuses
    # because another key's save failed on it (a full disk): it takes no write after that.
    store = JSONLStore(tmp_path / "threads")
    long_turn = adaptor.Agent(
        ScriptedDriver([{"text": "working"}, {"sleep": 30}, {"text": "too late"}], session="auto"),
        # Long enough a lease that the other key's save surely fails before it expires.
        thread_store=store, lease_ttl=3.0, lease_renewal=0.2,
    )
    full = threading.Event()
    _sync_refused_while(full, monkeypatch)
    stream = long_turn.thread("long").stream("go")
    for event in stream:
        if isinstance(event, events.TextDelta) and not full.is_set():
            short_turn = adaptor.Agent(_DiskFullsAfterItsSteps([{"text": "short"}], full), thread_store=store)
            with pytest.raises(adaptor.RunError, match="could not be saved"):
                short_turn.thread("other").run("go")
    with pytest.raises(adaptor.RunError) as caught:
        stream.result()
    assert caught.value.reason == "infrastructure_error" and "lease expired" in str(caught.value)
    assert errors.matches(caught.value, adaptor.ThreadLeaseLostError)
    assert errors.matches(caught.value, OSError)  # the renewals' own error
    assert caught.value.result is not None and "too late" not in caught.value.result.text


class _Codec:
    """A driver's own session codec: keeps only the resume id, or refuses once told to."""

    def __init__(self) -> None:
        self.refuse = False

    def name(self) -> str:
        return "script"

    def encode(self, state: Any) -> dict[str, Any]:
        return {} if state is None else {"resume_id": state.resume_id}

    def decode(self, params: Any) -> Any:
        if self.refuse:
            raise ValueError("this codec reads no state")
        return SessionState(resume_id=params["resume_id"]) if params else None


class _OwnCodec(Recording):
    def __init__(self, codec: _Codec, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.codec = codec

    def session_codec(self) -> _Codec:
        return self.codec


def test_states_go_through_the_drivers_session_codec(store: Any) -> None:
    # The codec was only ever asked its name: a state it cannot read was persisted, resumed,
    # forked from and reported as a valid checkpoint.
    codec = _Codec()
    driver = _OwnCodec(codec, [{"text": "ok"}], session="auto")
    agent = adaptor.Agent(driver, thread_store=store)
    agent.thread("k").run("one")
    checkpoint = agent.thread("k").checkpoint()
    assert checkpoint.valid and checkpoint.state is not None and checkpoint.state.data == {}
    agent.thread("k", resume_only=True).run("two")
    resumed = driver.sessions[-1]
    assert resumed is not None and resumed.state is not None and resumed.state.data == {}
    codec.refuse = True
    with pytest.raises(adaptor.ThreadCheckpointMissingError):
        agent.thread("k").checkpoint()
    with pytest.raises(adaptor.ThreadIncompatibleError, match="refuses the state"):
        agent.thread("k", resume_only=True).run("three")
    with pytest.raises(adaptor.ThreadIncompatibleError, match="refuses the state"):
        agent.thread("k").fork("k2").run("four")
    with pytest.raises(adaptor.RunError) as caught:  # a fresh key: its checkpoint cannot be stored
        agent.thread("fresh").run("five")
    assert errors.matches(caught.value, adaptor.ThreadCheckpointMissingError)
    assert store.resolve(Query(key="fresh")) is None


def test_run_finished_names_the_session_each_turn_ran_in(store: Any) -> None:
    # thread_id was "" in every run.finished: an audit log could not tell which agent session
    # a turn ran in (resumed, forked, or started afresh).
    agent, _ = agent_with(store)
    thread = agent.thread("k")

    def finished(stream: adaptor.Stream) -> events.RunFinished:
        last = list(stream)[-1]
        stream.result()
        assert isinstance(last, events.RunFinished)
        return last

    first = finished(thread.stream("go"))
    record = store.resolve(Query(key="k"))
    assert record is not None and record.state is not None
    assert first.thread_id == record.state.resume_id != ""
    assert finished(thread.stream("again")).thread_id == first.thread_id  # resumed
    forked = finished(thread.fork("k/fork").stream("branch"))
    branch = store.resolve(Query(key="k/fork"))
    assert branch is not None and branch.state is not None
    assert forked.thread_id == branch.state.resume_id != first.thread_id
    # No session to name: a driver that made no checkpoint.
    plain = adaptor.Agent(ScriptedDriver([{"text": "x"}]))
    assert finished(plain.stream("go")).thread_id == ""
    agent.close()
    plain.close()


def test_a_drivers_request_env_carries_the_starters_mark(store: Any) -> None:
    # A driver of one's own hands Request.env to its CLI (conformance ENV-01), and nothing
    # else: without the mark there, its CLI outliving a killed host left the thread's lease
    # free, and another turn resumed the conversation beside it.
    from adaptor import _procfs

    seen: list[dict[str, str]] = []

    class Watching(Recording):
        def run(self, request: Request, sink: Any) -> Response:
            seen.append(dict(request.env))
            return super().run(request, sink)

    agent = adaptor.Agent(Watching([{"text": "ok"}], session="auto"), thread_store=store)
    agent.thread("k").run("go")
    mark = _procfs.started_by_me()
    assert mark and seen[0].items() >= mark.items()



def test_a_key_busy_with_a_lease_this_process_could_not_release_says_why(tmp_path: Path) -> None:
    # A daemon whose thread store reached the file-size limit (ulimit -f) during a turn: the
    # turn could not be saved nor its lease released, and every later turn of the key was told
    # "another owner holds its lease", which sent its user looking for another process.
    daemon = DaemonProcess(tmp_path / "home").start()
    assert daemon.proc is not None

    def turn(steps: list[dict[str, Any]]) -> str:
        return daemon.submit({"driver": "script", "prompt": "p", "thread": {"key": "k"},
                              "config": {"session": "auto", "steps": steps}})

    assert daemon.verdict(turn([{"text": "first"}]))["ok"]
    second = turn([{"text": "working"}, {"sleep": 1}, {"text": "done"}])
    events_dir = daemon.home.root / "events"
    deadline = time.monotonic() + 30
    while not any(b'"working"' in log.read_bytes() for log in events_dir.glob("thread=*.jsonl")):
        assert time.monotonic() < deadline, "the second turn never started"
        time.sleep(0.01)
    # Its lease is taken: from now on the store's log may not grow.
    (store_log,) = (daemon.home.root / "threads").glob("log-*.jsonl")
    limit = store_log.stat().st_size
    subprocess.run(["prlimit", "--pid", str(daemon.proc.pid), f"--fsize={limit}"], check=True)
    error = daemon.verdict(second)["error"]
    assert error["message"] == "the thread could not be saved: OSError: [Errno 27] File too large"
    error = daemon.verdict(turn([{"text": "third"}]))["error"]
    assert error["code"] == "ErrThreadBusy"
    assert error["message"].startswith(
        "thread 'k' is busy: this process could not release its lease from an earlier turn "
        "(OSError: [Errno 27] File too large); it expires within "
    )
    assert error["message"].endswith(" s")
    assert daemon.stop() == 0
