"""Hostile spool entries never stop the daemon: each ends as a rejection or in quarantine.

The hand-written entries quality.md lists (symlinks, FIFOs, directories, non-UTF-8 bytes and
names, names with ``..``) are dropped together into one daemon's spool here; tests/test_daemon.py
has more of the single cases (``test_hostile_files_get_rejection_verdicts``,
``test_hostile_entries_are_quarantined``).  This module adds generated ones, the 10 MB prompt,
1,000-deep nesting and path syntax in ids and keys.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from adaptor import _home, errors
from adaptor.spool import InvalidRequestError
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
    wire = verdict["error"]
    if wire is None:
        assert verdict["ok"] is True and verdict["exit_code"] == 0, verdict
    else:
        # A documented identity, rebuilt as the class that code names, with the exit status
        # that identity maps to (``adaptor exit-codes``), never an infrastructure failure.
        assert verdict["ok"] is False, verdict
        assert wire["code"] in _DOCUMENTED_CODES, wire
        err = errors.from_wire(wire)
        assert isinstance(err, errors.AdaptorError), (wire, err)
        assert type(err).code == wire["code"] and err.wire_code == wire["code"], (wire, type(err))
        assert verdict["exit_code"] == errors.exit_code_for(err), verdict
        assert verdict["exit_code"] in _OUTCOME_EXITS, verdict
        assert not (isinstance(err, errors.RunError) and err.reason == "infrastructure_error"), wire
    request = _request_object(payload)
    if request is None or not _REQUEST_SCHEMA.is_valid(request):
        # Garbage, JSON but no object, or an object the request schema refuses: never run,
        # rejected as a request (exit 2), each problem named.
        assert wire is not None and wire["code"] == "ErrInvalidRequest", (payload, verdict)
        rejection = errors.from_wire(wire)
        assert isinstance(rejection, InvalidRequestError) and verdict["exit_code"] == 2, verdict
        assert isinstance(rejection.errors, list) and rejection.errors, wire
        assert verdict["run_id"] is None, verdict


# Every error code docs/errors.md names (a verdict's error is one of them).
_DOCUMENTED_CODES = frozenset(
    re.findall(r"`((?:[a-z0-9]+\.)?Err[A-Za-z]+|RunError)`", (Path(__file__).parents[2] / "docs" / "errors.md").read_text())
)
# The statuses of outcomes in the table (not 0, nor ``wait --timeout``'s 124).
_OUTCOME_EXITS = {code for code, _ in errors.EXIT_CODES} - {0, 124}
_REQUEST_SCHEMA = Draft202012Validator(
    orjson.loads(resources.files("adaptord").joinpath("schemas/request.schema.json").read_bytes())
)


def _request_object(payload: bytes) -> dict[str, Any] | None:
    """The JSON object a request file holds, as docs/daemon.md defines one (UTF-8 JSON, with or
    without a byte-order mark); ``None`` for anything else."""
    try:
        obj = orjson.loads(payload.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except (UnicodeDecodeError, orjson.JSONDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


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


def test_links_fifos_folders_and_odd_bytes_in_the_spool(daemon: DaemonProcess, tmp_path: Path) -> None:
    """Each entry quality.md lists, dropped together: what is not a regular file is moved to
    quarantine/ unread and its id rejected (docs/daemon.md, "Submitting a request"); a file of
    bytes that are no UTF-8 is rejected; a name with no valid id is quarantined only.  Nothing
    outside the spool is touched, and the daemon keeps serving."""
    new, home, tag = daemon.home.spool_new, daemon.home, os.urandom(4).hex()
    outside = tmp_path / "outside"
    outside.mkdir()
    valid = outside / "valid.json"
    valid.write_bytes(orjson.dumps({"driver": "script", "prompt": "x", "config": {"steps": [{"text": "ran"}]}}))
    private = outside / "private.txt"
    private.write_bytes(b"not a request, not the daemon's\n")
    fifo_outside = outside / "fifo"
    os.mkfifo(fifo_outside)
    before = {path: (os.lstat(path), path.read_bytes() if path.is_file() else None) for path in outside.iterdir()}
    quarantined_before = set(os.listdir(home.quarantine))

    def symlink(to: str) -> Callable[[Path], None]:
        return lambda path: os.symlink(to, path)

    def folder(path: Path) -> None:
        path.mkdir()
        (path / "inside.json").write_bytes(valid.read_bytes())

    # Entries whose name carries an id: quarantined, and that id rejected.
    set_aside: dict[str, tuple[Callable[[Path], None], str]] = {
        f"link-{tag}.json": (symlink(str(valid)), "symlink"),  # a valid request elsewhere
        f"link-up-{tag}.json": (symlink(os.path.relpath(valid, new)), "symlink"),  # via ../..
        f"link-private-{tag}.json": (symlink(str(private)), "symlink"),
        f"link-fifo-{tag}.json": (symlink(str(fifo_outside)), "symlink"),
        f"link-folder-{tag}.json": (symlink(str(outside)), "symlink"),
        f"link-nowhere-{tag}.json": (symlink(str(outside / "missing.json")), "symlink"),
        f"link-spool-{tag}.json": (symlink(f"../tmp/staged-{tag}.json"), "symlink"),
        f"fifo-{tag}.json": (os.mkfifo, "special file"),
        f"folder-{tag}.json": (folder, "directory"),
    }
    (home.spool_tmp / f"staged-{tag}.json").write_bytes(valid.read_bytes())
    for name, (make, _) in set_aside.items():
        make(new / name)
    # A regular file whose bytes are no UTF-8: read, and rejected.
    daemon.drop(f"bytes-{tag}.json", b'{"driver": "script", "prompt": "\xff\xfe\xc3("}')
    # Names with no valid id: quarantined only (no name can hold "/": these are the "../" ones).
    only_set_aside = [os.fsencode(f"..{tag}.json"), os.fsencode(f"...{tag}"), os.fsencode(f"..{tag}..json"), b"name-\xff-" + tag.encode() + b".json"]
    for raw in only_set_aside:
        daemon.drop(os.fsdecode(raw), valid.read_bytes())

    for name, (_, kind) in set_aside.items():
        rid = name[: -len(".json")]
        verdict = _verdict_while_serving(daemon, rid)
        assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest", verdict
        assert verdict["run_id"] is None and verdict["events"] is None, verdict  # nothing ran
        message = verdict["error"]["message"]
        assert f"not a regular file ({kind})" in message, verdict
        [moved] = re.findall(r"quarantine/(\S+)", message)
        assert moved.partition("-")[2] == name and moved not in quarantined_before, verdict
        kept = home.quarantine / moved  # as it came: the link itself, the FIFO, the folder
        assert stat.S_IFMT(os.lstat(kept).st_mode) == {"symlink": stat.S_IFLNK, "directory": stat.S_IFDIR, "special file": stat.S_IFIFO}[kind]
    assert os.listdir(home.quarantine / _quarantined_as(daemon, f"folder-{tag}.json")) == ["inside.json"]
    assert os.readlink(home.quarantine / _quarantined_as(daemon, f"link-up-{tag}.json")) == os.path.relpath(valid, new)
    verdict = _verdict_while_serving(daemon, f"bytes-{tag}")
    assert verdict["exit_code"] == 2 and verdict["error"]["code"] == "ErrInvalidRequest", verdict
    assert "not UTF-8" in verdict["error"]["message"] and verdict["run_id"] is None, verdict
    for raw in only_set_aside:
        _wait_for_quarantine(daemon, os.fsdecode(raw))

    probe = daemon.submit({"driver": "script", "prompt": "probe", "config": {"steps": [{"text": "alive"}]}})
    assert _verdict_while_serving(daemon, probe)["result"]["text"] == "alive"
    assert [n for n in os.listdir(new) if tag in n] == []
    # A verdict for each id, none for the names that carry none.
    assert sorted(n for n in os.listdir(home.verdicts) if tag in n) == sorted([*set_aside, f"bytes-{tag}.json"])
    # What the links point at is as it was: not moved, written, chmodded nor linked to.
    after = {path: (os.lstat(path), path.read_bytes() if path.is_file() else None) for path in outside.iterdir()}
    assert after.keys() == before.keys()
    for path, (info, data) in before.items():
        now, now_data = after[path]
        assert (now.st_ino, now.st_mode, now.st_nlink, now.st_size, now_data) == (info.st_ino, info.st_mode, info.st_nlink, info.st_size, data), path
    assert (home.spool_tmp / f"staged-{tag}.json").read_bytes() == valid.read_bytes()
    (home.spool_tmp / f"staged-{tag}.json").unlink()


def _quarantined_as(daemon: DaemonProcess, name: str) -> str:
    [found] = [n for n in os.listdir(daemon.home.quarantine) if n.partition("-")[2] == name]  # <time>-<name>
    return found


def _verdict_while_serving(daemon: DaemonProcess, request_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """``daemon.verdict``, but failing at once should the daemon have gone."""
    path = daemon.home.verdict(request_id)
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert daemon.proc is not None and daemon.proc.poll() is None, (
            f"the daemon exited ({daemon.proc.returncode if daemon.proc else None}) before the verdict for {request_id}; "
            + "\n".join(daemon.lines)
        )
        assert time.monotonic() < deadline, f"no verdict for {request_id}; daemon log:\n" + "\n".join(daemon.lines)
        time.sleep(0.02)
    return orjson.loads(path.read_bytes())  # type: ignore[no-any-return]


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
