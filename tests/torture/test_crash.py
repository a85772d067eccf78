"""kill -9 the daemon at random moments under load, in its start-up too: nothing lost, nothing
doubled, no agent left running, every approval asked in a run's log ended there once, as the
run took it.

The request mix and the kill schedule come from one seed, fixed so that CI runs the same test
every time; ``ADAPTOR_TORTURE_SEED=<n>`` runs another schedule (when hunting for a rare crash
window, loop over seeds).  A failure's captured output names the seed it ran with.
"""

from __future__ import annotations

import os
import random
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from adaptor import _home, errors, events
from adaptor.threadstore import JSONLStore, Query
from hosttools import sessionrecorder as sr
from tests.daemon_harness import (
    DaemonProcess,
    cmdline,
    identities,
    marked_processes,
    processes_with_env,
)

REQUESTS = 200
KILLS = 20


_AGENT_TAG = "ADAPTOR_TORTURE_AGENT"
# Agents this long cannot end by themselves before the next daemon is up: if a kill leaves one
# running, only that daemon's clean-up can have stopped it.
_LONG = 5
_BACKTRACKS = r"^(\w+\s?)+$"
# The message of the run.finished recovery writes for a run a kill cut short (docs/daemon.md).
_INTERRUPTED = "the daemon stopped while the run was in progress"


def _request(i: int, rng: random.Random, home: Path) -> dict[str, Any]:
    request: dict[str, Any]
    if i % 10 == 7:
        # A real agent process with a child of its own: what a kill leaves running.  Both
        # carry a variable of the test's, so the test finds them without the daemon's help.
        pause = rng.choice([0.1, 0.3, 1, _LONG])
        script = f"sleep {pause} & sleep {pause}; wait; echo done {i}"
        config = {"command": "/bin/sh", "extra_args": ["-c", script], "env": {_AGENT_TAG: str(home)}}
        request = {"driver": "command", "prompt": f"request {i}", "config": config}
        if i % 3 == 0:
            request["on_interrupt"] = "requeue"
        return request
    if i % 10 == 5:
        # An approval, answered from outside (as `adaptor approve` does) by a responder that
        # keeps going through the kills.
        asking = [{"text": f"turn {i}"}, {"approval": {"kind": "permission", "title": f"step {i}"}}, {"text": f"done {i}"}]
        request = {"driver": "script", "prompt": f"request {i}", "config": {"steps": asking},
                   "policy": {"approvals": {"timeout": 60}}}
        if i % 3 == 0:
            request["on_interrupt"] = "requeue"
        return request
    if i % 10 == 3:
        # An output schema whose pattern backtracks: checked by a child of the daemon, which a
        # kill must not leave running either.  The deadline ends the run.
        output = {"output_json": {"name": "a" * 30 + "!"}}
        schema = {"properties": {"name": {"pattern": _BACKTRACKS}}}
        return {"driver": "script", "prompt": f"request {i}", "config": {"steps": [output]}, "schema": schema, "timeout": 1}
    steps: list[dict[str, Any]] = [{"text": f"turn {i}"}, {"sleep": rng.choice([0, 0.01, 0.05, 0.1])}, {"text": f"done {i}"}]
    request = {"driver": "script", "prompt": f"request {i}", "config": {"steps": steps}}
    if i % 4 == 0:
        request["thread"] = {"key": f"shared/{i % 5}"}
        request["config"]["session"] = "auto"
    if i % 3 == 0:
        request["on_interrupt"] = "requeue"
    return request


SEED = int(os.environ.get("ADAPTOR_TORTURE_SEED", "20261202"))


def _checkers(home: Path) -> list[int]:
    """The schema checkers of ``home``'s daemons (they carry its mark, like its agents)."""
    return [
        pid
        for pid in marked_processes(home)
        if "adaptor._schema_checker" in cmdline(pid)
    ]


def _approve_whatever_waits(home: _home.Home, stop: threading.Event) -> None:
    """Approve every pending approval, as a person running `adaptor approve` in a loop would:
    whatever the daemon's state (killed, starting), a refusal is only passed over."""
    while not stop.is_set():
        for entry in sorted(home.approvals_pending.glob("*.json")):
            try:
                _home.respond(home, entry.name[: -len(".json")], "approve")
            except errors.AdaptorError:  # (expired by a kill, answered already, gone)
                pass
        stop.wait(0.02)


