"""Pickup latency, sustained throughput and memory of a real ``adaptord serve``.

Cases (quality.md, ``pickup`` and the Memory line):

* ``idle p50`` / ``idle p99``: from the ``link`` of a request into ``spool/new`` to its driver's
  start, the daemon idle (each request linked 0.6 s after the previous one's verdict); goal:
  p50 within 5 ms of the baseline's p50 (p99 reported).
* ``1000 queued p50`` / ``p99``: the same while the daemon holds 1,000 queued requests.  They
  wait on a thread key held by a long-running request (a ``sleep`` step), so they stay queued
  for the whole measurement without occupying the other workers; the request measured has no
  thread key and is dispatched past them.
* ``sequential p50`` / ``p99``: each request linked 20 ms after the previous one's verdict, as
  a script running ``adaptor run`` in a loop does; same goal as idle.
* ``throughput``: requests/s from the first link to the last verdict, ``script`` driver, a
  client keeping 64 requests outstanding (link, unlink the temporary, fsync ``spool/new``, as
  ``adaptor._home.submit`` does); goal >= 200 requests/s.  Its baseline (informative) is the
  same request run in this process through the daemon's request mapping
  (``adaptor._request.parse``/``build``), one after another.
* ``RSS idle``: the daemon's ``VmRSS`` after its warm-up and the idle probes; goal < 80 MB.
* ``RSS +1000 queued``: its growth once the 1,000 requests are queued; goal < 50 MB.
* ``RSS +1000 served``: the throughput daemon's growth over its 1,000 requests (reported): what
  a long-lived daemon keeps per request it has finished, plus the allocator's high-water mark.

"Link" is ``time.time()`` just before ``os.link`` (the request file was written and fsynced
under ``spool/tmp`` beforehand, as ``submit`` does).  "Driver start" is the wall-clock time of
the run's ``process.spawn`` event, read back from the request's audit log
(``events/<id>.jsonl``) with ``hosttools.sessionrecorder``.  The baseline is a watchdog observer
in this process on the same ``spool/new``: the delay until it is told of the very same link
(``time.time()`` in its handler), so both share the disk, the kernel's inotify delivery and the
machine's load of that moment.  Its move-pairing hold is off (see :func:`_no_move_hold`).

Sizes: 60 probes per latency case (40 sequential), 1,000 requests for the throughput, about
2.5 minutes in all; ``--quick``: 5 probes, 20 queued, 40 requests, 0.05 s between probes.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from bench._common import (
    MB,
    Case,
    Options,
    below,
    emit,
    log,
    parse_args,
    result,
    workdir,
)
from bench._daemon import Daemon, isolated_env

SUMMARY = (
    "link-to-driver-start latency (p50/p99, idle and 1,000 queued), requests/s and RSS of a "
    "real adaptord vs raw watchdog latency for the same link"
)

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_STEPS = [{"text": "hi"}]
_BLOCKER_KEY = "bench-blocker"
_SLACK_MS = 5.0
_GOAL_RPS = 200.0
_GOAL_IDLE_MB = 80.0
_GOAL_QUEUED_MB = 50.0
_WINDOW = 64
_IDLE_GAP = 0.6
"""Seconds between probes of an idle daemon: longer than watchdog's move-pairing hold."""


def _request(request_id: str, **extra: Any) -> bytes:
    body = {
        "id": request_id,
        "format": "adaptord.request/1",
        "driver": "script",
        "prompt": "go",
        "config": {"steps": _STEPS},
        **extra,
    }
    return orjson.dumps(body, option=orjson.OPT_APPEND_NEWLINE)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_move_hold() -> None:
    """Switch off watchdog's inotify move-pairing hold in this process.

    Watchdog (7.x) holds an ``IN_MOVED_FROM`` whose ``IN_MOVED_TO`` it has not seen for 0.5 s,
    hoping to pair them, and its queue is first-in first-out: every later event of that watch
    waits behind it.  The daemon's claim renames each request out of ``spool/new``, so without
    this the baseline would report the hold of the previous claim rather than the delivery of
    this link.  The daemon (another process) keeps watchdog's default.
    """
    with contextlib.suppress(ImportError, AttributeError):
        from watchdog.observers import inotify_move_event_grouper

        inotify_move_event_grouper.InotifyMoveEventGrouper.delay = 0.0


