"""Concurrent clients over shared thread keys: every verdict arrives, no lease held twice."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import orjson

from adaptor import _home
from hosttools import sessionrecorder as sr
from tests.daemon_harness import DaemonProcess

CLIENTS = 8
REQUESTS = 500
KEYS = 20

CLIENT = """
import sys
from adaptor import _home
home, client, total, clients, keys = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
h = _home.Home.at(home)
for i in range(client, total, clients):
    rid = _home.submit(h, {
        "id": f"load-{i:04d}",
        "driver": "script",
        "prompt": f"request {i}",
        "thread": {"key": f"key/{i % keys}"},
        "config": {"steps": [{"text": f"answer {i}"}], "session": "auto"},
    })
    print(rid, flush=True)
"""


def test_eight_clients_five_hundred_requests_twenty_keys(tmp_path: Path) -> None:
    daemon = DaemonProcess(tmp_path / "home", "--workers", "4").start()
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(daemon.home.root), str(c), str(REQUESTS), str(CLIENTS), str(KEYS)],
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
    for rid in submitted:
        verdict = daemon.verdict(rid, timeout=300)
        assert verdict["ok"], verdict["error"]
    assert daemon.stop() == 0

    home = _home.Home.at(daemon.home.root)
    # runs of one thread never interleave in its audit log: a lease was never held twice
    recorder = sr.EventRecorder(sr.JSONLEventBackend(home.events), key_validator=lambda key: None)
    runs_per_key: dict[str, int] = defaultdict(int)
    for k in range(KEYS):
        session = _home.session_for_thread(f"key/{k}")
        finished: set[str] = set()
        current: str | None = None
        for record in recorder.iter_since(session):
            run_id = record.event.meta.run_id
            if current is None:
                current = run_id
            assert run_id == current, f"runs interleave in {session}"
            if record.event.__class__.__name__ == "RunFinished":
                finished.add(run_id)
                runs_per_key[session] += 1
                current = None
        assert current is None
    assert sum(runs_per_key.values()) == REQUESTS
    recorder.close()
    texts = {orjson.loads(home.verdict(rid).read_bytes())["result"]["text"] for rid in submitted}
    assert len(texts) == REQUESTS
