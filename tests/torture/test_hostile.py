"""Hostile spool entries never stop the daemon: each ends as a rejection or in quarantine.

The hand-written cases quality.md lists (invalid JSON, wrong types, non-UTF-8, symlinks, FIFOs,
directories, a name like ``..weird.json``) are in tests/test_daemon.py
(``test_hostile_files_get_rejection_verdicts``, ``test_hostile_entries_are_quarantined``); this
module adds generated ones, the 10 MB prompt, 1,000-deep nesting and path syntax in ids and keys.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adaptor import _home, errors
from tests.costly_schemas import doubling_chain
from tests.daemon_harness import DaemonProcess


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    proc = DaemonProcess(tmp_path_factory.mktemp("hostile") / "home", "--workers", "2").start()
    yield proc
    assert proc.stop() == 0


_json = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(st.text(max_size=10), c, max_size=4)),
    max_leaves=20,
)
_request_like = st.fixed_dictionaries(
    {},
    optional={
        "driver": st.one_of(st.sampled_from(["script", "claude", "nope"]), _json),
        "prompt": st.one_of(st.text(max_size=50), _json),
        "thread": st.one_of(st.fixed_dictionaries({"key": st.text(max_size=30)}), _json),
        "policy": _json,
        "config": st.one_of(st.fixed_dictionaries({"steps": st.just([{"text": "x"}])}), _json),
        "workspace": st.one_of(st.sampled_from(["/", "rel", "/no/such/dir"]), _json),
        "id": st.text(max_size=20),
        "timeout": _json,
    },
)
_payloads = st.one_of(
    _request_like.map(lambda obj: orjson.dumps(obj)),
    _json.map(lambda obj: orjson.dumps(obj)),
    st.binary(max_size=200),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_payloads, number=st.integers(0, 10**9))
def test_random_request_files(daemon: DaemonProcess, payload: bytes, number: int) -> None:
    rid = f"h-{number}-{os.urandom(4).hex()}"
    daemon.drop(f"{rid}.json", payload)
    verdict = daemon.verdict(rid)
    assert verdict["id"] == rid
    if verdict["error"] is not None:
        err = errors.from_wire(verdict["error"])
        assert isinstance(err, BaseException)
        assert verdict["exit_code"] in {1, 2, 3, 4, 69, 70, 75}
    try:
        parsed = orjson.loads(payload)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):  # garbage, or JSON but no object: never run, rejected
        assert verdict["error"]["code"] == "ErrInvalidRequest" and verdict["exit_code"] == 2
        assert verdict["run_id"] is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(min_size=1, max_size=40).filter(lambda n: "/" not in n and "\0" not in n and n not in (".", "..")))
def test_random_names_are_claimed_or_quarantined(daemon: DaemonProcess, name: str) -> None:
    try:
        daemon.drop(name, b'{"driver": "script", "prompt": "x"}')
    except OSError:
        return  # a name this filesystem refuses cannot reach the daemon either
    probe = daemon.submit({"driver": "script", "prompt": "probe", "config": {"steps": [{"text": "alive"}]}})
    assert daemon.verdict(probe)["result"]["text"] == "alive"
    assert not (daemon.home.spool_new / name).exists()
    # Not dropped silently: a name carrying an id ("<id>.json", and misnamed "<id>.JSON" or
    # "<id>") got that id's verdict (or found it taken), any other name but "<id>.json" is kept
    # in quarantine/ as it came.
    request_id = _home.request_id_in_name(name)
    if request_id is not None:
        assert daemon.verdict(request_id)["id"] == request_id
    if name != f"{request_id}.json":
        assert any(p.name.endswith(f"-{name[:150]}") for p in daemon.home.quarantine.iterdir()), name


def test_ten_megabyte_prompt_and_deep_nesting(daemon: DaemonProcess) -> None:
    big = b'{"driver": "script", "prompt": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    daemon.drop("big.json", big)
    daemon.drop("deep.json", _deep_bytes(1000))
    for rid in ("big", "deep"):
        verdict = daemon.verdict(rid)
        assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest"


def _deep_bytes(levels: int) -> bytes:
    return b'{"driver": "script", "prompt": "x", "metadata": ' + b'{"k": ' * levels + b"1" + b"}" * levels + b"}"


def test_path_syntax_in_ids_and_thread_keys(daemon: DaemonProcess, tmp_path: Path) -> None:
    for key in ("../../etc/passwd", "/abs/key", "a/../../b", "..", "con\\nul"):
        rid = daemon.submit(
            {"driver": "script", "prompt": "x", "thread": {"key": key}, "config": {"steps": [{"text": "ok"}], "session": "auto"}}
        )
        verdict = daemon.verdict(rid)
        assert verdict["ok"], verdict["error"]
        assert verdict["events"].startswith("events/thread=")

    home = daemon.home
    escaped = tmp_path / "escaped"
    bad_ids = ["../../escape", "../escape", "a/b", "..", ".", str(escaped), "/", "..\\escape", "a\\b", ""]
    for number, bad in enumerate(bad_ids):
        request = {"id": bad, "driver": "script", "prompt": "x", "config": {"steps": [{"text": "ran"}]}}
        # The client refuses it before writing anything.
        with pytest.raises(ValueError, match="invalid request id"):
            daemon.submit(request)
        # A file under a good name: the id inside must be that name's, so it is rejected unrun.
        rid = f"path-id-{number}"
        daemon.drop(f"{rid}.json", orjson.dumps(request))
        verdict = daemon.verdict(rid)
        assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest", (bad, verdict)
        assert "/id" in [problem["path"] for problem in verdict["error"]["fields"]["errors"]], (bad, verdict)
        assert verdict["run_id"] is None
        # A file named after it (where a name can hold it): no id, so quarantined only.
        if "/" not in bad:
            name = f"{bad}.json"
            daemon.drop(name, orjson.dumps(request))
            _wait_for_quarantine(daemon, name)
            assert not (home.spool_new / name).exists()
            assert not (home.verdicts / name).exists()
    probe = daemon.submit({"driver": "script", "prompt": "probe", "config": {"steps": [{"text": "alive"}]}})
    assert daemon.verdict(probe)["result"]["text"] == "alive"
    assert [p.name for p in home.verdicts.iterdir() if "\\" in p.name or p.name.startswith(".")] == []

    # Nothing was written outside the home: not beside it, not where an id names, not anywhere
    # a relative id would lead from the home's folders.
    outside = [p for p in home.root.parent.iterdir() if p.name != "home"]
    assert outside == []
    assert list(tmp_path.iterdir()) == []  # (where the absolute id points)
    # Where an id's "../" could lead from the home's folders: the home itself (bar quarantine/)
    # and the two folders above it.  (Not below those: other tests' files under the shared base
    # folder may be named "escape" too.)
    above = [home.root.parent, home.root.parent.parent]
    strays = [p for folder in above for p in folder.iterdir() if p.name.startswith("escape")]
    strays += [p for p in home.root.rglob("escape*") if home.quarantine not in p.parents]
    assert strays == []


def _wait_for_quarantine(daemon: DaemonProcess, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(p.name.endswith(f"-{name}") for p in daemon.home.quarantine.iterdir()):
        assert not (daemon.home.verdicts / name).exists(), (name, "taken for a request id")
        assert time.monotonic() < deadline, (name, "not quarantined", sorted(p.name for p in daemon.home.quarantine.iterdir()))
        time.sleep(0.05)


def test_paths_a_request_names_cannot_hold_a_worker(daemon: DaemonProcess, tmp_path: Path) -> None:
    # Opening a FIFO for reading waits for a writer: one per worker would stop the daemon.
    fifo = tmp_path / "skill.tar"
    os.mkfifo(fifo)
    odd = {"archive": str(fifo), "key": "fifo"}, {"archive": str(tmp_path), "key": "directory"}
    rids = [
        daemon.submit({"driver": "script", "prompt": "x", "skills": [skill], "config": {"steps": [{"text": "x"}]}})
        for skill in [*odd, *odd]  # more than the daemon has workers
    ]
    for rid in rids:
        verdict = daemon.verdict(rid)
        assert verdict["error"]["code"] == "ErrSkillMaterializationFailed", verdict["error"]
    probe = daemon.submit({"driver": "script", "prompt": "probe", "config": {"steps": [{"text": "alive"}]}})
    assert daemon.verdict(probe)["result"]["text"] == "alive"


@pytest.mark.parametrize(
    ("schema", "output"),
    [
        # Python's re holds the GIL for a whole match: checked in the daemon, each of these
        # outputs would stop all of its threads for minutes.
        ({"type": "object", "patternProperties": {r"^(\w+\s?)+$": {"type": "integer"}}},
         {"a" * 30 + "!": "x"}),
        # 2**22 failing branches: each would hold a worker for about ten minutes.
        (doubling_chain(22), "not an integer"),
    ],
    ids=["pattern-that-backtracks", "subschemas-applied-again-and-again"],
)
def test_output_schemas_too_costly_to_check_cannot_hold_the_daemon(
    daemon: DaemonProcess, schema: dict[str, object], output: object
) -> None:
    def backtracking(**extra: object) -> str:
        steps = [{"output_json": output}]
        return daemon.submit({"driver": "script", "prompt": "x", "schema": schema, "config": {"steps": steps}, **extra})

    # More than the daemon has workers; the last has no deadline, so the 10 s limit cuts it.
    rids = [backtracking(timeout=3), backtracking(timeout=3), backtracking()]
    codes = []
    for rid in rids:
        verdict = daemon.verdict(rid, timeout=120)
        codes.append(verdict["error"]["code"])
        assert "validation did not finish" in verdict["result"]["structured"]["errors"][0]
    assert codes == ["ErrDeadlineExceeded", "ErrDeadlineExceeded", "ErrPolicyViolation"]
    probe = daemon.submit({"driver": "script", "prompt": "probe", "config": {"steps": [{"text": "alive"}]}})
    assert daemon.verdict(probe)["result"]["text"] == "alive"


def test_numbers_beyond_64_bits(daemon: DaemonProcess) -> None:
    # An integer literal past 64 bits was read as the nearest float: harmless for a timeout,
    # another value for the data an agent is given.  It is refused, naming its place; the
    # same timeout written as a float means "no deadline" in practice.
    body = b'{"driver": "script", "prompt": "x", "config": {"steps": [{"text": "ok"}]}, "timeout": '
    daemon.drop("bigint.json", body + b"1" + b"0" * 40 + b"}")
    verdict = daemon.verdict("bigint")
    assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest", verdict
    assert [e["path"] for e in verdict["error"]["fields"]["errors"]] == ["/timeout"], verdict
    daemon.drop("bigfloat.json", body + b"1e40}")
    verdict = daemon.verdict("bigfloat")
    assert verdict["ok"] and verdict["result"]["text"] == "ok"