class _Watch:
    """A watchdog observer on some directories: when each name was first reported."""

    def __init__(self, *directories: Path) -> None:
        from watchdog.events import FileSystemEvent, FileSystemEventHandler
        from watchdog.observers import Observer

        _no_move_hold()
        self.seen: dict[str, float] = {}
        self.created = 0
        self._changed = threading.Condition()
        watch = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                now = time.time()
                name = os.path.basename(os.fsdecode(event.src_path))
                with watch._changed:
                    if name not in watch.seen:
                        watch.seen[name] = now
                        if event.event_type == "created" and not name.startswith("."):
                            watch.created += 1
                        watch._changed.notify_all()

        self._observer = Observer()
        self._observer.daemon = True
        for directory in directories:
            self._observer.schedule(Handler(), str(directory), recursive=False)

    def __enter__(self) -> _Watch:
        self._observer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._observer.stop()
        self._observer.join(timeout=5)

    def when(self, name: str, timeout: float = 30.0) -> float:
        with self._changed:
            if not self._changed.wait_for(lambda: name in self.seen, timeout=timeout):
                raise RuntimeError(f"watchdog never reported {name}")
            return self.seen[name]

    def wait_created(self, count: int, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.created >= count, timeout=timeout)


class _Client:
    """Submits requests like ``adaptor._home.submit``, timing the link."""

    def __init__(self, daemon: Daemon) -> None:
        from hosttools import sessionrecorder as sr

        self.home = daemon.home
        self.daemon = daemon
        self._reader = sr.EventRecorder(sr.JSONLEventBackend(self.home.events))

    def close(self) -> None:
        self._reader.close()

    def prepare(self, request_id: str, data: bytes) -> Path:
        """Write and fsync ``spool/tmp/<id>.json`` (not timed)."""
        tmp = self.home.spool_tmp / f"{request_id}.json"
        fd = os.open(tmp, _FLAGS, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    def link(self, tmp: Path) -> float:
        """Link into ``spool/new``; returns the wall-clock time just before the link."""
        at = time.time()
        os.link(tmp, self.home.spool_new / tmp.name)
        os.unlink(tmp)
        _fsync_dir(self.home.spool_new)
        return at

    def wait_verdict(self, request_id: str, timeout: float = 60.0) -> None:
        path = self.home.verdict(request_id)
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                tail = "\n".join(self.daemon.lines[-20:])
                raise RuntimeError(f"no verdict for {request_id}; daemon log tail:\n{tail}")
            time.sleep(0.002)

    def driver_start(self, request_id: str) -> float:
        """Wall-clock time of the run's ``process.spawn`` event, from its audit log."""
        from adaptor.events import ProcessInfo

        for record in self._reader.iter_since(request_id):
            event = record.event
            if isinstance(event, ProcessInfo) and event.kind == "spawn":
                return event.meta.time.timestamp()
        raise RuntimeError(f"no process.spawn event in the audit log of {request_id}")


def _probe(client: _Client, watch: _Watch, request_id: str) -> tuple[float, float]:
    """(daemon, watchdog) latency in ms of one request linked into an otherwise quiet spool."""
    tmp = client.prepare(request_id, _request(request_id))
    linked = client.link(tmp)
    client.wait_verdict(request_id)
    seen = watch.when(tmp.name)
    started = client.driver_start(request_id)
    return (started - linked) * 1000, (seen - linked) * 1000


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no samples")
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def _latency_cases(label: str, pairs: list[tuple[float, float]]) -> list[Case]:
    daemon = [d for d, _ in pairs]
    raw = [w for _, w in pairs]
    p50, raw50 = _quantile(daemon, 0.5), _quantile(raw, 0.5)
    p99, raw99 = _quantile(daemon, 0.99), _quantile(raw, 0.99)
    extra = {
        "samples": len(pairs),
        "min_ms": round(min(daemon), 3),
        "max_ms": round(max(daemon), 3),
        "excess_ms": round(p50 - raw50, 3),
    }
    return [
        Case(
            f"{label} p50",
            p50,
            "ms",
            raw50,
            p50 / raw50 if raw50 > 0 else None,
            f"figure - baseline <= {_SLACK_MS:g} ms",
            p50 - raw50 <= _SLACK_MS,
            extra,
        ),
        Case(
            f"{label} p99",
            p99,
            "ms",
            raw99,
            p99 / raw99 if raw99 > 0 else None,
            "reported (no goal)",
            True,
            {"excess_ms": round(p99 - raw99, 3)},
        ),
    ]


def _probes(
    client: _Client, watch: _Watch, label: str, count: int, gap: float
) -> list[tuple[float, float]]:
    """``count`` probes, each linked ``gap`` seconds after the previous one's verdict."""
    pairs = []
    for i in range(count):
        time.sleep(gap)
        pairs.append(_probe(client, watch, f"pickup-{label}-{i:05d}"))
    return pairs


def _in_process_rate(runs: int) -> float:
    """Runs/s of the same request in this process, through the daemon's request mapping."""
    from adaptor import _request as requests

    def one(i: int) -> None:
        request_id = f"inproc-{i:05d}"
        parsed = requests.parse(_request(request_id), request_id)
        call = requests.build(
            parsed,
            driver_defaults={},
            thread_store=None,
            on_approval=lambda req: None,
            tools={},
        )
        try:
            stream = call.start()
            for _ in stream:
                pass
            stream.result()
        finally:
            call.agent.close()

    one(-1)  # imports and first-use costs
    started = time.perf_counter()
    for i in range(runs):
        one(i)
    return runs / (time.perf_counter() - started)


def _throughput(client: _Client, watch: _Watch, total: int) -> dict[str, float]:
    """Requests/s with ``_WINDOW`` requests outstanding, first link to last verdict."""
    tmps = [client.prepare(f"tput-{i:05d}", _request(f"tput-{i:05d}")) for i in range(total)]
    first = None
    for i, tmp in enumerate(tmps):
        if i >= _WINDOW and not watch.wait_created(i - _WINDOW + 1, timeout=120):
            raise RuntimeError(f"throughput: {watch.created} verdicts after {i} requests")
        at = client.link(tmp)
        first = at if first is None else first
    if not watch.wait_created(total, timeout=300):
        raise RuntimeError(f"throughput: only {watch.created} of {total} verdicts")
    assert first is not None
    verdicts = sorted(watch.seen[f"tput-{i:05d}.json"] for i in range(total))
    elapsed = verdicts[-1] - first
    lo, hi = int(total * 0.1), int(total * 0.9)
    steady = (hi - lo) / (verdicts[hi] - verdicts[lo]) if verdicts[hi] > verdicts[lo] else 0.0
    return {"rate": total / elapsed, "steady_10_90": steady, "seconds": elapsed}


@contextlib.contextmanager
def _serving(scratch: Path, name: str) -> Iterator[tuple[Daemon, _Client]]:
    env = isolated_env(scratch)
    with Daemon(scratch / name, "--grace", "0.5", env=env) as daemon:
        client = _Client(daemon)
        try:
            yield daemon, client
        finally:
            client.close()


def _hold_queue(daemon: Daemon, client: _Client, queued: int) -> None:
    """A long run holding a thread key, then ``queued`` requests waiting for that key."""
    blocker = "queue-blocker"
    sleeper = {"steps": [{"sleep": 3600}], "session": "auto"}
    data = _request(blocker, thread={"key": _BLOCKER_KEY}, config=sleeper)
    client.link(client.prepare(blocker, data))
    daemon.wait_for(f"request.started id={blocker}")
    base = daemon.count("request.queued")
    for i in range(queued):
        request_id = f"queued-{i:05d}"
        config = {"steps": _STEPS, "session": "auto"}
        data = _request(request_id, thread={"key": _BLOCKER_KEY}, config=config)
        client.link(client.prepare(request_id, data))
    daemon.wait_for("request.queued", count=base + queued, timeout=300)


def run(options: Options) -> dict[str, object]:
    started = time.perf_counter()
    quick = options.quick
    probes = 5 if quick else 60
    sequential = 5 if quick else 40
    queued = 20 if quick else 1000
    total = 40 if quick else 1000
    inproc = 10 if quick else 300
    gap = 0.05 if quick else _IDLE_GAP
    with workdir(options, "pickup") as scratch:
        with _serving(scratch, "home-latency") as (daemon, client):
            with _Watch(daemon.home.spool_new) as watch:
                _probes(client, watch, "warmup", 3 if quick else 10, gap=0.05)
                idle = _probes(client, watch, "idle", probes, gap=gap)
                log(f"pickup: idle: {_summary(idle)}")
                back_to_back = _probes(client, watch, "sequential", sequential, gap=0.02)
                log(f"pickup: sequential: {_summary(back_to_back)}")
                time.sleep(max(gap, 0.2))
                rss_idle = daemon.rss_bytes()
                _hold_queue(daemon, client, queued)
                time.sleep(0.2)
                rss_queued = daemon.rss_bytes()
                log(
                    f"pickup: RSS idle {rss_idle / MB:.1f} MB, "
                    f"with {queued} queued {rss_queued / MB:.1f} MB"
                )
                time.sleep(gap)
                loaded = _probes(client, watch, "loaded", probes, gap=gap)
                log(f"pickup: {queued} queued: {_summary(loaded)}")
                if daemon.count("request.started id=queued-"):
                    raise RuntimeError("a queued request ran: the queue was not held")
        with _serving(scratch, "home-throughput") as (daemon, client):
            _warm(client)
            rss_before = daemon.rss_bytes()
            with _Watch(daemon.home.verdicts) as watch:
                tput = _throughput(client, watch, total)
            rss_served = daemon.rss_bytes() - rss_before
        baseline_rate = _in_process_rate(inproc)
        log(
            f"pickup: {tput['rate']:.1f} requests/s through the daemon "
            f"(10-90%: {tput['steady_10_90']:.1f}/s), in-process {baseline_rate:.1f}/s"
        )
        cases = _latency_cases("idle", idle)
        cases += _latency_cases(f"{queued} queued", loaded)
        cases += _latency_cases("sequential", back_to_back)
        rate = tput["rate"]
        cases.append(
            Case(
                "throughput",
                rate,
                "requests/s",
                baseline_rate,
                rate / baseline_rate,
                f"figure >= {_GOAL_RPS:g} requests/s",
                rate >= _GOAL_RPS,
                {
                    "requests": total,
                    "outstanding": _WINDOW,
                    "steady_10_90_per_s": round(tput["steady_10_90"], 1),
                    "baseline_is": "in-process runs/s of the same request, one at a time",
                },
            )
        )
        cases.append(below("RSS idle", rss_idle / MB, "MB", _GOAL_IDLE_MB))
        cases.append(
            below(
                f"RSS +{queued} queued",
                (rss_queued - rss_idle) / MB,
                "MB",
                _GOAL_QUEUED_MB,
                baseline=rss_idle / MB,
                rss_queued_mb=round(rss_queued / MB, 1),
            )
        )
        cases.append(
            Case(
                f"RSS +{total} served",
                rss_served / MB,
                "MB",
                rss_before / MB,
                None,
                "reported (no goal)",
                True,
                {"per_request_kb": round(rss_served / 1024 / total, 2)},
            )
        )
        params = {
            "probes": {"idle": probes, f"{queued} queued": probes, "sequential": sequential},
            "idle_gap_s": gap,
            "sequential_gap_s": 0.02,
            "queued": queued,
            "throughput_requests": total,
            "outstanding": _WINDOW,
            "in_process_runs": inproc,
            "driver": "script",
            "steps": _STEPS,
            "workers": 4,
            "link_time": "time.time() just before os.link",
            "driver_start": "meta.time of the run's process.spawn event (audit log)",
            "baseline": "watchdog observer in this process on the same spool/new, "
            "move-pairing hold off",
        }
        return result("pickup", cases, options=options, started=started, params=params)


def _warm(client: _Client) -> None:
    """A few requests so imports and first-use costs stay out of the throughput figure."""
    for i in range(3):
        request_id = f"warm-{i}"
        client.link(client.prepare(request_id, _request(request_id)))
        client.wait_verdict(request_id)


def _summary(pairs: list[tuple[float, float]]) -> str:
    daemon = [d for d, _ in pairs]
    raw = [w for _, w in pairs]
    return (
        f"p50 {_quantile(daemon, 0.5):.2f} ms (raw {_quantile(raw, 0.5):.2f}), "
        f"p99 {_quantile(daemon, 0.99):.2f} ms (raw {_quantile(raw, 0.99):.2f})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_args(argv, __doc__ or SUMMARY)
    emit(run(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
