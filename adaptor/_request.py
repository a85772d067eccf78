"""Run requests (the spool file format): reading, schema validation, redaction and the
mapping onto the SDK.

Shared by the daemon and by ``adaptor run --no-daemon``: the mapping uses exactly the SDK calls
an in-process program would make, so the same inputs give the same outcome and the same error
identity in both paths.  The schema file ships in ``adaptord/schemas/``.
"""

from __future__ import annotations

import codecs
import hashlib
import importlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

import adaptor
from adaptor import _durable, _home, _nesting, _schema_errors, mcp, policy, skill
from adaptor._redact import MIN_SECRET_LENGTH, REDACTED, Redactor
from adaptor.driver import Descriptor, Driver, InvalidDriverConfigError
from adaptor.drivers import NAMES as DRIVERS
from adaptor.errors import AdaptorError
from adaptor.spool import InvalidRequestError

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator

MAX_DEPTH = 64


@cache
def _validator() -> Draft202012Validator:
    # Imported on first use, not with adaptor: jsonschema costs ~45 ms of every CLI start.
    from jsonschema import Draft202012Validator

    text = resources.files("adaptord").joinpath("schemas/request.schema.json").read_text()
    schema = json.loads(text)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _pointer(path: Iterator[Any] | Any) -> str:
    return "".join(f"/{str(part).replace('~', '~0').replace('/', '~1')}" for part in path)


def decode(data: bytes) -> dict[str, Any]:
    """The JSON object of a request file's bytes (a UTF-8 byte-order mark skipped), not yet
    checked against the schema; ``InvalidRequestError`` when it holds none.  The daemon and
    the CLI (``submit``, ``run --request``) read request files alike through this."""
    try:
        # Windows editors and PowerShell's Out-File start UTF-8 text with a byte-order mark
        # (skipped in approval responses too).
        text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError([{"path": "", "message": f"{_NOT_UTF8}: {exc.reason} at byte {exc.start}"}]) from None
    try:
        obj = _nesting.loads_exactly(text)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError([{"path": "", "message": f"{_NOT_JSON}: {exc}"}]) from None
    except _nesting.InexactNumberError as exc:
        # The value itself is left out: a request's numbers are not checked for secrets.
        raise InvalidRequestError([{"path": exc.where, "message": exc.why}]) from None
    if not isinstance(obj, dict):
        raise InvalidRequestError([{"path": "", "message": "a request must be a JSON object"}])
    if _nesting.deeper_than(obj, MAX_DEPTH):
        raise InvalidRequestError([{"path": "", "message": f"nested deeper than {MAX_DEPTH} levels"}])
    return obj


