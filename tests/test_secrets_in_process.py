"""Secrets an agent prints back are shown nowhere by an in-process run.

A provider's 401 quotes the key it was given ("Incorrect API key provided: sk-..."), and the
CLI prints it: it reached the stderr/stdout events, the error's message, the Result's raw
streams and text, the error's wire form and ``adaptor run --no-daemon``.  The secrets of a run
are its driver config's ``env`` values, the credential variables its CLI inherits from this
process, and its MCP servers' env values and headers (docs/drivers.md, "Secrets").
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import adaptor
from adaptor import events
from adaptor.drivers import command, script
from tests.daemon_harness import DaemonProcess
from tests.drivers.conftest import shown

SECRET = "sk-proj-Zq81xVt0KEY0000secret"

# A CLI that fails at once the way a real one does on a bad key: quoting it on both streams.
_FAKE_CLI = """#!/bin/sh
for name in {names}; do
  eval "value=\\$$name"
  if [ -n "$value" ]; then
    echo "Incorrect API key provided: $value"
    echo "401 Unauthorized: Incorrect API key provided: $value" >&2
  fi
done
exit 1
"""


def fake_cli(tmp_path: Path, *names: str) -> str:
    path = tmp_path / "fake-cli"
    path.write_text(_FAKE_CLI.format(names=" ".join(names)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def run(agent: adaptor.Agent, **options: Any) -> tuple[list[adaptor.Event], BaseException | None, adaptor.Result | None]:
    stream = agent.stream("go", **options)
    evs = list(stream)
    try:
        return evs, None, stream.result()
    except Exception as exc:
        return evs, exc, None


@pytest.mark.parametrize(
    ("driver", "variable"),
    [
        ("claude", "ANTHROPIC_API_KEY"),
        ("claude", "ANTHROPIC_AUTH_TOKEN"),
        ("codex", "OPENAI_API_KEY"),
        ("codex", "CODEX_API_KEY"),
        ("gemini", "GEMINI_API_KEY"),
        ("gemini", "GOOGLE_API_KEY"),
        ("cursor", "CURSOR_API_KEY"),
        ("codebuddy", "CODEBUDDY_API_KEY"),
    ],
)
def test_a_credential_inherited_from_the_environment_and_quoted_back_is_shown_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver: str, variable: str
) -> None:
    monkeypatch.setenv(variable, SECRET)
    module = importlib.import_module(f"adaptor.drivers.{driver}")
    config = module.Config(command=fake_cli(tmp_path, variable))
    with adaptor.Agent(module.Driver(config), workspace=str(tmp_path)) as agent:
        evs, error, result = run(agent)
    assert isinstance(error, adaptor.AgentFailedError)
    assert "Incorrect API key provided: <redacted>" in str(error)  # the CLI did quote it
    assert SECRET not in shown(evs, error, result)


def test_a_config_env_value_quoted_back_is_shown_nowhere(tmp_path: Path) -> None:
    # A name no driver knows (codex's custom providers pick their own, like MOCK_API_KEY):
    # every value of the config's env is a secret.
    config = command.Config(command=fake_cli(tmp_path, "MY_PROVIDER_KEY"), env={"MY_PROVIDER_KEY": SECRET})
    with adaptor.Agent(command.Driver(config), workspace=str(tmp_path)) as agent:
        evs, error, result = run(agent)
    assert error is not None and "<redacted>" in str(error)
    assert SECRET not in shown(evs, error, result)


def test_other_inherited_variables_are_not_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the credential variables the CLI reads: the rest of the environment (paths, a
    # proxy, a locale) would otherwise vanish from every message.
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("SOME_SETTING", "a-plain-setting-value")
    module = importlib.import_module("adaptor.drivers.claude")
    config = module.Config(command=fake_cli(tmp_path, "ANTHROPIC_API_KEY", "SOME_SETTING"))
    with adaptor.Agent(module.Driver(config), workspace=str(tmp_path)) as agent:
        evs, error, result = run(agent)
    everything = shown(evs, error, result)
    assert SECRET not in everything and "a-plain-setting-value" in everything


def test_every_kind_of_output_is_redacted(tmp_path: Path) -> None:
    # What a model echoes lands everywhere: text, reasoning, tool arguments and results,
    # raw lines, approval requests (which the handler sees too), the failure's details.
    key = SECRET + "\u00e9"  # JSON printed ASCII-only shows it escaped: sk-...secret\u00e9
    nested = {"headers": {"Authorization": f"Bearer {key}"}, "list": [key]}
    steps = (
        {"text": f"the key is {key}"},
        {"thinking": f"I found {key} in .env"},
        {"tool_call": {"name": "Bash", "args": {"command": f"curl -H 'x-api-key: {key}'"},
                       "result": nested}},
        {"stdout": f"raw {key}"},
        {"stderr": json.dumps({"echo": key}, ensure_ascii=True)},
        {"approval": {"kind": "permission", "title": f"run with {key}?"}},
        {"output_json": {"key": key}},
        {"fail": {"code": "auth", "message": f"bad key {key}", "details": {"key": key}}},
    )
    config = script.Config(steps=steps, env={"API_KEY": key})
    seen: list[adaptor.ApprovalRequest] = []

    def approve(request: adaptor.ApprovalRequest) -> None:
        seen.append(request)
        request.approve()

    with adaptor.Agent(script.Driver(config), on_approval=approve) as agent:
        evs, error, result = run(agent)
    assert isinstance(error, adaptor.RunError) and error.details == {"key": "<redacted>"}
    assert error.result is not None and error.result.text == '{"key":"<redacted>"}'
    kinds = {events.event_kind(e).split(".")[0] for e in evs}
    assert {"text", "thinking", "tool_call", "tool_result", "process", "notice"} <= kinds
    assert seen and seen[0].title == "run with <redacted>?"
    assert SECRET not in shown(evs, error, result) + repr([events.to_json(r) for r in seen])


def test_adaptor_run_no_daemon_shows_no_inherited_credential(tmp_path: Path) -> None:
    request = {"driver": "claude", "prompt": "go", "workspace": str(tmp_path),
               "config": {"command": fake_cli(tmp_path, "ANTHROPIC_API_KEY")}}
    env = {**os.environ, "ANTHROPIC_API_KEY": SECRET, "XDG_CONFIG_HOME": str(tmp_path / "config"),
           "ADAPTORD_HOME": str(tmp_path / "home")}
    outputs = []
    for extra in ([], ["--json"]):
        proc = subprocess.run(
            [sys.executable, "-m", "adaptor", "run", "--no-daemon", "--request", "-", *extra],
            input=json.dumps(request), capture_output=True, text=True, env=env, timeout=120,
        )
        assert proc.returncode == 1, proc.stderr
        outputs += [proc.stdout, proc.stderr]
    assert all(SECRET not in text for text in outputs)
    assert "Incorrect API key provided: <redacted>" in outputs[1]


def test_a_credential_in_the_daemons_environment_reaches_no_file_of_its_home(tmp_path: Path) -> None:
    # The daemon runs its requests through the same pipeline: a key its agents inherit from
    # the daemon's own environment (a unit's Environment=) is redacted like a config's.
    daemon = DaemonProcess(tmp_path / "home", env={"ANTHROPIC_API_KEY": SECRET}).start()
    rid = daemon.submit({"driver": "claude", "prompt": "go", "workspace": str(tmp_path),
                         "config": {"command": fake_cli(tmp_path, "ANTHROPIC_API_KEY")}})
    verdict = daemon.verdict(rid)
    assert daemon.stop() == 0
    assert "Incorrect API key provided: <redacted>" in verdict["error"]["message"]
    assert daemon.files_holding(SECRET) == []
    assert all(SECRET not in line for line in daemon.lines)


def test_a_session_id_equal_to_a_secret_still_resumes_its_session() -> None:
    # Redaction is for what a run hands out; the checkpoint goes back to the driver, and a
    # thread whose session id happened to equal an env value must still resume that session.
    from adaptor.memory import Store

    session = "session-also-in-env-42"
    driver = script.Driver(
        script.Config(steps=({"text": "hello"},), session=session, env={"LABEL": session})
    )
    store = Store()
    with adaptor.Agent(driver, thread_store=store) as agent:
        first = agent.thread("t").run("one")
        stream = agent.thread("t").stream("two")
        seen = [adaptor.events.to_json(event) for event in stream]
        second = stream.result()
        record = agent.thread("t").checkpoint()
    assert session not in json.dumps(first.to_json()) + json.dumps(second.to_json())
    # run.finished names the session: it reached the stream as is (the daemon's copy did not).
    assert [e["thread_id"] for e in seen if e["kind"] == "run.finished"] == ["<redacted>"]
    assert session not in json.dumps(seen)
    assert record.state.resume_id == session


class _QuotingRefusal(script.Driver):
    """A driver of one's own whose configuration check quotes the token it was given."""

    def secret_values(self) -> list[str]:
        return [SECRET]

    def validate_config(self, config: object | None = None) -> None:
        raise ValueError(f"token {SECRET} is malformed")


