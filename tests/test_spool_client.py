"""adaptor.spool.Client against a real ``adaptord serve`` subprocess, used as a user would.

The daemon is reached only through its home directory (``Client``) and the ``adaptor`` console
script.  Every error class the in-process suite reaches with the ``script`` driver is produced
through the daemon and compared with the same request run in-process through
``adaptor._request.build``: same class, same fields, same cause chain, and ``adaptor wait``
exits with the documented code.
"""

from __future__ import annotations

import _thread
import errno
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

import adaptor
from adaptor import _durable, _home, _request, errors, events, spool
from adaptor.spool import (
    Client,
    DaemonNotRunningError,
    ForeignHomeError,
    InvalidRequestError,
    SpoolNotFoundError,
    UnknownRequestError,
    WaitTimeoutError,
)
from adaptor.threadstore import JSONLStore
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess
from tests.inotify_hog import InotifyHog
from tests.mounts import exfat

TIMEOUT = 60.0
PERMISSION = {"approval": {"kind": "permission", "title": "edit main.py"}}
QUESTION = {"approval": {"kind": "question", "title": "which one?", "choices": ["red", "blue"]}}


# --- the daemon and how a user reaches it -------------------------------------------------------


@dataclass
class Home:
    """One running daemon's home, reached through files, the Client and the CLI."""

    root: Path
    daemon: DaemonProcess
    config_home: Path
    client: Client = field(init=False)

    def __post_init__(self) -> None:
        self.client = Client(self.root)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "ADAPTORD_HOME": str(self.root),
            "XDG_CONFIG_HOME": str(self.config_home),
        }

    def cli(
        self, *args: str, input: str | None = None, timeout: float = TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """``adaptor ARGS`` as a separate process (the home comes from ``ADAPTORD_HOME``)."""
        return subprocess.run(
            ["adaptor", *args],
            input=input,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    base = tmp_path_factory.mktemp("adaptord")
    config_home = base / "config"  # no config file: driver defaults as in-process
    config_home.mkdir()
    process = DaemonProcess(
        base / "home", "--grace", "2", env={"XDG_CONFIG_HOME": str(config_home)}
    ).start()  # returns once "adaptord: ready" is logged
    yield Home(base / "home", process, config_home)
    assert process.stop() == 0, "\n".join(process.lines)


def wait_until(condition: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def pending_approval(home: Home, request_id: str) -> dict[str, Any]:
    """Wait for the request's approval file in ``approvals/pending/``."""

    def find() -> dict[str, Any] | None:
        return next((a for a in home.client.approvals() if a["request_id"] == request_id), None)

    found: dict[str, Any] = wait_until(find, f"a pending approval of {request_id}")
    return found


def script(
    *steps: dict[str, Any], config: dict[str, Any] | None = None, **fields: Any
) -> dict[str, Any]:
    return {
        "driver": "script",
        "prompt": "go",
        "config": {"steps": list(steps), **(config or {})},
        **fields,
    }


def threaded(
    key: str, *steps: dict[str, Any], config: dict[str, Any] | None = None, **thread: Any
) -> dict[str, Any]:
    return script(
        *(steps or ({"text": "ok"},)),
        config={"session": "auto", **(config or {})},
        thread={"key": key, **thread},
    )


# --- the in-process twin --------------------------------------------------------------------------


def unanswered(request: adaptor.ApprovalRequest) -> None:
    """The in-process counterpart of a pending file nobody answers: wait out the deadline."""
    if request.deadline is not None:
        request.wait(max((request.deadline - datetime.now(UTC)).total_seconds(), 0.0))


def run_in_process(
    request: dict[str, Any],
    store: JSONLStore,
    on_event: Callable[[events.Event, adaptor.Stream], None] | None = None,
) -> adaptor.Result | BaseException:
    """The request as the daemon maps it, run in this process; the Result or the exception."""
    try:
        parsed = _request.parse(orjson.dumps(request), "in-process")
        call = _request.build(
            parsed, driver_defaults={}, thread_store=store, on_approval=unanswered, tools={}
        )
    except Exception as exc:
        return exc
    stream = call.start()
    try:
        for event in stream:
            if on_event is not None:
                on_event(event, stream)
        return stream.result()
    except Exception as exc:
        return exc
    finally:
        call.agent.close()


_VOLATILE = re.compile(r"run_[0-9a-f]{16}|script-[0-9a-f]{16}|ses_[0-9a-f]{16}")


def identity(err: BaseException) -> Any:
    """The wire form (class, code, fields, reason, details, messages, causes) minus ids that
    differ between any two runs."""

    def scrub(value: Any) -> Any:
        if isinstance(value, str):
            return _VOLATILE.sub("<id>", value)
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if isinstance(value, dict):
            return {k: scrub(v) for k, v in value.items()}
        return value

    return scrub(errors.to_wire(err))


def chain(err: BaseException | None) -> list[BaseException]:
    found = []
    while err is not None:
        found.append(err)
        err = err.__cause__
    return found


def assert_same_error(remote: BaseException, local: BaseException) -> None:
    assert type(remote) is type(local), (remote, local)
    assert identity(remote) == identity(local)
    for rebuilt, original in zip(chain(remote), chain(local), strict=True):
        if isinstance(original, errors.AdaptorError):
            assert type(rebuilt) is type(original)
            assert rebuilt.fields() == original.fields()
    if isinstance(local, errors.RunError):
        assert isinstance(remote, errors.RunError)
        assert remote.result is not None and local.result is not None
        assert remote.result.text == local.result.text
        assert [i.to_json() for i in remote.result.transcript()] == [
            i.to_json() for i in local.result.transcript()
        ]
        assert remote.result.raw().stdout == local.result.raw().stdout


# --- success ------------------------------------------------------------------------------------


def test_success_round_trip_rebuilds_the_whole_result(home: Home, tmp_path: Path) -> None:
    request = script(
        {"stdout": "raw out"},
        {"stderr": "raw err"},
        {"text": "hello"},
        {"tool_call": {"name": "grep", "args": {"pattern": "x"}, "result": ["a.py"]}},
        {"text": "done"},
    )
    result = home.client.run(request, timeout=TIMEOUT)
    local = run_in_process(request, JSONLStore(tmp_path / "threads"))
    assert isinstance(local, adaptor.Result)
    assert result.text == local.text == "done"
    assert (result.model, result.provider, result.usage) == (
        local.model,
        local.provider,
        local.usage,
    )
    raw = result.raw()
    assert (raw.stdout, raw.stderr) == ("raw out\n", "raw err\n")
    assert raw.terminal is not None and raw.terminal == local.raw().terminal
    assert [i.to_json() for i in result.transcript()] == [i.to_json() for i in local.transcript()]
    assert [i.kind for i in result.transcript()] == [
        "assistant",
        "tool_call",
        "tool_result",
        "assistant",
    ]


def test_events_of_a_finished_request(home: Home, tmp_path: Path) -> None:
    request = script({"text": "hello"}, {"tool_call": {"name": "ls"}})
    request_id = home.client.submit(request)
    result = home.client.wait(request_id, timeout=TIMEOUT)
    seen = list(home.client.events(request_id))
    assert {e.meta.run_id for e in seen} == {result.run_id}
    assert isinstance(seen[0], events.RunStarted) and isinstance(seen[-1], events.RunFinished)
    local: list[events.Event] = []
    run_in_process(request, JSONLStore(tmp_path / "threads"), lambda event, _: local.append(event))
    assert [events.event_kind(e) for e in seen] == [events.event_kind(e) for e in local]


def test_events_keep_to_their_own_run_in_a_thread_log(home: Home) -> None:
    first = home.client.submit(threaded("events/filter", {"text": "one"}))
    second = home.client.submit(threaded("events/filter", {"text": "two"}))
    one, two = home.client.wait(first, TIMEOUT), home.client.wait(second, TIMEOUT)
    assert {e.meta.run_id for e in home.client.events(first)} == {one.run_id}
    texts = [
        e.text for e in home.client.events(second) if isinstance(e, events.TextDelta) and e.text
    ]
    assert texts == ["two"] and {e.meta.run_id for e in home.client.events(second)} == {two.run_id}


def test_a_turns_events_are_read_from_where_they_begin_not_from_the_conversations_start(home: Home) -> None:
    # Each turn's events were found by reading the thread's whole audit log (never pruned: a
    # conversation's history), so `adaptor run --thread` took seconds once it held a few
    # hundred MB.  The daemon says where a request's records begin; only they are read.
    ids = [home.client.submit(threaded("events/deep", {"text": f"turn {i}"})) for i in range(3)]
    results = [home.client.wait(rid, TIMEOUT) for rid in ids]
    log = home.root / "events" / f"{_home.session_for_thread('events/deep')}.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    for rid, result in zip(ids, results, strict=True):
        state = orjson.loads((home.root / "runs" / rid / "state.json").read_bytes())
        first = next(i for i, line in enumerate(lines) if result.run_id.encode() in line)
        assert state["events_from"] == first + 1, (rid, state)
    # Damage in the first turn's records: reading it says so; the later turns are still read.
    damaged = bytearray(b"".join(lines))
    at = damaged.index(b"turn 0")
    damaged[at : at + 6] = b"turn 9"
    log.write_bytes(bytes(damaged))
    with pytest.raises(sr.JSONLEventLogCorruptError):
        list(home.client.events(ids[0]))
    for i in (1, 2):
        seen = list(home.client.events(ids[i]))
        assert {e.meta.run_id for e in seen} == {results[i].run_id}
        assert isinstance(seen[0], events.RunStarted) and isinstance(seen[-1], events.RunFinished)
        assert [e.text for e in seen if isinstance(e, events.TextDelta) and e.text] == [f"turn {i}"]
    # --since counts host_seq: from the middle of a turn, the rest of it.
    records = list(spool._request_records(home.client, ids[2], follow=False))
    later = list(spool._request_records(home.client, ids[2], follow=False, since=records[2].host_seq))
    assert [r.host_seq for r in later] == [r.host_seq for r in records[3:]]


@pytest.mark.parametrize("span", [1, 300, 64 * 1024])
def test_a_record_is_found_by_its_host_seq_in_a_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, span: int) -> None:
    monkeypatch.setattr(spool, "_SEEK_SPAN", span)
    with sr.EventRecorder(sr.JSONLEventBackend(tmp_path), key_validator=lambda key: None) as recorder:
        for i in range(200):
            recorder.record("s", events.TextDelta(text="x" * (i * 37 % 500)))
    log = tmp_path / "s.jsonl"
    data = log.read_bytes()
    starts = [0] + [i + 1 for i, byte in enumerate(data[:-1]) if byte == 0x0A]
    with log.open("rb") as file:
        for seq in (1, 2, 77, 199, 200):
            assert spool._seek(file, seq, len(data)) == starts[seq - 1]
        assert spool._seek(file, 201, len(data)) is None  # not in this history: read it whole
    # A line looked at that is no record: no position, so the strict read from the start says why.
    broken = data[: starts[100]] + b"#" + data[starts[100] + 1 :]
    log.write_bytes(broken)
    with log.open("rb") as file:
        assert spool._seek(file, 150, len(broken)) in (None, starts[149])


def test_events_follow_a_live_run_until_its_verdict(home: Home) -> None:
    request_id = home.client.submit(
        script(PERMISSION, {"text": "after"}, policy={"approvals": {"timeout": 60}})
    )
    seen: list[events.Event] = []
    asked = threading.Event()

    def follow() -> None:
        for event in home.client.events(request_id, follow=True):
            seen.append(event)
            if isinstance(event, events.Notice) and event.kind == "approval.requested":
                asked.set()

    follower = threading.Thread(target=follow)
    follower.start()
    # The run cannot end before the approval is answered, so this proves the follower is live.
    assert asked.wait(TIMEOUT)
    assert home.client.verdict(request_id) is None
    home.client.approve(pending_approval(home, request_id)["id"])
    follower.join(TIMEOUT)
    assert not follower.is_alive()
    assert isinstance(seen[-1], events.RunFinished) and not seen[-1].failed
    assert [e.text for e in seen if isinstance(e, events.TextDelta) and e.text] == ["after"]


# --- every error class, rebuilt exactly -----------------------------------------------------------


@dataclass(frozen=True)
class Case:
    expected: type[BaseException]
    request: dict[str, Any]
    setup: tuple[dict[str, Any], ...] = ()
    check: Callable[[Any], bool] = lambda err: True  # extra facts about the class's fields


CASES: dict[str, Case] = {
    "agent_failed": Case(
        errors.AgentFailedError,
        script({"text": "partial"}, {"fail": {"code": "agent_error", "message": "boom"}}),
    ),
    "unknown_reason": Case(
        errors.RunError,
        script(
            {"fail": {"code": "quota_exceeded", "message": "no quota", "details": {"retry_in": 60}}}
        ),
        check=lambda err: err.reason == "quota_exceeded",
    ),
    "approval_denied": Case(
        errors.ApprovalDeniedError,
        script(PERMISSION, policy={"approvals": {"permission": "auto_reject"}}),
    ),
    "approval_timeout": Case(
        errors.ApprovalTimeoutError,
        script(PERMISSION, policy={"approvals": {"permission": "ask", "timeout": 0.3}}),
    ),
    "policy_violation": Case(
        errors.PolicyViolationError,
        script({"output_json": {"b": 1}}, schema={"type": "object", "required": ["a"]}),
    ),
    "deadline": Case(
        errors.RunDeadlineExceededError,
        script({"sleep": 30}, timeout=0.5),
        check=lambda err: isinstance(err.__cause__, errors.DeadlineExceededError),
    ),
    "active_budget": Case(
        errors.ActiveExecutionTimeoutError,
        script({"sleep": 30}, policy={"active_execution_timeout": 0.3}),
        check=lambda err: err.limit == 0.3,
    ),
    "invalid_policy": Case(
        adaptor.InvalidPolicyError,
        script({"text": "x"}, policy={"sandbox": "bogus"}),
        check=lambda err: (err.field, err.value) == ("Policy.Sandbox", "bogus"),
    ),
    # A value of the wrong JSON type is a bad policy value too, as in process (the request
    # schema refused it as ErrInvalidRequest, exit 2, where Policy(sandbox=5) is exit 3).
    "policy_type": Case(
        adaptor.InvalidPolicyError,
        script({"text": "x"}, policy={"sandbox": 5}),
        check=lambda err: (err.field, err.value) == ("Policy.Sandbox", 5),
    ),
    "approval_policy_type": Case(
        adaptor.InvalidPolicyError,
        script({"text": "x"}, policy={"approvals": {"timeout": "soon"}}),
        check=lambda err: (err.field, err.value) == ("Policy.Approvals.Timeout", "soon"),
    ),
    "capability": Case(
        adaptor.PolicyCapabilityUnsupportedError,
        script(
            {"text": "x"},
            config={"descriptor": {"run_policy_caps": {"isolation": False}}},
            policy={"sandbox": "read_only"},
        ),
    ),
    "decision_mode": Case(
        adaptor.HumanDecisionModeUnsupportedError,
        script(
            {"text": "x"},
            config={"descriptor": {"run_policy_caps": {"permission": {"ask": False}}}},
            policy={"approvals": {"permission": "ask"}},
        ),
    ),
    "driver_config": Case(
        adaptor.InvalidDriverConfigError,
        script({"dance": True}),
        check=lambda err: err.cause is not None,
    ),
    "output_schema": Case(
        adaptor.InvalidOutputSchemaError, script({"text": "x"}, schema={"type": 12})
    ),
    "structured_unsupported": Case(
        adaptor.StructuredOutputUnsupportedError,
        script(
            {"text": "x"},
            config={
                "descriptor": {"structured_output": {"native": False, "prompt_validate": False}}
            },
            schema={"type": "object"},
        ),
    ),
    "invalid_request": Case(
        InvalidRequestError,
        {**script({"text": "x"}), "bogus": 1, "timeout": "soon"},
        check=lambda err: [e["path"] for e in err.errors] == ["", "/timeout"],
    ),
    "thread_not_found": Case(errors.ThreadNotFoundError, threaded("nf/k", resume_only=True)),
    "thread_exists": Case(
        errors.ThreadAlreadyExistsError,
        threaded("ae/b", fork_from="ae/a"),
        setup=(threaded("ae/a"), threaded("ae/b")),
    ),
    "thread_incompatible": Case(
        errors.ThreadIncompatibleError,
        threaded("ti/k", config={"descriptor": {"sessions": {"supports_resume": False}}}),
    ),
    "resume_rejected": Case(
        errors.ResumeRejectedError,
        threaded("rr/k", {"reject_resume": "session not found"}, resume_only=True),
        setup=(threaded("rr/k"),),
        check=lambda err: err.reason == "session not found",
    ),
    "checkpoint_missing": Case(
        errors.RunError,
        threaded("cm/k", config={"session": None}),
        check=lambda err: (
            err.reason == "infrastructure_error"
            and errors.matches(err, errors.ThreadCheckpointMissingError)
        ),
    ),
}

# The exit code errors.md gives each case, written out: computed with errors.exit_code_for, as
# below, a wrong mapping there would agree with itself (checkpoint missing exited 1, not 4).
SPEC_EXIT_CODES = {
    **dict.fromkeys(
        ("agent_failed", "unknown_reason", "approval_denied", "approval_timeout",
         "policy_violation", "deadline", "active_budget"),
        1,
    ),
    "invalid_request": 2,
    **dict.fromkeys(
        ("invalid_policy", "policy_type", "approval_policy_type", "capability", "decision_mode", "driver_config", "output_schema",
         "structured_unsupported"),
        3,
    ),
    **dict.fromkeys(
        ("thread_not_found", "thread_exists", "thread_incompatible", "resume_rejected",
         "checkpoint_missing"),
        4,
    ),
}


def test_every_case_has_the_exit_code_of_the_spec() -> None:
    assert SPEC_EXIT_CODES.keys() == CASES.keys()


@pytest.mark.parametrize("name", list(CASES))
def test_error_rebuilt_as_in_process(home: Home, tmp_path: Path, name: str) -> None:
    case = CASES[name]
    store = JSONLStore(tmp_path / "threads")
    for step in case.setup:
        assert isinstance(run_in_process(step, store), adaptor.Result)
        home.client.run(step, timeout=TIMEOUT)

    local = run_in_process(case.request, store)
    request_id = home.client.submit(case.request)
    with pytest.raises(BaseException) as info:
        home.client.wait(request_id, timeout=TIMEOUT)
    remote = info.value

    assert type(local) is case.expected and case.check(local)
    assert_same_error(remote, local)
    assert case.check(remote)
    verdict = home.client.verdict(request_id)
    assert verdict is not None and verdict["exit_code"] == errors.exit_code_for(local)
    assert verdict["exit_code"] == SPEC_EXIT_CODES[name]

    waited = home.cli("wait", request_id, "--json")
    assert waited.returncode == SPEC_EXIT_CODES[name], waited.stderr
    out = orjson.loads(waited.stdout)
    assert out["ok"] is False and out["exit_code"] == waited.returncode
    assert out["error"] == verdict["error"]
    assert type(local).__name__ in waited.stderr


def test_cancel_mid_run_is_run_cancelled(home: Home, tmp_path: Path) -> None:
    request = script({"text": "started"}, {"sleep": 30})

    def cancel_when_started(event: events.Event, stream: adaptor.Stream) -> None:
        if isinstance(event, events.TextDelta) and event.phase == "end":
            stream.cancel()

    local = run_in_process(request, JSONLStore(tmp_path / "threads"), cancel_when_started)
    request_id = home.client.submit(request)
    for event in home.client.events(request_id, follow=True):
        if isinstance(event, events.TextDelta) and event.phase == "end":
            cancelled = home.cli("cancel", request_id)
            assert cancelled.returncode == 0, cancelled.stderr
    with pytest.raises(errors.RunCancelledError) as info:
        home.client.wait(request_id, timeout=TIMEOUT)
    assert isinstance(local, errors.RunCancelledError)
    assert_same_error(info.value, local)
    assert isinstance(info.value.cause, errors.CancelledError)
    assert home.cli("wait", request_id).returncode == 1


def test_cancel_while_queued_is_cancelled_error(home: Home) -> None:
    # Requests of one thread run in arrival order: the second waits while the first sleeps.
    holder = home.client.submit(threaded("queued/cancel", {"text": "holding"}, {"sleep": 30}))
    for event in home.client.events(holder, follow=True):
        if isinstance(event, events.TextDelta) and event.phase == "end":
            break
    waiting = home.client.submit(threaded("queued/cancel", {"text": "never"}))
    wait_until(lambda: waiting in home.client.status()["queued"], "the second request to queue")
    assert home.client.cancel(waiting) is True
    with pytest.raises(errors.CancelledError) as info:
        home.client.wait(waiting, timeout=TIMEOUT)
    assert not isinstance(info.value, errors.RunError)
    assert list(home.client.events(waiting)) == []
    assert home.cli("wait", waiting).returncode == 70
    home.client.cancel(holder)
    with pytest.raises(errors.RunCancelledError):
        home.client.wait(holder, timeout=TIMEOUT)
    assert home.client.cancel(holder) is False  # already has its verdict


def _once_running(home: Home, interrupt: Callable[[], None]) -> tuple[list[str], threading.Thread]:
    """A started thread calling ``interrupt`` once a new request runs, and (then) its id."""
    running_before = set(home.client.status()["in_progress"])
    started: list[str] = []

    def interrupt_once_running() -> None:
        started.extend(
            wait_until(
                lambda: set(home.client.status()["in_progress"]) - running_before,
                "the request to start",
            )
        )
        interrupt()

    thread = threading.Thread(target=interrupt_once_running, daemon=True)
    thread.start()
    return started, thread


def test_ctrl_c_in_run_cancels_the_request(home: Home) -> None:
    # Client.run left the request running in the daemon, its id never returned to the caller;
    # Agent.run and `adaptor run` cancel theirs on Ctrl-C.
    started, interrupter = _once_running(home, _thread.interrupt_main)
    with pytest.raises(KeyboardInterrupt):
        home.client.run(script({"text": "started"}, {"sleep": 60}), timeout=TIMEOUT)
    interrupter.join()
    with pytest.raises(errors.RunCancelledError):
        home.client.wait(started[0], timeout=TIMEOUT)


def test_a_sigterm_handlers_exit_in_run_cancels_the_request(home: Home) -> None:
    # A service stopped by SIGTERM (its handler calls sys.exit, as most do) while Client.run
    # waited left the request running in the daemon, its id never returned to the caller:
    # only KeyboardInterrupt cancelled.  Agent.run cancels on whatever ends its wait.
    def exit_on_sigterm(signum: int, frame: object) -> None:
        sys.exit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        started, terminator = _once_running(home, lambda: os.kill(os.getpid(), signal.SIGTERM))
        with pytest.raises(SystemExit):
            home.client.run(script({"text": "started"}, {"sleep": 60}), timeout=TIMEOUT)
        terminator.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    with pytest.raises(errors.RunCancelledError):
        home.client.wait(started[0], timeout=TIMEOUT)
    # Its own deadline is no interruption: WaitTimeoutError names the request, which goes on.
    with pytest.raises(WaitTimeoutError) as info:
        home.client.run(script({"text": "slow"}, {"sleep": 1}), timeout=0)
    assert home.client.wait(info.value.request_id, timeout=TIMEOUT).text == "slow"


# --- waiting, unknown ids, missing spool ----------------------------------------------------------


def test_wait_timeout_is_not_an_outcome(home: Home) -> None:
    request_id = home.client.submit(script({"sleep": 30}))
    with pytest.raises(WaitTimeoutError) as info:
        home.client.wait(request_id, timeout=0.2)
    assert isinstance(info.value, TimeoutError) and not isinstance(info.value, errors.AdaptorError)
    assert info.value.request_id == request_id
    # A negative timeout looks once, as threading's waits do; it said "after -1s".
    with pytest.raises(WaitTimeoutError, match=r"after 0s") as info:
        home.client.wait(request_id, timeout=-1)
    assert info.value.timeout == 0
    home.client.cancel(request_id)
    with pytest.raises(errors.RunCancelledError):
        home.client.wait(request_id, timeout=TIMEOUT)


@pytest.mark.alone  # holds every inotify instance of this user
def test_waiting_polls_when_no_file_watcher_can_start(home: Home) -> None:
    with InotifyHog():  # an editor and its language servers took every inotify instance
        request_id = home.client.submit(script({"text": "polled"}))
        assert home.client.wait(request_id, timeout=TIMEOUT).text == "polled"
        followed = list(home.client.events(request_id, follow=True))
        assert any(isinstance(e, events.TextDelta) for e in followed)
        done = home.cli("run", "--driver", "script", "--config", 'steps=[{"text": "cli polled"}]', "go")
        assert (done.returncode, done.stdout) == (0, "cli polled\n"), done.stderr


def test_a_damaged_verdict_is_reported_with_its_file(home: Home) -> None:
    request_id = home.client.submit(script({"text": "hi"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    path = home.root / "verdicts" / f"{request_id}.json"
    path.write_bytes(path.read_bytes()[:25])  # as a failing disk or a stray editor leaves it
    with pytest.raises(ValueError, match=f"{re.escape(str(path))} is not valid JSON"):
        home.client.wait(request_id, timeout=TIMEOUT)
    done = home.cli("wait", request_id)
    assert done.returncode == 70 and f"{path} is not valid JSON" in done.stderr


def test_unknown_ids_and_missing_spools(home: Home, tmp_path: Path) -> None:
    for call in (
        lambda: home.client.wait("never-submitted", timeout=1),
        lambda: list(home.client.events("never-submitted")),
        lambda: home.client.cancel("never-submitted"),
        lambda: home.client.wait("../escape", timeout=1),
    ):
        with pytest.raises(UnknownRequestError):
            call()
    nowhere = Client(tmp_path / "nowhere")
    with pytest.raises(SpoolNotFoundError) as info:
        nowhere.submit(script({"text": "x"}))
    assert str(info.value).startswith(f"no adaptord spool under {tmp_path / 'nowhere'} (start")
    assert info.value.errno == errno.ENOENT and info.value.filename == str(tmp_path / "nowhere")
    with pytest.raises(SpoolNotFoundError):
        nowhere.wait("some-id")
    with pytest.raises(SpoolNotFoundError):  # it was [], as if nothing were pending
        nowhere.approvals()
    with pytest.raises(SpoolNotFoundError):  # it was None, as if no verdict yet
        nowhere.verdict("20261207T000000000000Z-abcdef")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(SpoolNotFoundError):  # it was a bare NotADirectoryError
        Client(a_file).verdict("20261207T000000000000Z-abcdef")
    assert nowhere.status()["running"] is False
    with pytest.raises(ValueError, match="an empty path would be the current one"):
        Client("")  # it was the current directory
    with pytest.raises(ValueError, match="nan"):
        home.client.wait("never-submitted", timeout=float("nan"))


def _waiters(client: Client, request_id: str) -> dict[str, BaseException | None]:
    """``wait`` and ``events(follow=True)`` on the request, each in a thread; what each raised."""
    outcome: dict[str, BaseException | None] = {}

    def watch(name: str, call: Callable[[], Any]) -> None:
        try:
            call()
            outcome[name] = None
        except BaseException as exc:
            outcome[name] = exc

    threads = [
        threading.Thread(target=watch, args=("wait", lambda: client.wait(request_id, TIMEOUT))),
        threading.Thread(
            target=watch, args=("events", lambda: list(client.events(request_id, follow=True)))
        ),
    ]
    for thread in threads:
        thread.daemon = True  # the old code followed forever
        thread.start()
    return outcome


def _settled(outcome: dict[str, BaseException | None]) -> dict[str, type | None]:
    wait_until(lambda: {"wait", "events"} <= outcome.keys(), "both waiters to return", TIMEOUT + 5)
    return {name: type(outcome[name]) for name in ("wait", "events")}


@pytest.mark.parametrize("removed", ["home", "request"])
def test_waiting_ends_when_nothing_can_write_the_verdict(tmp_path: Path, removed: str) -> None:
    # A home deleted (or a queued file removed) under a waiter: wait slept to its timeout and
    # blamed the run ("it may still be running"); with no timeout, and events(follow=True),
    # forever.
    daemonless = _home.Home.at(tmp_path / "home")  # its daemon stopped; the request queued
    daemonless.ensure()
    client = Client(daemonless.root)
    request_id = client.submit(script({"text": "never runs"}))
    outcome = _waiters(client, request_id)
    # Let both get into their loops; had they not, their first look raises the same (so no
    # timing is asserted), only the test would not cover the waiting itself.
    time.sleep(0.5)
    if removed == "home":
        # Moved away whole: an rm -rf in progress may take the request's file before the
        # spool folder, which ends the waits as UnknownRequestError, just as rightly.
        daemonless.root.rename(tmp_path / "gone")
        expected: type = SpoolNotFoundError
    else:
        (daemonless.spool_new / f"{request_id}.json").unlink()
        expected = UnknownRequestError
    assert _settled(outcome) == {"wait": expected, "events": expected}


def test_submit_refuses_what_is_no_json_object(tmp_path: Path) -> None:
    # A list of pairs was queued as if it were a dict, a str failed with dict()'s riddle, and
    # a NaN or infinity was written as null: "timeout": nan ran with no deadline at all (an
    # in-process run refuses that timeout with ValueError).
    daemonless = _home.Home.at(tmp_path / "home")
    daemonless.ensure()
    client = Client(daemonless.root)
    for request in ([("driver", "script"), ("prompt", "go")], '{"driver": "script"}', None):
        with pytest.raises(TypeError, match="a request is a mapping"):
            client.submit(request)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at /timeout is nan"):
        client.submit(script({"text": "x"}, timeout=float("nan")))
    with pytest.raises(ValueError, match="at /config/steps/0/sleep is inf"):
        client.submit(script({"sleep": float("inf")}))
    # orjson writes no integer past 64 bits: a bare TypeError named no place.
    with pytest.raises(ValueError, match=r"at /timeout is 1180591620717411303424, outside the integers"):
        client.submit(script({"text": "x"}, timeout=2**70))
    # Nor a lone surrogate: a bare "TypeError: str is not valid UTF-8" named no place.
    with pytest.raises(ValueError, match=r"^request value at /prompt is not valid UTF-8"):
        client.submit(script({"text": "x"}, prompt="a\ud800"))
    with pytest.raises(ValueError, match=r"^request value at /metadata/k\\udcfe is not valid UTF-8"):
        client.submit(script({"text": "x"}, metadata={"k\udcfe": "v"}))
    # A place is a JSON pointer: "/" and "~" in a key escaped (RFC 6901), as schema errors have it.
    with pytest.raises(ValueError, match=r"^request value at /metadata/a~1b~0c is 1180591620717411303424"):
        client.submit(script({"text": "x"}, metadata={"a/b~c": 2**70}))
    # Larger than a request file may be: spooled, it was set aside unread by the daemon.
    with pytest.raises(ValueError, match="larger than 1048576 bytes"):
        client.submit(script({"text": "x"}, prompt="y" * _home.MAX_REQUEST_BYTES))
    assert list(daemonless.spool_new.iterdir()) == []
    assert client.submit(script({"text": "x"}, model=None))  # null itself is fine
    too_large = tmp_path / "large.json"
    too_large.write_bytes(orjson.dumps(script({"text": "x"}, prompt="y" * _home.MAX_REQUEST_BYTES)))
    submitted = subprocess.run(
        ["adaptor", "submit", str(too_large), "--home", str(daemonless.root)],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert submitted.returncode == 2 and "larger than 1048576 bytes" in submitted.stderr, submitted.stderr
    assert len(list(daemonless.spool_new.iterdir())) == 1  # the small request above only


def test_wrong_argument_types_are_type_errors_whatever_the_files_hold(home: Home) -> None:
    # timeout="5" was taken while the verdict existed and failed a slow run's wait with
    # "'>' not supported"; a reason or option that is no str raised AttributeError.
    request_id = home.client.submit(script({"text": "x"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    for timeout in ("5", True):
        with pytest.raises(TypeError, match="timeout must be a number of seconds or None"):
            home.client.wait(request_id, timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="the reason must be a str, not int"):
        home.client.deny("some-approval", reason=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="the answer must be a str, not NoneType"):
        home.client.answer("some-approval", None)  # type: ignore[arg-type]


def test_the_daemons_own_session_name_is_no_request_id(home: Home) -> None:
    # "adaptord" (docs: reserved) was accepted at submit; the daemon then quarantined the file
    # without a verdict, and `adaptor run --id adaptord` waited forever.
    request = {**script({"text": "x"}), "id": "adaptord"}
    with pytest.raises(ValueError, match="invalid request id"):
        home.client.submit(request)
    with pytest.raises(UnknownRequestError):
        home.client.wait("adaptord", timeout=1)
    submitted = home.cli("submit", "-", input=orjson.dumps(request).decode())
    assert submitted.returncode == 2 and "not be 'adaptord'" in submitted.stderr
    ran = home.cli("run", "--id", "adaptord", "x", timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert not (home.root / "spool" / "new" / "adaptord.json").exists()
    # In any letter case: on a case-insensitive filesystem events/ADAPTORD.jsonl is the
    # daemon's own log.
    for taken in ("ADAPTORD", "Adaptord-x"):
        with pytest.raises(ValueError, match="invalid request id"):
            home.client.submit({**request, "id": taken})


def test_an_id_ending_in_a_newline_is_no_request_id(home: Home) -> None:
    # Python's "$" also matches before a final newline, so "job-1\n" passed for an id (the
    # schema's pattern, read as JSON Schema reads it, refuses it): it was queued as
    # "spool/new/job-1\n.json", ran, and its verdict was "verdicts/job-1\n.json".  A script's
    # `id=$(adaptor submit ...)` drops that newline, so `adaptor wait "$id"` said "no request"
    # (exit 2) for a request that had run; and the id split the daemon's stderr lines in two.
    request = {**script({"text": "x"}), "id": "job-1\n"}
    with pytest.raises(ValueError, match="invalid request id"):
        home.client.submit(request)
    submitted = home.cli("submit", "-", input=orjson.dumps(request).decode())
    assert submitted.returncode == 2, submitted.stderr
    for rid in ("job-1\n", "abc\n"):
        with pytest.raises(UnknownRequestError):
            home.client.verdict(rid)  # it returned None, as for a request still queued
        with pytest.raises(UnknownRequestError):
            home.client.wait(rid, timeout=1)
        with pytest.raises(UnknownRequestError):
            home.client.cancel(rid)
    with pytest.raises(ValueError, match="invalid request id"):
        _home.request_cancel(_home.Home.at(home.root), "job-1\n")
    # Dropped by hand: set aside, as any name that carries no id; it never runs.
    home.daemon.drop("job-2\n.json", orjson.dumps({**script({"text": "x"}), "id": "job-2\n"}))
    _handled(home)
    assert not [name for name in os.listdir(home.root / "spool" / "new") if "\n" in name]
    assert any(q.endswith("-job-2\n.json") for q in os.listdir(home.root / "quarantine"))
    assert not [name for name in os.listdir(home.root / "verdicts") if "\n" in name]
    assert not [name for name in os.listdir(home.root / "runs") if "\n" in name]


def test_a_quarantined_name_that_ends_like_an_id_is_not_that_request(home: Home, tmp_path: Path) -> None:
    # "team-a-42.json" was taken for request 42's quarantined file: wait hung forever (exit 124
    # with --timeout) and cancel said "requested", for an id nobody submitted.
    target = tmp_path / "t.json"
    target.write_text("{}")
    for name in ("team-a-42.json", "-evil-zzz.json"):
        os.symlink(target, home.root / "spool" / "new" / name)
    deadline = time.monotonic() + 30
    while any((home.root / "spool" / "new").iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    quarantined = [p.name for p in (home.root / "quarantine").iterdir()]
    assert any(n.endswith("-team-a-42.json") for n in quarantined), quarantined
    for rid in ("42", "zzz", "a-42"):
        with pytest.raises(UnknownRequestError):
            home.client.wait(rid, timeout=1)
        with pytest.raises(UnknownRequestError):
            home.client.cancel(rid)
    assert home.cli("wait", "42", "--timeout", "1").returncode == 2


def test_a_duplicate_quarantined_beside_a_finished_request_does_not_keep_it_known(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second X.json for a finished X is quarantined (id_in_use) and never gets a verdict.
    # Once X's verdict and files were removed (by hand, or by retention), the quarantined
    # file still made X "known": `adaptor wait X` waited for ever (124 with --timeout),
    # `cancel` said "requested", where the docs say "no request 'X'" (exit 2).
    rid = home.client.submit(script({"text": "once"}))
    assert home.client.wait(rid, timeout=TIMEOUT).text == "once"
    home.daemon.drop(f"{rid}.json", orjson.dumps({**script({"text": "twice"}), "id": rid}))
    _handled(home)
    assert any(name.endswith(f"-{rid}.json") for name in os.listdir(home.root / "quarantine"))
    (home.root / "verdicts" / f"{rid}.json").unlink()
    shutil.rmtree(home.root / "runs" / rid)
    # The entry is as old as any the daemon is done with (its rejection verdict, when it
    # gets one, follows the move at once).
    monkeypatch.setattr(spool, "_QUARANTINE_IN_FLIGHT", 0.0)
    with pytest.raises(UnknownRequestError):
        home.client.wait(rid, timeout=3)
    with pytest.raises(UnknownRequestError):
        home.client.cancel(rid)


def _handled(home: Home) -> None:
    """Return once the daemon has handled every spool entry dropped so far: a probe dropped
    after them is claimed after them, each entry's verdict (if any) written before."""
    assert home.client.wait(home.client.submit(script({"text": "probe"})), timeout=TIMEOUT).text == "probe"


def _verdict_names(home: Home) -> set[str]:
    """The verdicts in ``verdicts/``: not the temporary name a verdict just linked into place
    may still have for a moment (seen in CI)."""
    return {name for name in os.listdir(home.root / "verdicts") if not name.startswith(".")}


def test_a_misnamed_spool_file_gets_a_verdict_under_the_id_its_name_carries(home: Home) -> None:
    # "abc3" and "abc2.JSON" were quarantined without a verdict: `adaptor wait abc3` said
    # "no request 'abc3'" (exit 2), and nothing told their writer what was wrong.
    body = orjson.dumps(script({"text": "never runs"}))
    verdicts_before = _verdict_names(home)
    for name in ("abc3", "abc2.JSON", ".hidden", "a b"):
        home.daemon.drop(name, body)
    for rid, name in (("abc3", "abc3"), ("abc2", "abc2.JSON")):
        waited = home.cli("wait", rid, "--timeout", "30")
        assert waited.returncode == 2, waited.stderr
        assert f"the file name must be {rid}.json, not {name}" in waited.stderr
        with pytest.raises(InvalidRequestError) as caught:
            home.client.wait(rid, timeout=TIMEOUT)
        moved = re.search(r"moved to quarantine/(\S+)$", caught.value.errors[0]["message"])
        assert moved is not None and moved[1].endswith(f"-{name}"), caught.value.errors
        assert (home.root / "quarantine" / moved[1]).read_bytes() == body  # kept as it came
        verdict = home.client.verdict(rid)
        assert verdict is not None and verdict["run_id"] is None and verdict["exit_code"] == 2
    _handled(home)
    # No usable id in the name: set aside, and nothing else.
    quarantined = os.listdir(home.root / "quarantine")
    assert all(any(q.endswith(f"-{name}") for q in quarantined) for name in (".hidden", "a b"))
    added = _verdict_names(home) - verdicts_before
    assert {"abc3.json", "abc2.json"} <= added and len(added) == 3  # and the probe's
    # The id is taken now, as by any verdict: a proper file with it is a duplicate.
    written = (home.root / "verdicts" / "abc3.json").read_bytes()
    with pytest.raises(FileExistsError):
        home.client.submit({**script({"text": "x"}), "id": "abc3"})
    home.daemon.drop("abc3.json", body)
    _handled(home)
    assert (home.root / "verdicts" / "abc3.json").read_bytes() == written
    assert any(q.endswith("-abc3.json") for q in os.listdir(home.root / "quarantine"))


def test_an_id_whose_request_is_running_is_taken(home: Home) -> None:
    # Once the daemon had claimed a request its spool name was free again: a second request
    # with the id was "submitted" (exit 0), then set aside unread, and its caller's wait got
    # the first request's verdict as its own.
    first = home.client.submit({**script({"sleep": 60}, {"text": "first"}), "id": "dup-running"})
    state = home.root / "runs" / first / "state.json"
    wait_until(lambda: state.exists(), "the first request to be claimed")
    quarantined = set(os.listdir(home.root / "quarantine"))
    with pytest.raises(FileExistsError, match="already submitted"):
        home.client.submit({**script({"text": "second"}), "id": "dup-running"})
    again = home.cli("submit", input=orjson.dumps({**script({"text": "x"}), "id": first}).decode())
    assert again.returncode == 2 and "already submitted" in again.stderr, again.stderr
    assert not (home.root / "spool" / "new" / f"{first}.json").exists()
    assert home.client.cancel(first)
    with pytest.raises(adaptor.RunCancelledError):
        home.client.wait(first, timeout=TIMEOUT)
    assert set(os.listdir(home.root / "quarantine")) == quarantined  # nothing set aside


def test_a_submitter_whose_id_was_claimed_as_it_linked_takes_its_request_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other request is claimed between the check and the link: the link succeeds (the
    # spool name was free), and only the check after it can tell.
    root = tmp_path / "home"
    for folder in ("spool/tmp", "spool/new", "claimed", "verdicts"):
        (root / folder).mkdir(parents=True)
    (root / "claimed" / "raced.json").write_bytes(b"{}")  # the other request, claimed
    real = _home._taken
    checks: list[int | None] = []

    def taken_after_the_link(home: _home.Home, request_id: str, ours: int | None) -> bool:
        checks.append(ours)
        return False if ours is None else real(home, request_id, ours)

    monkeypatch.setattr(_home, "_taken", taken_after_the_link)
    with pytest.raises(FileExistsError, match="already submitted"):
        _home.submit(_home.Home(root), {**script({"text": "x"}), "id": "raced"})
    assert len(checks) == 2 and os.listdir(root / "spool" / "new") == []
    assert os.listdir(root / "spool" / "tmp") == []


@pytest.mark.parametrize("daemon_did", ["nothing yet", "claimed it"])
def test_a_ctrl_c_as_submit_ends_takes_the_request_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemon_did: str
) -> None:
    # A Ctrl-C (or a SIGTERM handler's exit) in the last steps of submit, once the file was
    # linked into the spool: submit raised, its caller (Client.run, `adaptor run`) never
    # learnt the id, and the request ran to completion though `adaptor run` said it stopped.
    root = tmp_path / "home"
    for folder in ("spool/tmp", "spool/new", "claimed", "verdicts", "quarantine", "control/cancel"):
        (root / folder).mkdir(parents=True)
    real_fsync_dir = _durable.fsync_dir

    def interrupted_while_syncing(path: Any) -> None:
        if Path(path) == root / "spool" / "new":
            if daemon_did == "claimed it":  # as the daemon claims: link, the spool name kept
                os.link(root / "spool" / "new" / "mine.json", root / "claimed" / "mine.json")
            signal.raise_signal(signal.SIGINT)
        real_fsync_dir(path)

    monkeypatch.setattr(_durable, "fsync_dir", interrupted_while_syncing)
    with pytest.raises(KeyboardInterrupt):
        _home.submit(_home.Home(root), {**script({"text": "x"}), "id": "mine"})
    assert os.listdir(root / "spool" / "new") == [] and os.listdir(root / "spool" / "tmp") == []
    assert os.listdir(root / "control" / "cancel") == (["mine"] if daemon_did == "claimed it" else [])


@pytest.mark.parametrize("daemon_does", ["answers it", "sets it aside"])
def test_a_submitter_tells_its_own_request_answered_at_once_from_a_duplicate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemon_does: str
) -> None:
    # The daemon claims the linked file and refuses it (a bad driver) before the check after
    # the link: the verdict, the request's own, was taken for another request's, and submit
    # raised "already submitted" for a request it had queued (1 in 30 under load).
    root = tmp_path / "home"
    for folder in ("spool/tmp", "spool/new", "claimed", "verdicts", "quarantine"):
        (root / folder).mkdir(parents=True)
    real_link = os.link

    def link_then_the_daemon(source: Any, target: Any, **kwargs: Any) -> None:
        real_link(source, target, **kwargs)
        queued = root / "spool" / "new" / "quick.json"
        if daemon_does == "answers it":
            real_link(queued, root / "claimed" / "quick.json")
            os.unlink(queued)
            (root / "verdicts" / "quick.json").write_bytes(b"{}")
            os.unlink(root / "claimed" / "quick.json")
        else:  # an answered request with this id came first: this one is its duplicate
            (root / "verdicts" / "quick.json").write_bytes(b"{}")
            os.rename(queued, root / "quarantine" / f"{time.time_ns()}-quick.json")

    monkeypatch.setattr(os, "link", link_then_the_daemon)
    if daemon_does == "answers it":
        assert _home.submit(_home.Home(root), {**script({"text": "x"}), "id": "quick"}) == "quick"
    else:
        with pytest.raises(FileExistsError, match="already submitted"):
            _home.submit(_home.Home(root), {**script({"text": "x"}), "id": "quick"})


def test_a_spool_entry_never_gets_a_verdict_for_another_requests_id(home: Home, tmp_path: Path) -> None:
    # A symlink "<id>.json" dropped while request <id> ran got a rejection verdict under that
    # id: the run's own verdict was then never written, and its claimed copy was removed.
    running = home.client.submit(
        script(QUESTION, {"text": "answered"}, policy={"approvals": {"question": "ask", "timeout": 60}})
    )
    pending = pending_approval(home, running)
    finished = home.client.submit(script({"text": "finished"}))
    home.client.wait(finished, timeout=TIMEOUT)
    finished_verdict = (home.root / "verdicts" / f"{finished}.json").read_bytes()
    target = tmp_path / "elsewhere.json"
    target.write_bytes(orjson.dumps(script({"text": "stray"})))
    for rid in (running, finished):
        home.daemon.drop(rid, b"{}")
        home.daemon.drop(f"{rid}.JSON", b"{}")
        os.symlink(target, home.root / "spool" / "new" / f"{rid}.json")
    _handled(home)
    assert home.client.verdict(running) is None  # still running, its verdict still to come
    home.client.answer(pending["id"], "red")
    assert home.client.wait(running, timeout=TIMEOUT).text == "answered"
    assert (home.root / "verdicts" / f"{finished}.json").read_bytes() == finished_verdict
    quarantined = os.listdir(home.root / "quarantine")
    for rid in (running, finished):
        for name in (rid, f"{rid}.JSON", f"{rid}.json"):
            assert any(q.endswith(f"-{name}") for q in quarantined), name


def test_a_misnamed_file_leaves_its_id_to_a_request_waiting_in_the_spool(tmp_path: Path) -> None:
    # "twice" (misnamed) came before "twice.json" while no daemon ran: its verdict would have
    # taken the id, and the proper request behind it would have been refused as a duplicate.
    daemon = DaemonProcess(tmp_path / "home")
    daemon.home.ensure()
    daemon.drop("twice.json", orjson.dumps(script({"text": "ran"})))
    daemon.drop("twice", b"{}")
    new = daemon.home.spool_new
    # Arrival order is ctime order, then mtime: "twice" is the older of the two.
    os.utime(new / "twice", ns=(1, 1))
    os.utime(new / "twice.json", ns=(2**62, 2**62))
    daemon.start()
    verdict = daemon.verdict("twice")
    assert daemon.stop() == 0
    assert verdict["ok"] and verdict["result"]["text"] == "ran", verdict
    assert any(q.name.endswith("-twice") for q in daemon.home.quarantine.iterdir())


def test_probes_never_take_each_other_for_a_daemon(tmp_path: Path) -> None:
    # Each probe took the daemon's exclusive lock for an instant: Client.status() in three
    # threads said running for about a fifth of the calls with no daemon at all.
    home = _home.Home.at(tmp_path / "home")
    home.ensure()
    home.daemon_lock.touch(mode=0o600)
    said: list[bool] = []

    def probe() -> None:
        said.extend(_home.daemon_running(home) for _ in range(400))

    threads = [threading.Thread(target=probe) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert said.count(True) == 0 and len(said) == 1200
    # The daemon's own hold (an exclusive flock, from another process) is seen.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
         "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()", str(home.daemon_lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert _home.daemon_running(home)
    finally:
        holder.communicate("", timeout=30)
    assert not _home.daemon_running(home)


def test_status(home: Home) -> None:
    request_id = home.client.submit(script({"text": "x"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    status = home.client.status()
    assert status["running"] is True and status["pid"] == home.daemon.proc.pid  # type: ignore[union-attr]
    mine = [v for v in status["recent"] if v["id"] == request_id]
    assert mine == [
        {
            "id": request_id,
            "ok": True,
            "exit_code": 0,
            "code": None,
            "finished_at": mine[0]["finished_at"],
        }
    ]


# --- approvals ------------------------------------------------------------------------------------


def test_approvals_through_the_client(home: Home) -> None:
    request_id = home.client.submit(
        script(
            QUESTION, {"text": "answered"}, policy={"approvals": {"question": "ask", "timeout": 60}}
        )
    )
    pending = pending_approval(home, request_id)
    assert pending["approval_kind"] == "question" and [c["key"] for c in pending["choices"]] == [
        "red",
        "blue",
    ]
    with pytest.raises(errors.ApprovalKindMismatchError):
        home.client.approve(pending["id"])
    home.client.answer(pending["id"], "red")
    with pytest.raises(errors.ApprovalResolvedError):
        home.client.deny(pending["id"])
    assert home.client.wait(request_id, timeout=TIMEOUT).text == "answered"
    with pytest.raises(errors.ApprovalUnavailableError):
        home.client.approve("no-such-approval")


def test_an_approval_whose_response_is_being_handed_over_is_not_listed(home: Home) -> None:
    # approve() returned False (the daemon did not take the response within 10 s: stopped,
    # starved), and approvals() still listed the request, which any other response could
    # only lose ("a response is being handed over").
    request_id = home.client.submit(script(PERMISSION, {"text": "approved"}, policy={"approvals": {"timeout": 60}}))
    approval_id = pending_approval(home, request_id)["id"]
    daemon = home.daemon.proc
    assert daemon is not None
    daemon.send_signal(signal.SIGSTOP)  # a daemon that does not get to it
    try:
        response = home.root / "approvals" / "responses" / f"{approval_id}.json"
        response.with_name(f".{approval_id}.tmp").write_text('{"action": "approve"}')
        response.with_name(f".{approval_id}.tmp").rename(response)  # as docs/daemon.md writes one
        assert [p["id"] for p in home.client.approvals()] == []
        with pytest.raises(errors.ApprovalResolvedError):
            home.client.deny(approval_id)
    finally:
        daemon.send_signal(signal.SIGCONT)
    assert home.client.wait(request_id, timeout=TIMEOUT).text == "approved"


def test_a_responder_after_a_response_the_run_never_took_is_told_it_expired(home: Home) -> None:
    # A response was written, then the run ended before the daemon handed it over (cancelled,
    # the daemon stopping): nobody won, yet every later responder was told "already resolved".
    request_id = home.client.submit(script(PERMISSION, {"text": "never"}, policy={"approvals": {"timeout": 60}}))
    approval_id = pending_approval(home, request_id)["id"]
    daemon = home.daemon
    assert daemon is not None and daemon.proc is not None
    daemon.stop_off_the_approvals_lock()  # so that it hands nothing over meanwhile
    told: list[BaseException] = []
    try:
        response = home.root / "approvals" / "responses" / f"{approval_id}.json"
        response.with_name(f".{approval_id}.tmp").write_text('{"action": "approve"}')
        response.with_name(f".{approval_id}.tmp").rename(response)
        later = threading.Thread(target=lambda: told.append(_raised(lambda: home.client.deny(approval_id))))
        later.start()
        time.sleep(0.5)
        # What the daemon does once the run that asked has ended, the response not handed over.
        _home.abandon(_home.Home.at(home.root), approval_id, "the run ended")
        later.join(timeout=30)
    finally:
        daemon.proc.send_signal(signal.SIGCONT)
    assert [type(error) for error in told] == [errors.ApprovalExpiredError], told
    assert str(told[0]) == f"approval {approval_id!r} expired before this response: the run ended"
    home.client.cancel(request_id)
    with pytest.raises(errors.RunError):
        home.client.wait(request_id, timeout=TIMEOUT)


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except BaseException as exc:
        return exc
    raise AssertionError("it raised nothing")


def test_denied_through_the_client(home: Home) -> None:
    request_id = home.client.submit(
        script(PERMISSION, {"text": "never"}, policy={"approvals": {"timeout": 60}})
    )
    home.client.deny(pending_approval(home, request_id)["id"], reason="not on main")
    with pytest.raises(errors.ApprovalDeniedError) as info:
        home.client.wait(request_id, timeout=TIMEOUT)
    assert info.value.result is not None


def test_a_submit_the_disk_refuses_leaves_nothing_in_the_way_of_a_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home.Home.at(tmp_path / "home")
    home.ensure()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "injected full disk")

    monkeypatch.setattr(os, "fsync", full)
    request = {**script({"text": "x"}), "id": "retry-1"}
    with pytest.raises(OSError, match="injected full disk"):
        _home.submit(home, request)
    monkeypatch.undo()
    assert list(home.spool_tmp.iterdir()) == [] and list(home.spool_new.iterdir()) == []
    assert _home.submit(home, request) == "retry-1"  # not "already queued"
    assert [p.name for p in home.spool_new.iterdir()] == ["retry-1.json"]


# --- following a log that is replaced ----------------------------------------------------------


def _recorded(directory: Path, texts: list[str]) -> None:
    with sr.EventRecorder(sr.JSONLEventBackend(directory)) as recorder:
        for text in texts:
            recorder.record("followed", events.TextDelta(text=text))


def test_a_follower_reads_a_new_log_whole_and_a_restored_copy_not_again(tmp_path: Path) -> None:
    # A log rotated (or deleted) while followed began again at host_seq 1 in a new file, and
    # the follower skipped every record up to the last one it had printed: they were lost.
    from adaptor.spool import _LogReader

    path = tmp_path / "followed.jsonl"
    _recorded(tmp_path, ["a", "b", "c"])
    reader = _LogReader(path)

    def texts() -> list[str]:
        return [getattr(r.event, "text", "") for r in reader.read()]

    assert texts() == ["a", "b", "c"]
    copy = path.read_bytes()
    path.unlink()  # a restored copy of the same history: nothing is read twice
    path.write_bytes(copy)
    assert texts() == []
    os.rename(path, tmp_path / "rotated.jsonl")
    (tmp_path / "followed.jsonl.lock").unlink()
    _recorded(tmp_path, ["new 1", "new 2"])
    assert texts() == ["new 1", "new 2"]
    _recorded(tmp_path, ["new 3", "new 4"])
    assert texts() == ["new 3", "new 4"]
    reader.close()


@pytest.mark.parametrize("how", ["rotated", "rotated, new one begun", "removed"])
def test_a_follower_reads_a_rotated_log_to_its_end_before_the_new_one(tmp_path: Path, how: str) -> None:
    # What was appended to the old file after the follower's last read was skipped once the
    # name led to a new file (tail -F reads the old one to its end first): a monitor of the
    # daemon's lifecycle log lost facts at every rotation.
    from adaptor.spool import _LogReader

    path = tmp_path / "followed.jsonl"
    _recorded(tmp_path, ["a", "b"])
    reader = _LogReader(path)

    def texts() -> list[str]:
        return [getattr(r.event, "text", "") for r in reader.read()]

    assert texts() == ["a", "b"]
    _recorded(tmp_path, ["c", "d"])  # not read yet when the log moves on
    if how.startswith("rotated"):
        os.rename(path, tmp_path / "rotated.jsonl")
    else:
        path.unlink()
    (tmp_path / "followed.jsonl.lock").unlink()
    if how == "rotated, new one begun":
        _recorded(tmp_path, ["new 1"])
        assert texts() == ["c", "d", "new 1"]  # the old file to its end, then the new one
    else:
        assert texts() == ["c", "d"]  # still open: read to its end
        _recorded(tmp_path, ["new 1"])
        assert texts() == ["new 1"]
    reader.close()


def test_a_fifo_at_a_verdict_path_is_no_verdict_and_never_waited_on(tmp_path: Path) -> None:
    # Verdicts were opened without O_NONBLOCK: a FIFO at verdicts/<id>.json made `adaptor wait`
    # (and every client call reading that verdict) wait in open() forever for a writer.  Like
    # a symbolic link there, it is no verdict: with no daemon to write one, the wait ends 69.
    root = tmp_path / "home"
    for folder in ("spool/new", "spool/tmp", "verdicts"):
        (root / folder).mkdir(parents=True)
    fifo = root / "verdicts" / "req-1.json"
    os.mkfifo(fifo)
    proc = subprocess.run(
        ["adaptor", "wait", "req-1", "--home", str(root)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 69, proc.stderr[-2000:]
    assert "adaptord is not running" in proc.stderr
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # left as it was


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_fifo_at_a_cancel_markers_name_asks_for_the_cancel_without_waiting(tmp_path: Path, kind: str) -> None:
    # The cancel marker was opened for writing without O_NONBLOCK: a FIFO at
    # control/cancel/<id> made `adaptor cancel` (and a Ctrl-C'd `adaptor run`) wait for a
    # reader forever; a symlink there made it fail with ELOOP.  The daemon goes by the name, so
    # either already asks for the cancel (and the link's target is never written).
    root = tmp_path / "home"
    for folder in ("spool/new", "spool/tmp", "verdicts", "control/cancel"):
        (root / folder).mkdir(parents=True)
    (root / "spool" / "new" / "req-1.json").write_text("{}")  # queued: a known request
    marker = root / "control" / "cancel" / "req-1"
    if kind == "fifo":
        os.mkfifo(marker)
    else:
        marker.symlink_to(tmp_path / "victim")
    proc = subprocess.run(
        ["adaptor", "cancel", "req-1", "--home", str(root)], capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cancel requested for req-1" in proc.stderr
    assert not (tmp_path / "victim").exists()


def test_the_command_a_message_suggests_can_be_pasted_for_any_home(tmp_path: Path) -> None:
    # `adaptord serve --home /x/no such home` broke at the spaces when pasted.
    home = tmp_path / "no such home"
    for error in (SpoolNotFoundError(home), DaemonNotRunningError(home)):
        command = str(error).split("`")[1]
        assert shlex.split(command) == ["adaptord", "serve", "--home", str(home)], str(error)


@pytest.mark.parametrize(
    "damage",
    [{"result": {"text": 5}}, {"exit_code": "x"}, {"ok": "yes"}, {"error": {"code": None}}, {"ok": True, "error": {"code": "ErrX"}}],
    ids=["text-not-text", "exit-code-not-int", "ok-not-bool", "error-without-code", "ok-beside-an-error"],
)
def test_a_damaged_verdict_is_refused_alike_with_and_without_json(home: Home, damage: dict[str, Any]) -> None:
    # A verdict edited by hand ("text": 5): `wait` failed with an AttributeError from deep
    # inside (exit 70) while `wait --json` said ok (exit 0), and status listed it.
    request_id = home.client.submit(script({"text": "hi"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    path = home.root / "verdicts" / f"{request_id}.json"
    path.write_bytes(orjson.dumps({**orjson.loads(path.read_bytes()), **damage}))
    said = f"{path} is damaged: "
    with pytest.raises(ValueError, match=re.escape(said)):
        home.client.wait(request_id, timeout=TIMEOUT)
    for extra in ([], ["--json"]):
        done = home.cli("wait", request_id, *extra)
        assert done.returncode == 70 and said in done.stdout + done.stderr, (extra, done.stdout, done.stderr)
    assert request_id not in [v["id"] for v in home.client.status()["recent"]]


def test_a_verdict_of_another_format_is_refused_not_misread(home: Home) -> None:
    # A verdict of a format this version does not write (a newer daemon's) was read as if it
    # were its own: `wait` exited 0 with whatever its fields meant there.
    request_id = home.client.submit(script({"text": "hi"}))
    home.client.wait(request_id, timeout=TIMEOUT)
    path = home.root / "verdicts" / f"{request_id}.json"
    path.write_bytes(orjson.dumps({**orjson.loads(path.read_bytes()), "format": "adaptord.verdict/2"}))
    said = f"{path} is of format 'adaptord.verdict/2', not 'adaptord.verdict/1'"
    with pytest.raises(ValueError, match=re.escape(said)):
        home.client.wait(request_id, timeout=TIMEOUT)
    done = home.cli("wait", request_id, "--json")
    assert done.returncode == 70 and said in orjson.loads(done.stdout)["error"]["message"], done.stdout
    assert orjson.loads(done.stdout)["error"]["type"] == "ValueError"
    # Nor is it listed among the recent verdicts as if it were this version's (it said ok).
    assert request_id not in [v["id"] for v in home.client.status()["recent"]]
    # Named by its file, not by the id inside it (which another format need not even have).
    path.write_bytes(orjson.dumps({"format": "adaptord.verdict/2", "id": "someone-else"}))
    with pytest.raises(ValueError, match=re.escape(said)):
        home.client.wait(request_id, timeout=TIMEOUT)
    path.write_bytes(orjson.dumps({"id": request_id, "ok": True}))
    with pytest.raises(ValueError, match=re.escape(f"{path} has no format")):
        home.client.wait(request_id, timeout=TIMEOUT)


def test_the_clients_own_errors_pickle_and_copy_as_they_are(tmp_path: Path) -> None:
    # A ProcessPoolExecutor worker's wait that timed out broke the pool (BrokenProcessPool):
    # WaitTimeoutError, UnknownRequestError and SpoolNotFoundError did not unpickle (their
    # __init__ was called with the message), and DaemonNotRunningError's message doubled.
    import copy
    import pickle

    home = tmp_path / "home"
    refused = PermissionError(errno.EACCES, "Permission denied", str(home / "spool" / "new"))
    for error in (WaitTimeoutError("r1", 0.5), UnknownRequestError("r2", home), SpoolNotFoundError(home),
                  DaemonNotRunningError(home), ForeignHomeError(home, 4321, refused),
                  spool.UnservableHomeError(home, errno.EPERM, "no hard links")):
        for copied in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
            assert type(copied) is type(error) and str(copied) == str(error)
            assert vars(copied) == vars(error) and copied.args == error.args
    again = pickle.loads(pickle.dumps(SpoolNotFoundError(home)))
    assert (again.errno, again.filename) == (errno.ENOENT, str(home))
    timed_out = pickle.loads(pickle.dumps(WaitTimeoutError("r1", 0.5)))
    assert (timed_out.request_id, timed_out.timeout) == ("r1", 0.5)


def test_a_submit_whose_spool_cannot_be_synced_queues_nothing(tmp_path: Path) -> None:
    # spool/new writable but not readable by the submitter (mode 0300): the request was linked
    # into place, then the folder's sync failed, and `adaptor submit` exited 70 ("nothing was
    # queued") while the request was queued and ran.
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (root without the capabilities that pass over modes)")
    home = _home.Home.at(tmp_path / "home")
    home.ensure()
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps({**script({"text": "x"}), "id": "unsynced"}))
    home.spool_new.chmod(0o300)
    try:
        submitted = subprocess.run(
            ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--",
             sys.executable, "-m", "adaptor", "submit", str(request)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "ADAPTORD_HOME": str(home.root)},
        )
    finally:
        home.spool_new.chmod(0o700)
    assert submitted.returncode == 70, submitted
    assert "Permission denied" in submitted.stderr
    assert list(home.spool_new.iterdir()) == [] and list(home.spool_tmp.iterdir()) == []


_ANOTHER_USER = 4321


def _home_of_another_user(root: Path, *, mode: int | None) -> _home.Home:
    """A home at ``root`` (its folders given ``mode``, unless None) that uid :data:`_ANOTHER_USER`
    owns, for :func:`_without_file_mode_powers` to be another user to."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (root without the capabilities that pass over modes)")
    home = _home.Home.at(root)
    home.ensure()
    for path in [home.root, *home.root.rglob("*")]:
        if mode is not None:
            os.chmod(path, mode)
        os.lchown(path, _ANOTHER_USER, _ANOTHER_USER)
    os.chmod(root.parent, 0o755)
    return home


def _without_file_mode_powers(home: _home.Home, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run for ``home`` as root without the capabilities that pass over file modes: for
    a home another uid owns, an ordinary other user."""
    return subprocess.run(
        ["setpriv", "--bounding-set", "-dac_override,-dac_read_search,-fowner", "--", *argv],
        capture_output=True, text=True, timeout=60, env={**os.environ, "ADAPTORD_HOME": str(home.root)},
    )


def test_another_users_home_is_named_as_such_not_taken_for_a_stopped_daemon(tmp_path: Path) -> None:
    # A user pointing ADAPTORD_HOME at another user's home (mode 0700) was told "adaptord not
    # running" (its lock could not be read, which was taken for nobody holding it) and got a
    # bare PermissionError, exit 70, from every other command.  Root without the capabilities
    # that pass over file modes is, for a home another uid owns, such a user.
    home = _home_of_another_user(tmp_path / "home", mode=None)
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(script({"text": "x"})))

    def as_another_user(*argv: str) -> subprocess.CompletedProcess[str]:
        return _without_file_mode_powers(home, sys.executable, *argv)

    said = f"{home.root} is another user's adaptord home (uid {_ANOTHER_USER}), which this user (uid 0) may not use"
    for command in (["adaptord", "status"], ["adaptor", "status"], ["adaptor", "submit", str(request)],
                    ["adaptor", "wait", "some-id"], ["adaptor", "threads"], ["adaptor", "approvals"]):
        shown = as_another_user("-m", *command)
        assert shown.returncode == 69, (command, shown)
        assert shown.stderr.startswith(f"{command[0]}: {said} (Permission denied: {home.root}/"), (command, shown.stderr)
        assert shown.stderr.rstrip().endswith("run as that user, or use a home of your own")
        assert "not running" not in shown.stdout + shown.stderr
    shown = as_another_user("-m", "adaptord", "status", "--json")
    assert shown.returncode == 69 and orjson.loads(shown.stdout)["running"] is None
    # The client says the same, as the PermissionError it is.
    client = "import sys; from adaptor.spool import Client; Client().submit({'driver': 'script', 'prompt': 'x'})"
    shown = as_another_user("-c", client)
    assert f"adaptor.spool.ForeignHomeError: {said}" in shown.stderr


def test_a_home_another_user_made_for_others_gets_no_request(tmp_path: Path) -> None:
    # Another user made a home in a shared place, its folders open to all (mode 0777), for
    # others to name with ADAPTORD_HOME: every request submitted there, secrets and all, was
    # theirs to read.  The daemon refuses to serve such a home; the client now refuses to feed
    # it, unless it is root (whose `sudo adaptor submit` hands a user's daemon a request).
    home = _home_of_another_user(tmp_path / "squatted", mode=0o777)
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps({**script({"text": "x"}), "config": {"env": {"TOKEN": "s3cr3t"}}}))
    refused = _without_file_mode_powers(home, sys.executable, "-m", "adaptor", "submit", str(request))
    assert refused.returncode == 69, refused
    assert refused.stderr.startswith(
        f"adaptor: {home.root} is another user's adaptord home (uid {_ANOTHER_USER}), which this user (uid 0) "
        f"may not use (not this user's, and its owner reads every request, secrets and all: {home.spool_new})"
    ), refused.stderr
    assert list(home.spool_new.iterdir()) == [] and list(home.spool_tmp.iterdir()) == []
    # Root may.
    submitted = subprocess.run(
        [sys.executable, "-m", "adaptor", "submit", str(request)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "ADAPTORD_HOME": str(home.root)},
    )
    assert submitted.returncode == 0, submitted
    assert [path.name for path in home.spool_new.iterdir()] == [submitted.stdout.strip() + ".json"]


def test_a_home_without_hard_links_queues_nothing_and_says_why(tmp_path: Path) -> None:
    # A home's layout on exFAT (made by hand, or copied there; `adaptord serve` refuses it):
    # `adaptor submit` was a bare PermissionError on the spool file, exit 70, as if a mode
    # were wrong, where no daemon can ever take a request from that home.
    with exfat(tmp_path, "-o", "umask=077") as mounted:
        home = _home.Home.at(mounted / "home")
        home.ensure()
        with pytest.raises(spool.UnservableHomeError) as raised:
            spool.Client(home.root).submit(script({"text": "x"}))
        said = (
            f"no adaptord can serve {home.root}: Operation not permitted linking spool/tmp/ to spool/new/: requests "
            "are hard-linked along their way, so the home must be on one filesystem that has hard links; nothing was "
            "queued"
        )
        assert str(raised.value) == said and raised.value.errno == errno.EPERM and raised.value.root == home.root
        request = tmp_path / "request.json"
        request.write_bytes(orjson.dumps(script({"text": "x"})))
        shown = subprocess.run(
            [sys.executable, "-m", "adaptor", "submit", "--home", str(home.root), "--json", str(request)],
            capture_output=True, text=True, timeout=60,
        )
        assert shown.returncode == 69, shown
        assert shown.stderr == f"adaptor: {said}\n"
        assert orjson.loads(shown.stdout)["error"]["type"] == "adaptor.spool.UnservableHomeError"
        assert list(home.spool_new.iterdir()) == [] and list(home.spool_tmp.iterdir()) == []


def test_a_home_whose_path_is_not_utf8_is_said_so_by_every_command(tmp_path: Path) -> None:
    # A home under a latin-1 $HOME, which `adaptord serve` refuses ("its path is not UTF-8"):
    # every `adaptor` command was "TypeError: str is not valid UTF-8", exit 70, naming no home.
    home = os.path.join(os.fsencode(tmp_path), b"Jos\xe9", b"adaptord")
    os.makedirs(home)
    shown_home = '"' + os.fsdecode(home).replace("\udce9", "\\udce9") + '"'
    said = f"no adaptord can serve {shown_home}: its path is not UTF-8"
    with pytest.raises(spool.UnservableHomeError) as raised:
        spool.Client(os.fsdecode(home))
    assert str(raised.value) == said and raised.value.errno == errno.EILSEQ
    request = tmp_path / "request.json"
    request.write_bytes(orjson.dumps(script({"text": "x"})))
    env = {**os.environ, "ADAPTORD_HOME": os.fsdecode(home)}
    for command in (["status"], ["submit", str(request)], ["wait", "some-id"], ["events", "some-id"],
                    ["approvals"], ["threads"], ["cancel", "some-id"], ["run", "--driver", "script", "hi"]):
        shown = subprocess.run([sys.executable, "-m", "adaptor", *command, "--json"],
                               capture_output=True, timeout=60, env=env)
        assert shown.returncode == 69, (command, shown)
        assert shown.stderr.decode() == f"adaptor: {said}\n", command
        assert orjson.loads(shown.stdout)["error"]["type"] == "adaptor.spool.UnservableHomeError", command
    shown = subprocess.run([sys.executable, "-m", "adaptord", "status"], capture_output=True, timeout=60, env=env)
    assert shown.returncode == 69 and shown.stdout.decode().startswith(f"adaptord not running for {shown_home}\n")
