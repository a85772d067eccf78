"""Secrets: the values of a run's secrets appear in no file under the home and in no byte printed.

One daemon home sees every way a secret can travel: the agent echoing its environment on stdout
and stderr (a real process), the secret in text, thinking, tool arguments and results, failure
messages and details, an approval's title, a thread's records, a timeout, a cancel, a crash in
mid-run, a rejected request, two quarantined ones (misnamed, and under an id in use), and
``adaptor run`` following a run live.  Afterwards every file under the home (quarantine/ too),
every byte either daemon printed on stdout and stderr and every byte of every ``adaptor``
command is searched; each command must have succeeded, so none passes by printing nothing.  The secrets end in random hex, searched for alone, so a value that was escaped,
quoted or cut short at its front is caught too.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from adaptor import _home
from tests.daemon_harness import DaemonProcess

CORE = secrets.token_hex(16)
SECRET = f"sk-torture-{CORE}"  # a config.env value
HEADER_CORE = secrets.token_hex(16)
HEADER_SECRET = f'pa"ss\\wörd {HEADER_CORE}'  # an MCP header value JSON has to escape
CONFIG_CORE = secrets.token_hex(16)
CONFIG_SECRET = f"sk-config-{CONFIG_CORE}"  # in the daemon config's [drivers.command] env
ENV = {"API_TOKEN": SECRET}
MCP = [
    {
        "key": "remote",
        "transport": "http",
        "url": "http://127.0.0.1:9/mcp",
        "headers": {"X-Api-Key": HEADER_SECRET},
    }
]


def _leaks(data: bytes) -> bool:
    return any(core.encode() in data for core in (CORE, HEADER_CORE, CONFIG_CORE))


def _script(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "driver": "script",
        "prompt": "go",
        "config": {"steps": list(steps), "env": ENV},
        "mcp": MCP,
        **extra,
    }


def _command(shell: str, **extra: Any) -> dict[str, Any]:
    config = {"command": "/bin/sh", "extra_args": ["-c", shell], "env": ENV}
    return {"driver": "command", "prompt": "go", "config": config, **extra}


class _Printed:
    """Every ``adaptor`` command run against the home, and all it printed."""

    def __init__(self, home: Path, config_home: Path) -> None:
        self.env = {**os.environ, "ADAPTORD_HOME": str(home), "XDG_CONFIG_HOME": str(config_home)}
        self.outputs: list[tuple[list[str], bytes]] = []

    def __call__(
        self, *args: str, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run(
            [sys.executable, "-m", "adaptor", *args],
            input=stdin,
            capture_output=True,
            env=self.env,
            timeout=120,
        )
        self.outputs.append(([*args], proc.stdout + proc.stderr))
        return proc


def _start(home: Path, env: dict[str, str]) -> DaemonProcess:
    return DaemonProcess(home, "--workers", "4", "--grace", "2", env=env, capture_stdout=True).start()


def _succeeded(
    proc: subprocess.CompletedProcess[bytes], what: object, *, printed: bool = True
) -> None:
    assert proc.returncode == 0, (what, proc.returncode, proc.stderr)
    assert proc.stdout.strip() or not printed, (what, "printed nothing")


def _wait_for(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def _has_output(daemon: DaemonProcess, rid: str) -> bool:
    log = daemon.home.events / f"{rid}.jsonl"
    return log.exists() and b"process.stdout" in log.read_bytes()


def test_secret_values_reach_no_file_and_no_output(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config_home = tmp_path / "config"
    (config_home / "adaptord").mkdir(parents=True)
    (config_home / "adaptord" / "config.toml").write_text(
        f'[drivers.command]\nenv = {{CONFIG_TOKEN = "{CONFIG_SECRET}"}}\n'
    )
    daemon_env = {"XDG_CONFIG_HOME": str(config_home)}
    daemon = _start(home, daemon_env)
    lines: list[str] = []
    stdout = bytearray()  # what either daemon printed on stdout (on stderr: ``lines``)
    cli = _Printed(home, config_home)
    rids: dict[str, str] = {}

    rids["script"] = daemon.submit(
        _script(
            {"stdout": f"stdout {SECRET}"},
            {"thinking": f"thinking about {SECRET}"},
            {
                "tool_call": {
                    "name": "lookup",
                    "args": {"token": SECRET},
                    "result": {"echo": HEADER_SECRET},
                }
            },
            {"text": f"the token is {SECRET}"},
        )
    )
    rids["script-fails"] = daemon.submit(
        _script(
            {
                "fail": {
                    "code": "agent_error",
                    "message": f"failed with {SECRET}",
                    "details": {"token": SECRET},
                }
            }
        )
    )
    rids["echo"] = daemon.submit(
        _command('printf "%s\\n" "$API_TOKEN"; printf "err %s\\n" "$API_TOKEN" >&2')
    )
    rids["echo-config"] = daemon.submit(
        _command('printf "%s\\n" "$CONFIG_TOKEN"; echo "$CONFIG_TOKEN" >&2')
    )
    rids["echo-fails"] = daemon.submit(_command('printf "%s\\n" "$API_TOKEN" >&2; exit 3'))
    # 3 s: time enough to enter the driver on a loaded machine, so the deadline is the run's.
    rids["timeout"] = daemon.submit(_command('printf "%s\\n" "$API_TOKEN"; sleep 30', timeout=3))
    rids["rejected"] = daemon.submit({**_script({"text": "x"}), "driver": "nope"})
    # Two the daemon quarantines (quarantine/ keeps them 30 days): under a name misspelled
    # ("<id>.JSON": set aside, and its id gets a rejection verdict), and under an id in use.
    rids["misnamed"] = f"misnamed-{secrets.token_hex(4)}"
    daemon.drop(f"{rids['misnamed']}.JSON", orjson.dumps(_script({"text": f"never {SECRET}"})))
    daemon.verdict(rids["rejected"])
    duplicate = {**_script({"text": f"again {SECRET}"}), "id": rids["rejected"]}
    daemon.drop(f"{rids['rejected']}.json", orjson.dumps(duplicate))
    daemon.wait_for_line(f"id_in_use={rids['rejected']}")
    thread = {"key": f"thread {SECRET[:6]}"}
    rids["thread-1"] = daemon.submit(
        _script(
            {"text": f"one {SECRET}"},
            thread=thread,
            config={"steps": [{"text": f"one {SECRET}"}], "env": ENV, "session": "auto"},
        )
    )

    # A cancel of a running agent that has printed its secret.
    rids["cancel"] = daemon.submit(_command('printf "%s\\n" "$API_TOKEN"; sleep 30'))
    _wait_for(lambda: _has_output(daemon, rids["cancel"]))
    assert cli("cancel", rids["cancel"]).returncode == 0

    # An approval whose title holds the secret, answered from the command line.
    rids["approval"] = daemon.submit(
        _script(
            {"approval": {"kind": "permission", "title": f"use {SECRET}?"}}, {"text": "approved"}
        )
    )
    _wait_for(lambda: any(daemon.home.approvals_pending.iterdir()))
    listed = cli("approvals", "--json")
    assert listed.returncode == 0
    [pending] = orjson.loads(listed.stdout)["result"]
    _succeeded(cli("approvals"), "approvals")
    assert cli("approve", pending["id"]).returncode == 0

    for name in (
        "script",
        "script-fails",
        "echo",
        "echo-config",
        "echo-fails",
        "timeout",
        "rejected",
        "misnamed",
        "thread-1",
        "cancel",
        "approval",
    ):
        daemon.verdict(rids[name])
    rids["thread-2"] = daemon.submit(
        _script(
            {"text": "two"},
            thread=thread,
            config={"steps": [{"text": f"two {SECRET}"}], "env": ENV, "session": "auto"},
        )
    )
    daemon.verdict(rids["thread-2"])

    # A crash while an agent that printed its secret runs; the next daemon settles it.
    rids["crash"] = daemon.submit(_command('printf "%s\\n" "$API_TOKEN"; sleep 30'))
    _wait_for(lambda: _has_output(daemon, rids["crash"]))
    daemon.kill9()
    lines += daemon.lines
    stdout += daemon.stdout
    daemon = _start(home, daemon_env)
    daemon.verdict(rids["crash"])

    # ``adaptor run`` through the daemon, following the run live, plain and as JSON.
    request_file = tmp_path / "request.json"
    request_file.write_bytes(
        orjson.dumps(_script({"stdout": f"live {SECRET}"}, {"text": f"live {SECRET}"}))
    )
    assert cli("run", "--request", str(request_file)).returncode == 0
    assert cli("run", "--json", "--request", str(request_file)).returncode == 0
    assert cli("run", "--request", "-", stdin=request_file.read_bytes()).returncode == 0
    # In this process rather than the daemon's, with the config's secret too.
    echo = _command('printf "%s %s\\n" "$API_TOKEN" "$CONFIG_TOKEN"; echo "$CONFIG_TOKEN" >&2')
    for extra in ([], ["--json"]):
        ran = cli("run", "--no-daemon", *extra, "--request", "-", stdin=orjson.dumps(echo))
        assert ran.returncode == 0

    verdicts = {
        name: orjson.loads(daemon.home.verdict(rid).read_bytes()) for name, rid in rids.items()
    }
    # Each path was really taken.
    assert (
        verdicts["script"]["ok"]
        and verdicts["script"]["result"]["text"] == "the token is <redacted>"
    )
    assert verdicts["echo"]["ok"] and verdicts["echo"]["result"]["text"] == "<redacted>"
    assert verdicts["echo-config"]["result"]["text"] == "<redacted>"
    assert verdicts["script-fails"]["error"]["code"] == "ErrAgentFailed"
    assert verdicts["echo-fails"]["error"]["code"] == "ErrAgentFailed"
    assert verdicts["timeout"]["error"]["code"] == "ErrDeadlineExceeded"
    assert verdicts["rejected"]["error"]["code"] == "ErrInvalidRequest"
    assert verdicts["misnamed"]["error"]["code"] == "ErrInvalidRequest"
    assert "quarantine/" in verdicts["misnamed"]["error"]["message"]
    assert verdicts["cancel"]["error"]["code"] == "ErrRunCancelled"
    assert verdicts["approval"]["ok"] and verdicts["approval"]["result"]["text"] == "approved"
    assert verdicts["thread-2"]["ok"] and verdicts["thread-2"]["result"]["text"] == "two <redacted>"
    assert verdicts["crash"]["error"]["details"]["interrupted"] is True

    # Each command below must have done its work (a command that fails before printing would
    # pass the search below for nothing): its exit status, and something printed on stdout.
    for name, rid in rids.items():
        for args in (["events", rid], ["events", "--json", rid]):
            _succeeded(cli(*args), args, printed=name not in ("rejected", "misnamed"))
        waited = cli("wait", "--json", rid)
        assert waited.returncode == verdicts[name]["exit_code"], (name, waited.stderr)
        assert orjson.loads(waited.stdout)["id"] == rid, (name, waited.stdout)
    _succeeded(cli("events", "--thread", thread["key"]), "events --thread")
    _succeeded(cli("threads", "list"), "threads list")
    _succeeded(cli("threads", "show", thread["key"]), "threads show")
    _succeeded(cli("status", "--json"), "status --json")
    for log in sorted(daemon.home.events.glob("*.jsonl")):
        assert cli("verify-log", str(log)).returncode == 0
    assert daemon.stop() == 0
    lines += daemon.lines
    stdout += daemon.stdout

    assert list(daemon.home.claimed.iterdir()) == []  # the one place a secret may wait for its run
    files = [path for path in home.rglob("*") if path.is_file() and not path.is_symlink()]
    assert len(files) > 50
    assert [path for path in files if _leaks(path.read_bytes())] == []
    assert [line for line in lines if _leaks(line.encode())] == []
    assert any("adaptord: ready" in line for line in lines)  # stderr was read
    assert not _leaks(bytes(stdout)), stdout
    assert [args for args, output in cli.outputs if _leaks(output)] == []
    assert sum(len(output) for _, output in cli.outputs) > 10_000  # they did print
    kept = orjson.loads((_home.Home.at(home).run_dir(rids["echo"]) / "request.json").read_bytes())
    assert kept["config"]["env"] == {"API_TOKEN": "<redacted>"}
    # Both quarantined requests are in quarantine/ (searched above), kept with secrets redacted.
    aside = [orjson.loads(path.read_bytes()) for path in daemon.home.quarantine.iterdir()]
    assert sorted(a["config"]["steps"][0]["text"] for a in aside) == [
        "again <redacted>",
        "never <redacted>",
    ], aside
    assert all(a["config"]["env"] == {"API_TOKEN": "<redacted>"} for a in aside), aside