def test_a_refused_configuration_does_not_show_the_drivers_secret() -> None:
    # The refusal comes before the run has its secrets: the error, its cause and its wire form
    # quoted the token.
    stream = adaptor.Agent(_QuotingRefusal(script.Config(steps=()))).stream("go")
    assert list(stream) == []  # refused before admission
    with pytest.raises(adaptor.InvalidDriverConfigError) as caught:
        stream.result()
    err = caught.value
    assert "malformed" in str(err) and "<redacted>" in str(err)
    shown_anywhere = [str(err), repr(err), str(err.__cause__), json.dumps(err.to_wire())]
    assert not [text for text in shown_anywhere if SECRET in text]


@pytest.mark.parametrize(
    "policy",
    [adaptor.Policy(sandbox=SECRET), adaptor.Policy(approvals=adaptor.ApprovalPolicy(permission=SECRET))],
    ids=["sandbox", "approval mode"],
)
def test_a_refused_policy_value_that_is_a_secret_is_not_shown(policy: adaptor.Policy) -> None:
    # The policy is checked before the run had its secrets: the InvalidPolicyError named the
    # value in its message, fields and wire form, where the daemon's verdict said <redacted>.
    agent = adaptor.Agent(script.Driver(script.Config(steps=({"text": "a"},), env={"TOKEN": SECRET})))
    with pytest.raises(adaptor.AdaptorError) as caught:
        agent.run("go", policy=policy)
    err = caught.value
    assert "<redacted>" in str(err)
    shown_anywhere = [str(err), repr(err), json.dumps(err.to_wire()), repr(err.fields())]
    assert not [text for text in shown_anywhere if SECRET in text]