def test_random_kill9_leaves_exactly_one_valid_verdict_per_request(tmp_path: Path) -> None:
    print(f"ADAPTOR_TORTURE_SEED={SEED}")  # shown with a failure's captured output
    rng = random.Random(SEED)
    home = tmp_path / "home"
    daemon = DaemonProcess(home, "--workers", "4").start()
    appeared = _VerdictsAppearing(daemon.home.verdicts)
    requests = [_request(i, rng, home) for i in range(REQUESTS)]
    ids = [daemon.submit(request) for request in requests]
    stop_responding = threading.Event()
    responder = threading.Thread(target=_approve_whatever_waits, args=(daemon.home, stop_responding), daemon=True)
    responder.start()
    patterned = {rid for i, rid in enumerate(ids) if i % 10 == 3}
    orphaned = checking = long_orphaned = 0
    verdicts_seen: dict[str, tuple[int, bytes]] = {}
    for _ in range(KILLS):
        time.sleep(rng.uniform(0.02, 0.3))  # a random moment: the crash is the point of the test
        daemon.kill9()
        _assert_verdicts_never_change(daemon.home, verdicts_seen)
        left_running = identities(processes_with_env(_AGENT_TAG, str(home)))
        left_checking = identities(_checkers(home))
        if rng.random() < 0.5:
            # Half the time the next daemon is killed too, while it starts: in its recovery.
            daemon = DaemonProcess(home, "--workers", "4").start(wait_ready=False)
            time.sleep(rng.uniform(0.0, 0.6))
            daemon.kill9()
            left_running |= identities(processes_with_env(_AGENT_TAG, str(home)))
            left_checking |= identities(_checkers(home))
        orphaned += bool(left_running)
        long_orphaned += any(f"sleep {_LONG}" in cmdline(pid) for pid, _ in left_running)
        checking += bool(left_checking)
        daemon = DaemonProcess(home, "--workers", "4").start()
        # No agent or schema checker of the killed daemon is still at work once the new one serves.
        assert not left_running & identities(processes_with_env(_AGENT_TAG, str(home)))
        assert not left_checking & identities(_checkers(home))
    paths = _home.Home.at(home)
    try:
        for rid in ids:
            daemon.verdict(rid, timeout=180)
    finally:
        stop_responding.set()
        responder.join(timeout=60)
    assert daemon.stop() == 0
    _assert_verdicts_never_change(paths, verdicts_seen)
    # Each verdict came into place once, over every daemon: none was written, then written again.
    assert appeared.stop() == Counter(f"{rid}.json" for rid in ids)

    # exactly one verdict per request, each complete and parseable
    assert sorted(p.name for p in paths.verdicts.iterdir()) == sorted(f"{rid}.json" for rid in ids)
    outcomes: dict[str, int] = {}
    for rid in ids:
        verdict = orjson.loads(paths.verdict(rid).read_bytes())
        assert verdict["id"] == rid and verdict["format"] == "adaptord.verdict/1"
        if verdict["error"] is not None:
            err = errors.from_wire(verdict["error"])
            assert isinstance(err, errors.AdaptorError)
            # One daemon uses the store: a busy thread could only be a killed daemon's lease.
            assert not isinstance(err, errors.ThreadBusyError), (rid, verdict["error"])
            # Only what a kill or the schema's deadline explains: a run cut short by a kill
            # (interrupted), or the backtracking schema's check stopped by its deadline.
            if isinstance(err, errors.RunDeadlineExceededError):
                assert rid in patterned, (rid, verdict["error"])
                assert "validation did not finish" in verdict["result"]["structured"]["errors"][0]
            else:
                assert type(err) is errors.RunError, (rid, verdict["error"])
                assert err.reason == "infrastructure_error" and err.details.get("interrupted"), (rid, verdict["error"])
        key = "ok" if verdict["ok"] else verdict["error"]["code"]
        outcomes[key] = outcomes.get(key, 0) + 1
    assert outcomes.get("ok", 0) > REQUESTS // 2, outcomes
    assert list(paths.claimed.iterdir()) == []
    assert list(paths.spool_new.iterdir()) == []

    # every audit log validates as the daemons left it: a tail a kill tore mid-append was cut
    # by the next writer of that log (a restart's recovery writes to every run it interrupted,
    # and to the lifecycle log), which said so
    for log in paths.events.glob("*.jsonl"):
        sr.verify(log)

    with sr.EventRecorder(sr.JSONLEventBackend(paths.events), key_validator=lambda key: None) as audit:
        facts = [record.event for record in audit.iter_since(_home.DAEMON_SESSION)]
        _assert_nothing_ran_twice(paths, audit, ids, requests, facts)
        _assert_threads_kept_their_ok_turns(paths, audit, ids, requests)
        approvals = _assert_each_approval_ended_once_as_taken(paths, audit, ids, requests)

    # no daemon survived, and no agent process either: each start stopped what the kill before
    # it left running, and the last daemon stopped its own
    leftover = subprocess.run(["pgrep", "-f", f"adaptord serve --home {home}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""
    assert processes_with_env(_AGENT_TAG, str(home)) == []
    assert _checkers(home) == []
    stopped = sum(isinstance(fact, events.Notice) and fact.text == "leftovers.stopped" for fact in facts)
    repaired = sum(isinstance(fact, events.Notice) and fact.text == "audit_log.repaired" for fact in facts)
    interrupted = sum(isinstance(fact, events.Notice) and fact.text == "request.interrupted" for fact in facts)
    print(
        f"{orphaned} of {KILLS} kills left agents running ({long_orphaned} a long one), "
        f"{checking} schema checkers; {stopped} restarts stopped some; {interrupted} runs interrupted; "
        f"{repaired} torn audit-log tails cut; approvals ended {dict(approvals)}; verdicts {outcomes}"
    )
    assert approvals["approved"] > 0
    # The kills did hit runs in flight, and what they left running was stopped by a restart
    # (a long agent cannot have ended by itself before it).
    assert interrupted > 0
    assert stopped > 0 or not long_orphaned


class _VerdictsAppearing(FileSystemEventHandler):
    """Counts each name that comes into place in the verdicts folder (made or moved there),
    as a client watching the folder sees verdicts arrive."""

    def __init__(self, folder: Path) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._observer = Observer()
        self._observer.schedule(self, str(folder))
        self._observer.start()

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.is_directory or event.event_type not in ("created", "moved"):
            return
        name = os.path.basename(os.fsdecode(event.dest_path if event.event_type == "moved" else event.src_path))
        if name.endswith(".json"):
            with self._lock:
                self._counts[name] += 1

    def stop(self) -> Counter[str]:
        self._observer.stop()
        self._observer.join()
        with self._lock:
            return Counter(self._counts)


def _assert_verdicts_never_change(paths: _home.Home, seen: dict[str, tuple[int, bytes]]) -> None:
    """A verdict, once a reader can see it, stays the file it was (same inode, same bytes): a
    restart that wrote one again (a later finish, another outcome) would give two readers of
    one request two answers, though the folder still holds one file per request."""
    for path in paths.verdicts.iterdir():
        now = (path.stat().st_ino, path.read_bytes())
        assert seen.setdefault(path.name, now) == now, (path.name, "changed after it was written")


def _assert_each_approval_ended_once_as_taken(
    paths: _home.Home, audit: sr.EventRecorder, ids: list[str], requests: list[dict[str, Any]]
) -> Counter[str]:
    """In each run's log, every ``notice.approval.requested`` has exactly one
    ``notice.approval.resolved`` after it (docs/daemon.md, crash or not), and one the run took
    an answer to (``approvals/resolved/`` says the action) says ``approved``, never
    ``aborted``.  Returns how the approvals ended."""
    ended: Counter[str] = Counter()
    for rid, request in zip(ids, requests, strict=True):
        if not any("approval" in step for step in request["config"].get("steps", ())):
            continue
        asked: Counter[str] = Counter()
        resolved: dict[str, list[str]] = {}
        for record in audit.iter_since(rid):
            event = record.event
            if isinstance(event, events.Notice) and event.kind == "approval.requested":
                asked[event.data["request_id"]] += 1
            elif isinstance(event, events.Notice) and event.kind == "approval.resolved":
                assert asked[event.data["request_id"]], (rid, "resolved before it was asked", event.data)
                resolved.setdefault(event.data["request_id"], []).append(event.data["result"])
        assert set(asked) == set(resolved), (rid, asked, resolved)
        for approval_id, results in resolved.items():
            assert asked[approval_id] == 1 and len(results) == 1, (rid, approval_id, asked, results)
            outcome = paths.approvals_resolved / f"{approval_id}.json"
            kept = orjson.loads(outcome.read_bytes()) if outcome.exists() else None
            if kept is not None and kept["result"] == "approve":  # the run took the answer
                assert results == ["approved"], (rid, approval_id, results, kept)
            ended[results[0]] += 1
    return ended


def _phase(fact: events.Event) -> str | None:
    return fact.data.get("phase") if isinstance(fact, events.Notice) and fact.kind == "lifecycle" else None


def _assert_nothing_ran_twice(
    paths: _home.Home, audit: sr.EventRecorder, ids: list[str], requests: list[dict[str, Any]], facts: list[events.Event]
) -> None:
    """A request runs again only where docs/daemon.md lets it: interrupted with ``on_interrupt:
    "requeue"`` and attempts left, and, for a thread's turn, only if its agent was not entered
    (the agent keeps the conversation: a second attempt would send the prompt into it twice)."""
    per_request: dict[str, list[dict[str, Any]]] = {rid: [] for rid in ids}
    for fact in facts:
        if _phase(fact) in ("request.started", "request.interrupted"):
            assert isinstance(fact, events.Notice)
            per_request[fact.data["request_id"]].append(fact.data)
    for rid, request in zip(ids, requests, strict=True):
        requeue = request.get("on_interrupt") == "requeue"
        thread = "thread" in request
        # A lifecycle fact is not waited for, so a kill may lose one; the run ids in the run's
        # state are written before its agent can start, so they count every attempt.
        run_ids = orjson.loads(paths.run_state(rid).read_bytes()).get("run_ids") or []
        # A thread's turn runs again only if no attempt got as far as a run id (the SDK's
        # admission, counted as entered): one run id at most.
        allowed = _home.MAX_ATTEMPTS if requeue and not thread else 1
        assert len(run_ids) <= allowed, (rid, request.get("on_interrupt"), thread, run_ids)
        seen = per_request[rid]
        started = [noted["run_id"] for noted in seen if noted["phase"] == "request.started" and noted.get("run_id")]
        assert len(started) <= allowed and set(started) <= set(run_ids), (rid, seen, run_ids)
        may_start = True
        admitted = False
        for noted in seen:
            if noted["phase"] == "request.started":
                assert may_start, (rid, "started again after an interrupt that forbids it", seen)
                admitted = bool(noted.get("run_id"))
                continue
            if thread and admitted:
                # The SDK had admitted the run: its agent may have had the prompt.
                assert noted["entered"], (rid, "an admitted thread turn said not entered", seen)
            may_start = (
                requeue
                and noted["attempt"] < _home.MAX_ATTEMPTS
                and not (thread and (noted["entered"] or noted.get("thread_changed")))
            )
        # What the agent was given, as a reader of the audit logs sees it.
        session = _home.session_for_thread(request["thread"]["key"]) if thread else rid
        entered = [
            record.event.meta.run_id
            for record in audit.iter_since(session)
            if _phase(record.event) == "driver.started" and record.event.meta.run_id in run_ids
        ]
        assert len(entered) <= allowed, (rid, "its agent was entered more often than allowed", entered)
        # A run that ended by itself is not run again: every attempt before the last ended with
        # the run.finished recovery gives an interrupted run.
        earlier = set(run_ids[:-1])
        ends = [
            record.event.message
            for record in audit.iter_since(session)
            if isinstance(record.event, events.RunFinished) and record.event.meta.run_id in earlier
        ]
        assert len(ends) >= len(earlier) and set(ends) <= {_INTERRUPTED}, (rid, run_ids, ends)


def _assert_threads_kept_their_ok_turns(
    paths: _home.Home, audit: sr.EventRecorder, ids: list[str], requests: list[dict[str, Any]]
) -> None:
    """Each shared key that had an ok turn resolves to one active record, resuming the session
    its last ok turn ended in; and every ok turn continued that one conversation (with no turn
    saved, each would have started a session of its own)."""
    store = JSONLStore(paths.threads)
    ok_runs: dict[str, set[str]] = {}
    for rid, request in zip(ids, requests, strict=True):
        if "thread" in request:
            verdict = orjson.loads(paths.verdict(rid).read_bytes())
            if verdict["ok"]:
                ok_runs.setdefault(request["thread"]["key"], set()).add(verdict["run_id"])
    assert len(ok_runs) == 5, sorted(ok_runs)
    for key, verdicts_ok in ok_runs.items():
        ended_ok = [
            record.event
            for record in audit.iter_since(_home.session_for_thread(key))
            if isinstance(record.event, events.RunFinished) and not record.event.failed
        ]
        # (A run killed between its end and its verdict ended ok in the log, and was saved.)
        assert verdicts_ok <= {finished.run_id for finished in ended_ok}, (key, verdicts_ok)
        record = store.resolve(Query(key=key))
        assert record is not None, (key, "ok turns, but no record")
        assert record.status == "active" and record.state is not None
        assert record.state.resume_id == ended_ok[-1].thread_id, (key, record.state.resume_id, ended_ok[-1])
        assert {finished.thread_id for finished in ended_ok} == {record.state.resume_id}, (key, ended_ok)