def parse(data: bytes, request_id: str) -> dict[str, Any]:
    """Decode and validate one request file; raises ``InvalidRequestError`` listing every problem."""
    obj = decode(data)
    problems = [
        {"path": _pointer(error.absolute_path), "message": _schema_errors.message(error)[:500]}
        for error in sorted(_validator().iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if "id" in obj and obj["id"] != request_id and isinstance(obj["id"], str):
        problems.append({"path": "/id", "message": f"must equal the file name stem {request_id!r}"})
    problems.extend(_owner_mark_problems(obj))
    driver = obj.get("driver")
    if isinstance(driver, str) and driver not in DRIVERS:
        problems.append({"path": "/driver", "message": f"unknown driver; one of: {', '.join(DRIVERS)}"})
    workspace = obj.get("workspace")
    if isinstance(workspace, str):
        if not os.path.isabs(workspace):
            problems.append({"path": "/workspace", "message": "must be an absolute path"})
        elif not os.path.isdir(workspace):
            problems.append({"path": "/workspace", "message": "is not an existing directory"})
    problems.extend(_relative_skill_paths(obj.get("skills")))
    thread = obj.get("thread")
    if isinstance(thread, dict) and thread.get("resume_only") is True and thread.get("fork_from"):
        # Silently ignored before: a fork always makes a new thread, it resumes nothing.
        problems.append({"path": "/thread/resume_only", "message": "cannot be true with fork_from (a fork starts a new thread)"})
    config = obj.get("config")
    cwd = config.get("cwd") if isinstance(config, dict) else None
    if isinstance(cwd, str) and "\0" in cwd:
        # No directory has one: the run would fail at its start (an A2A template, every task).
        problems.append({"path": "/config/cwd", "message": "holds a NUL character"})
    elif isinstance(cwd, str) and not os.path.isabs(cwd):
        # The working directory in place of a workspace: refused for the same reason.
        problems.append({"path": "/config/cwd", "message": "must be an absolute path"})
    if problems:
        # Schema messages quote the offending value, which may be a secret in the wrong shape.
        redactor = Redactor(secrets_of(obj))
        raise InvalidRequestError([{**p, "message": redactor.text(p["message"])} for p in problems])
    obj["id"] = request_id
    return obj


def _relative_skill_paths(skills: Any) -> list[dict[str, str]]:
    # Relative to the daemon's working directory (/ under systemd), not to anything the
    # request's author could know: refused like a relative workspace.
    return [
        {"path": f"/skills/{position}/{source}", "message": "must be an absolute path"}
        for position, entry in enumerate(skills if isinstance(skills, list) else ())
        if isinstance(entry, dict)
        for source in ("dir", "archive")
        if isinstance(entry.get(source), str) and not os.path.isabs(entry[source])
    ]


_NOT_JSON = "invalid JSON"
_NOT_UTF8 = "not UTF-8"


def maybe_cut_short(error: InvalidRequestError) -> bool:
    """Whether :func:`parse` refused the request as a file cut short would be: no JSON yet,
    or a character cut in two (a writer may still be at it)."""
    return any(
        problem["path"] == "" and problem["message"].startswith((_NOT_JSON, _NOT_UTF8))
        for problem in error.errors
    )


def _owner_mark_problems(obj: Mapping[str, Any]) -> list[dict[str, str]]:
    # A request setting the mark would hide its agent from its own daemon's clean-up after a
    # crash, or hand it to another home's daemon, which would stop it.
    envs: list[tuple[str, Any]] = []
    config = obj.get("config")
    if isinstance(config, Mapping):
        envs.append(("/config/env", config.get("env")))
    for index, server in enumerate(obj.get("mcp") or ()):
        if isinstance(server, Mapping):
            envs.append((f"/mcp/{index}/env", server.get("env")))
    return [
        {"path": f"{path}/{_home.OWNER_VAR}", "message": "is set by adaptord, to mark the processes it starts"}
        for path, env in envs
        if isinstance(env, Mapping) and _home.OWNER_VAR in env
    ]


def secrets_of(
    request: Mapping[str, Any], driver_defaults: Mapping[str, Any] | None = None
) -> list[str]:
    """Every secret value a run of ``request`` has: driver env values, MCP env values, headers
    and URL passwords.

    ``driver_defaults`` is the daemon config's table for the request's driver, whose ``env``
    (where API keys usually live) reaches the agent as much as the request's own.  Values of
    any JSON type count (a malformed request may put a list where a string belongs, and a
    schema error message would otherwise quote it).  Values shorter than
    :data:`MIN_SECRET_LENGTH` are left out here, for every consumer at once (the redactor, the
    error codec): ``DEBUG=1`` would otherwise turn every "1" of an error message into
    ``<redacted>``.
    """
    found: list[str] = []
    if driver_defaults is not None:
        _leaves(driver_defaults.get("env"), found)
    # Objects in containers of the wrong shape count too (a config given as a list of one
    # object, one MCP server given without its list): the schema error quotes them whole.
    for config in _objects(request.get("config")):
        _leaves(config.get("env"), found)
    for server in _objects(request.get("mcp")):
        _leaves(server.get("env"), found)
        _leaves(server.get("headers"), found)
        found.extend(mcp.url_passwords(server.get("url")))
    return sorted({s for s in found if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)


def _objects(value: Any) -> Iterator[Mapping[str, Any]]:
    """``value`` if it is an object, else the objects in it if it is an array (at any depth)."""
    if isinstance(value, Mapping):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from _objects(item)


def _leaves(value: Any, into: list[str]) -> None:
    if isinstance(value, Mapping):
        for item in value.values():
            _leaves(item, into)
    elif isinstance(value, list):
        for item in value:
            _leaves(item, into)
    elif isinstance(value, str):
        into.append(value)
    elif value is not None and not isinstance(value, bool):
        into.append(str(value))


def redacted_request(request: Mapping[str, Any], secrets: Iterable[str]) -> dict[str, Any]:
    """The copy of a request the daemon keeps: secret values shown as ``<redacted>``.

    ``secrets`` are those of its run (:func:`secrets_of` with the daemon config's driver
    table): a prompt may quote a key the config file holds as much as one of the request's.
    """
    copy = orjson.loads(orjson.dumps(request))
    config = copy.get("config")
    if isinstance(config, dict) and isinstance(config.get("env"), dict):
        config["env"] = dict.fromkeys(config["env"], REDACTED)
    for server in copy.get("mcp") or ():
        if isinstance(server, dict):
            for name in ("env", "headers"):
                if isinstance(server.get(name), dict):
                    server[name] = dict.fromkeys(server[name], REDACTED)
    redacted: dict[str, Any] = Redactor(secrets).value(copy)
    return redacted


def session_of(request: Mapping[str, Any]) -> str:
    """The audit-log session: the thread's safe encoding, else the request id."""
    thread = request.get("thread")
    if isinstance(thread, Mapping) and thread.get("key"):
        return _home.session_for_thread(str(thread["key"]))
    return str(request["id"])


def make_driver(name: str, config: Mapping[str, Any]) -> Driver:
    """Build a built-in driver from a JSON config (pre-invocation identity on failure)."""
    try:
        module = importlib.import_module(f"adaptor.drivers.{name}")
    except ImportError as exc:
        raise InvalidDriverConfigError(name, exc) from exc
    factory: Callable[..., Driver] = module.Driver
    config_type = getattr(module, "Config", None)
    try:
        from_dict = getattr(config_type, "from_dict", None)
        if callable(from_dict):
            return factory(from_dict(dict(config)))
        if config_type is not None:
            return factory(config_type(**config))
        return factory(dict(config))
    except (TypeError, ValueError) as exc:
        raise InvalidDriverConfigError(name, exc) from exc


@dataclass
class Call:
    """An SDK call ready to start: ``start()`` returns the Stream, ``close()`` ends the call."""

    agent: adaptor.Agent
    start: Callable[[], adaptor.Stream]
    close: Callable[[float], None]


class KeptAgents:
    """Agents kept from one request to the next, for drivers whose CLI processes persist.

    A claude thread keeps its CLI process between turns (``process.persistent``), but only
    inside one Agent: building a fresh Agent per request would start a new process for every
    turn.  Requests whose driver, effective driver config and host tools are identical share
    one Agent here; everything else a request sets is passed per run.  At most ``limit``
    Agents are kept; the least recently used one nobody is running on is closed (its kept
    processes with it) to make room.
    """

    def __init__(self, limit: int = 16) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._agents: OrderedDict[bytes, tuple[adaptor.Agent, int]] = OrderedDict()
        self._closed = False

    def checkout(self, key: bytes, make: Callable[[], adaptor.Agent]) -> tuple[adaptor.Agent, Callable[[float], None]]:
        """The Agent kept under ``key`` (made if absent) and the callable that returns it."""
        evicted: list[adaptor.Agent] = []
        with self._lock:
            if self._closed:
                agent = make()
                return agent, agent.close
            entry = self._agents.pop(key, None)
            if entry is None or entry[0].closed:
                entry = (make(), 0)
            agent = entry[0]
            self._agents[key] = (agent, entry[1] + 1)
            while len(self._agents) > self._limit:
                idle = next((k for k, (_, users) in self._agents.items() if users == 0), None)
                if idle is None:
                    break
                evicted.append(self._agents.pop(idle)[0])
        for old in evicted:
            old.close()

        def give_back(timeout: float) -> None:
            del timeout  # the Agent stays open for the next request
            with self._lock:
                current = self._agents.get(key)
                if current is not None and current[0] is agent:
                    self._agents[key] = (agent, current[1] - 1)
                    return
            # Evicted or closed while in use: nobody else holds it.
            agent.close()

        return agent, give_back

    def close(self, timeout: float = 10) -> None:
        """Close every kept Agent (their processes stop); later checkouts keep nothing."""
        with self._lock:
            self._closed = True
            agents = [agent for agent, _ in self._agents.values()]
            self._agents.clear()
        deadline = time.monotonic() + timeout
        for agent in agents:
            agent.close(max(deadline - time.monotonic(), 0.0))


def driver_config(request: Mapping[str, Any], driver_defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The driver config a run of ``request`` gets: its ``config`` over the daemon config's
    table for its driver, ``env`` merged variable by variable."""
    config = {**driver_defaults, **(request.get("config") or {})}
    if isinstance(driver_defaults.get("env"), Mapping) or isinstance(request.get("config", {}).get("env"), Mapping):
        config["env"] = {**(driver_defaults.get("env") or {}), **((request.get("config") or {}).get("env") or {})}
    return config


def preflight(request: Mapping[str, Any], *, driver_defaults: Mapping[str, Any]) -> None:
    """Make the checks a run of ``request`` makes before it starts that depend on nothing but
    the request and ``driver_defaults``; raise the error the run would fail with.  Each check
    is the run's own function (``_run.checked_descriptor``, ``policy.validate``, ...), so the
    two cannot tell a request apart.

    For a request made again and again from one template (an A2A agent's), where a problem
    found at the first task would fail every task.  The checks are the run's own
    (``RunPipeline._static_checks``), in its order; those depending on the moment of the run
    (host tool definitions, the skill catalogue, the thread's stored state) are left to it.
    """
    from adaptor._run import checked_descriptor, checked_schema

    name = str(request["driver"])
    driver = make_driver(name, driver_config(request, driver_defaults))
    descriptor = checked_descriptor(driver)
    run_policy = _policy(request.get("policy"))
    approvals = policy.validate(run_policy, descriptor)
    if isinstance(request.get("thread"), Mapping):
        from adaptor import _thread, memory

        _thread.prelaunch(adaptor.Agent(driver, thread_store=memory.Store()), descriptor)
    mcp.validate(_mcp_servers(request.get("mcp")), descriptor, tools=bool(request.get("tools")))
    _skills(request.get("skills"))
    if request.get("schema") is not None:
        checked_schema(request["schema"], descriptor, approvals, run_policy)
    timeout = request.get("timeout")
    if timeout is not None and timeout <= 0:
        # The run would end at once with DeadlineExceededError, which does not say why.
        raise InvalidRequestError([{"path": "/timeout", "message": "must be more than 0 seconds"}])


def build(
    request: Mapping[str, Any],
    *,
    driver_defaults: Mapping[str, Any],
    thread_store: Any,
    on_approval: Callable[[adaptor.ApprovalRequest], None],
    tools: Mapping[str, Any],
    kept: KeptAgents | None = None,
    skill_provider: skill.Provider | None = None,
) -> Call:
    """Map a validated request onto ``Agent(...)`` and ``run``/``thread(...).run`` options.

    With ``kept``, a driver that keeps CLI processes between turns runs on a shared Agent.
    """
    config = driver_config(request, driver_defaults)
    name = str(request["driver"])
    driver = make_driver(name, config)
    selected_tools = []
    for position, tool_name in enumerate(request.get("tools") or ()):
        if tool_name not in tools:
            raise InvalidRequestError([{"path": f"/tools/{position}", "message": f"no host tool {tool_name!r} in the daemon config"}])
        selected_tools.append(tools[tool_name])

    def make_agent() -> adaptor.Agent:
        return adaptor.Agent(
            driver, thread_store=thread_store, tools=selected_tools, skill_provider=skill_provider
        )

    if kept is not None and _descriptor(name, driver).process.persistent:
        # The key holds secrets (config env) only as a digest.
        identity = [
            name, config, [[t, id(tools[t])] for t in request.get("tools") or ()], id(thread_store), id(skill_provider)
        ]
        key = hashlib.sha256(orjson.dumps(identity, option=orjson.OPT_SORT_KEYS, default=repr)).digest()
        agent, close = kept.checkout(key, make_agent)
    else:
        agent = make_agent()
        close = agent.close
    options: dict[str, Any] = {
        "workspace": request.get("workspace"),
        "model": request.get("model"),
        "timeout": request.get("timeout"),
        "policy": _policy(request.get("policy")),
        "instructions": request.get("instructions"),
        "append_system_prompt": request.get("append_system_prompt"),
        "metadata": request.get("metadata"),
        "skills": _skills(request.get("skills")),
        "mcp": _mcp_servers(request.get("mcp")),
        "on_approval": on_approval,
        "spawn": bool(request.get("spawn", False)),
    }
    if request.get("schema") is not None:
        options["schema"] = request["schema"]
        schema_options = request.get("schema_options") or {}
        options["schema_options"] = adaptor.SchemaOptions(
            name=schema_options.get("name"),
            description=schema_options.get("description"),
            return_invalid=bool(schema_options.get("return_invalid", False)),
        )
    prompt = str(request["prompt"])
    thread = request.get("thread")
    if isinstance(thread, Mapping):
        key_name = str(thread["key"])
        parent = thread.get("fork_from")
        if parent:
            handle = agent.thread(str(parent)).fork(key_name)
        else:
            handle = agent.thread(key_name, resume_only=bool(thread.get("resume_only", False)))
        return Call(agent, lambda: handle.stream(prompt, **options), close)
    return Call(agent, lambda: agent.stream(prompt, **options), close)


def _descriptor(name: str, driver: Driver) -> Descriptor:
    """``driver.descriptor()``, a failure raised as the run reports it: ``InvalidDriverConfigError``
    (exit 3), never an external error."""
    try:
        return driver.descriptor()
    except AdaptorError:
        raise
    except Exception as exc:
        raise InvalidDriverConfigError(name, exc) from exc


def _skills(raw: list[Any] | None) -> tuple[skill.Skill | skill.Ref, ...]:
    """The request's skills as SDK values.  A malformed entry is pinned to its place in the
    request; the rest (empty key, conflicts, unknown catalogue keys) is left to the run, which
    raises the SDK's own skill errors exactly as in-process."""
    parsed = []
    for position, entry in enumerate(raw or ()):
        try:
            parsed.append(skill.from_json(entry))
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError([{"path": f"/skills/{position}", "message": str(exc)}]) from None
    return tuple(parsed)


def _mcp_servers(raw: list[Any] | None) -> tuple[mcp.Server, ...] | None:
    """The request's MCP servers as declarations (``None``: the Agent default).  A malformed
    entry raises ``InvalidMCPConfigError`` naming it, like an in-process declaration."""
    if raw is None:
        return None
    return tuple(mcp.from_json(entry, where=f"mcp[{position}]") for position, entry in enumerate(raw))


def _policy(raw: Mapping[str, Any] | None) -> adaptor.Policy | None:
    if raw is None:
        return None
    approvals = raw.get("approvals") or {}
    return adaptor.Policy(
        sandbox=raw.get("sandbox"),
        web_search=raw.get("web_search"),
        browser=raw.get("browser"),
        active_execution_timeout=raw.get("active_execution_timeout"),
        approvals=adaptor.ApprovalPolicy(**approvals),
    )


def read_limited(path: Path, limit: int) -> bytes:
    """Read a spool file without following links, refusing more than ``limit`` bytes."""
    try:
        return _durable.read_small(path, limit)
    except ValueError as exc:
        raise InvalidRequestError([{"path": "", "message": f"request file is {exc}"}]) from None