@pytest.mark.parametrize("kind", ["permission", "question", "plan_review"])
def test_an_env_value_naming_an_approval_kind_still_asks(kind: str) -> None:
    # The approval's kind, equal to an env value, was replaced: the request came as one of
    # kind "<redacted>", which was denied at once, the handler never asked.
    asked: list[adaptor.ApprovalRequest] = []

    def handler(req: adaptor.ApprovalRequest) -> None:
        asked.append(req)
        if kind == "question":
            req.answer("a")
        else:
            req.approve()

    step: dict[str, Any] = {"approval": {"kind": kind, "title": "go on?"}}
    if kind == "question":
        step["approval"]["choices"] = ["a", "b"]
    driver = script.Driver(script.Config(steps=(step, {"text": "done"}), env={"X": kind}))
    policy = adaptor.Policy(approvals=adaptor.ApprovalPolicy(**{kind: "ask"}))
    result = adaptor.Agent(driver, on_approval=handler).run("go", policy=policy)
    assert result.text == "done"
    assert [req.kind for req in asked] == [kind]


class _OneSecretBare(script.Driver):
    """A driver of one's own whose secret_values() returns its one secret as a bare str."""

    def secret_values(self) -> str:  # type: ignore[override]
        return SECRET


def test_secret_values_returning_a_bare_string_is_refused_not_ignored() -> None:
    # A str is a Sequence[str] (mypy --strict let it through), read as its characters, each
    # too short to redact: the run went ahead and showed the secret.
    driver = _OneSecretBare(script.Config(steps=({"text": f"key={SECRET}"},)))
    with pytest.raises(adaptor.InvalidDriverConfigError) as caught:
        adaptor.Agent(driver).run("go")
    assert "secret_values() must return a sequence of strings, not one str" in str(caught.value.cause)


class _DictDescriptor(script.Driver):
    """A driver of one's own whose descriptor() returns a dict."""

    def descriptor(self) -> Any:
        return {"type": "mine"}


class _FailingDescriptor(script.Driver):
    def descriptor(self) -> Any:
        raise RuntimeError("no descriptor today")


def test_a_descriptor_that_is_no_descriptor_is_a_typed_refusal_naming_the_driver() -> None:
    # A dict made agent.run() raise a bare AttributeError ('dict' object has no attribute
    # 'type'); a failing descriptor() named the driver '__main__' after its module.
    with pytest.raises(adaptor.InvalidDriverConfigError) as caught:
        adaptor.Agent(_DictDescriptor(script.Config(steps=()))).run("go")
    assert "must return an adaptor.driver.Descriptor, not dict" in str(caught.value.cause)
    with pytest.raises(adaptor.InvalidDriverConfigError) as failed:
        adaptor.Agent(_FailingDescriptor(script.Config(steps=()))).run("go")
    assert failed.value.driver == "test_secrets_in_process"  # its module, a real name here


