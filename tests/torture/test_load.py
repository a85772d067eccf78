"""Concurrent clients over shared thread keys: every verdict arrives, no lease held twice.

8 processes submit 500 requests over 20 thread keys to the daemon while in-process SDK clients
(processes of their own, on the same thread store) run turns on the same keys: the store's
lease is contended by the daemon and those programs, as docs/sdk.md allows ("adaptord and your
program can use one directory at once").
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import orjson

from adaptor import _home, errors, events
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess

CLIENTS = 8
REQUESTS = 500
KEYS = 20
SDK_CLIENTS = 3
SDK_TURNS = 40
# Every turn sleeps inside its lease, so that a lease granted twice shows as two turns at once.
SLEEP = 0.02

CLIENT = """
import sys
from adaptor import _home
home, client, total, clients, keys, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
h = _home.Home.at(home)
for i in range(client, total, clients):
    rid = _home.submit(h, {
        "id": f"load-{i:04d}",
        "driver": "script",
        "prompt": f"request {i}",
        "thread": {"key": f"key/{i % keys}"},
        "config": {"steps": [{"text": f"start {i}"}, {"sleep": pause}, {"text": f"answer {i}"}], "session": "auto"},
    })
    print(rid, flush=True)
"""

# One line per turn: its key, how it ended, and the times of its first and last events inside
# the lease (the lease is taken after run.started and given back before run.finished, so those
# two would not show a lease held twice).
SDK_CLIENT = """
import json, sys
import adaptor
from adaptor import errors, events
from adaptor.drivers import script
from adaptor.threadstore import JSONLStore
home, client, turns, keys, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
steps = ({"text": "start"}, {"sleep": pause}, {"text": f"sdk {client}"})
agent = adaptor.Agent(
    script.Driver(script.Config(steps=steps, session="auto")),
    thread_store=JSONLStore(f"{home}/threads"),
    workspace=f"{home}/workspace",
)
for turn in range(turns):
    key = f"key/{(client * 7 + turn) % keys}"
    stream = agent.thread(key).stream(f"sdk {client} turn {turn}")
    entered = last = None
    for event in stream:
        if isinstance(event, events.Notice) and event.data.get("phase") == "driver.started":
            entered = event.meta.time.isoformat()
        elif isinstance(event, events.TextDelta):
            last = event.meta.time.isoformat()
    try:
        stream.result()
        outcome = "ok"
    except errors.ThreadBusyError:
        outcome = "busy"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"key": key, "outcome": outcome, "entered": entered, "last": last}), flush=True)
agent.close()
"""


def test_eight_clients_five_hundred_requests_twenty_keys(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "home", "--workers", "4").start()
    root = str(daemon.home.root)
    sdk_clients = [
        subprocess.Popen(
            [sys.executable, "-c", SDK_CLIENT, root, str(c), str(SDK_TURNS), str(KEYS), str(SLEEP)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in range(SDK_CLIENTS)
    ]
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, root, str(c), str(REQUESTS), str(CLIENTS), str(KEYS), str(SLEEP)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for c in range(CLIENTS)
    ]
    submitted = []
    for client in clients:
        out, _ = client.communicate(timeout=120)
        assert client.returncode == 0
        submitted += out.split()
    assert len(submitted) == len(set(submitted)) == REQUESTS
    sdk_turns = []
    for client in sdk_clients:
        out, _ = client.communicate(timeout=300)
        assert client.returncode == 0
        sdk_turns += [orjson.loads(line) for line in out.splitlines()]
    assert len(sdk_turns) == SDK_CLIENTS * SDK_TURNS
    verdicts = {rid: daemon.verdict(rid, timeout=300) for rid in submitted}
    assert daemon.stop() == 0

    home = _home.Home.at(daemon.home.root)
    # The lease holds of each key, both sides': every turn that reached its agent held the
    # lease, whatever its outcome (of two owners granted one lease, one fails to save).
    holds: dict[str, list[tuple[datetime, datetime, str]]] = defaultdict(list)
    for turn in sdk_turns:
        if turn["entered"] is not None:
            entered, last = datetime.fromisoformat(turn["entered"]), datetime.fromisoformat(turn["last"])
            holds[turn["key"]].append((entered, last, "sdk"))
    recorder = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda key: None)
    runs_per_key: dict[str, int] = defaultdict(int)
    for k in range(KEYS):
        session = _home.session_for_thread(f"key/{k}")
        current: str | None = None
        entered_at: datetime | None = None
        last_at: datetime | None = None
        for record in recorder.iter_since(session):
            event = record.event
            run_id = event.meta.run_id
            if current is None:
                current = run_id
            # runs of one thread never interleave in its audit log
            assert run_id == current, f"runs interleave in {session}"
            if isinstance(event, events.Notice) and event.data.get("phase") == "driver.started":
                entered_at = event.meta.time
            elif isinstance(event, events.TextDelta):
                last_at = event.meta.time
            elif isinstance(event, events.RunFinished):
                if entered_at is not None:
                    assert last_at is not None, (session, run_id)
                    holds[f"key/{k}"].append((entered_at, last_at, "daemon"))
                runs_per_key[session] += 1
                current = entered_at = last_at = None
        assert current is None
    recorder.close()
    assert sum(runs_per_key.values()) == REQUESTS
    for key, spans in holds.items():
        spans.sort()
        for (_, end, holder), (start, _, next_holder) in zip(spans, spans[1:], strict=False):
            assert end <= start, (key, f"{holder} held its lease until {end}, {next_holder} had it at {start}")

    # Each side's turns either ran or found the thread busy, and nothing else.
    daemon_busy = 0
    for rid, verdict in verdicts.items():
        if not verdict["ok"]:
            assert isinstance(errors.from_wire(verdict["error"]), errors.ThreadBusyError), (rid, verdict["error"])
            assert verdict["exit_code"] == 75
            daemon_busy += 1
    sdk_busy = sum(turn["outcome"] == "busy" for turn in sdk_turns)
    assert [turn for turn in sdk_turns if turn["outcome"] not in ("ok", "busy")] == []

    # A busy turn never reached its agent; every other one did.
    assert len([span for spans in holds.values() for span in spans]) == REQUESTS - daemon_busy + SDK_CLIENTS * SDK_TURNS - sdk_busy
    # The lease was contended: a turn found its thread busy, and keys were held by both sides.
    print(f"busy: {daemon_busy} of {REQUESTS} daemon requests, {sdk_busy} of {len(sdk_turns)} SDK turns")
    assert daemon_busy + sdk_busy > 0
    assert any({holder for _, _, holder in spans} == {"sdk", "daemon"} for spans in holds.values())

    texts = {verdicts[rid]["result"]["text"] for rid in submitted if verdicts[rid]["ok"]}
    assert len(texts) == REQUESTS - daemon_busy