def test_a_driver_of_a_script_is_named_by_its_class_not_main() -> None:
    program = (
        "import adaptor\n"
        "from adaptor.drivers import script\n"
        "class MyDriver(script.Driver):\n"
        "    def descriptor(self):\n"
        "        raise RuntimeError('no descriptor today')\n"
        "try:\n"
        "    adaptor.Agent(MyDriver(script.Config(steps=()))).run('go')\n"
        "except adaptor.InvalidDriverConfigError as err:\n"
        "    print(err.driver)\n"
    )
    ran = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert ran.stdout == "MyDriver\n", ran.stderr


class _EmitsLate(script.Driver):
    """A driver of one's own whose stray thread goes on emitting after run() returned."""

    def run(self, request: Any, sink: Any) -> Any:
        import threading

        from adaptor.events import TextDelta

        response = super().run(request, sink)
        done = threading.Event()

        def stray() -> None:
            for _ in range(3):
                sink.emit(TextDelta(message_id="late", phase="start"))
            done.set()

        self.stray = threading.Thread(target=stray)
        self.late = done
        return response


def test_an_emit_after_run_returned_is_dropped_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    # Events a driver emitted after run() returned vanished without a word.
    driver = _EmitsLate(script.Config(steps=({"text": "ok"},)))
    with adaptor.Agent(driver) as agent:
        result = agent.run("go")
        with caplog.at_level("WARNING", logger="adaptor.driver"):
            driver.stray.start()
            driver.late.wait(10)
    assert result.text == "ok"
    warned = [r.getMessage() for r in caplog.records if r.name == "adaptor.driver"]
    assert len(warned) == 1 and "emitted TextDelta after its run() returned; dropped" in warned[0]


@dataclasses.dataclass(frozen=True)
class _ApiKey:
    """A value of a user's own that refuses anything but a key's shape."""

    value: str

    def __post_init__(self) -> None:
        if not self.value.startswith("sk-"):
            raise ValueError("not an API key")


def test_an_error_whose_secret_cannot_be_replaced_in_place_still_ends_the_run() -> None:
    # Redacting the error rebuilt the _ApiKey with "<redacted>", which it refused: the run's
    # thread died with that ValueError, result() waited for ever and no RunFinished came.
    def leaky(request: adaptor.ApprovalRequest) -> None:
        raise RuntimeError("refused", _ApiKey(SECRET))

    config = script.Config(env={"TOKEN": SECRET}, steps=({"approval": {"kind": "permission"}}, {"text": "x"}))
    agent = adaptor.Agent(script.Driver(config), on_approval=leaky)
    stream = agent.stream("go")
    outcome: list[BaseException] = []
    seen: list[adaptor.Event] = []

    def settle() -> None:
        seen.extend(stream)
        try:
            stream.result()
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=settle, daemon=True)
    waiter.start()
    waiter.join(60)
    assert not waiter.is_alive(), "result() never returned"
    (error,) = outcome
    assert isinstance(error, adaptor.AgentFailedError), error
    finished = [e for e in seen if isinstance(e, events.RunFinished)]
    assert len(finished) == 1 and finished[0].failed
    cause = error.cause
    shown_everywhere = [str(error), repr(error), repr(cause), str(cause), finished[0].message, json.dumps(error.to_wire())]
    assert not any(SECRET in text for text in shown_everywhere), shown_everywhere
    assert "<redacted>" in repr(cause)  # what the key showed, redacted, stands in for it
    agent.close()


def test_an_mcp_servers_url_password_quoted_back_is_shown_nowhere() -> None:
    # Its headers' values were secrets, the password of its http://user:password@ URL not.
    password = "pw-Zq81" + SECRET[-10:]
    server = adaptor.mcp.http("docs", f"http://alice:{password}@127.0.0.1:9/mcp")
    steps = ({"text": f"connecting with {password}"}, {"stdout": f"url has {password}"})
    with adaptor.Agent(script.Driver(script.Config(steps=steps))) as agent:
        evs, error, result = run(agent, mcp=[server])
    assert error is None and result is not None and result.text == "connecting with <redacted>"
    assert password not in shown(evs, error, result)
