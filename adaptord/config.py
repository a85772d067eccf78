"""The daemon's TOML configuration file.

```toml
workers = 4
grace = 30
one_cpu = true              # the daemon's own threads on one CPU; its agents get them all

[drivers.claude]            # default driver config, merged under each request's "config"
command = "/usr/local/bin/claude"

[tools]
lookup_issue = "mytools.issues:lookup"   # host tools a request may select by name

[skills]
dirs = ["/home/me/skills"]                # skill catalogue directories

[a2a]                                     # adaptord serve --a2a HOST:PORT (docs/a2a.md)
bearer_token_env = "ADAPTORD_A2A_TOKEN"   # or bearer_token = "..."; required off loopback

[a2a.agents.reviewer]                     # served at /agents/reviewer
description = "Reviews a diff"
threads = "per_context"                   # one thread per A2A context (default "none")
[a2a.agents.reviewer.request]             # request template; the A2A message is the prompt
driver = "claude"

[a2a.remotes.helper]                      # targets of the delegate_to_agent host tool
card_url = "https://box.example/agents/helper/.well-known/agent-card.json"

[retention]                               # what the daemon removes, hourly (docs/daemon.md)
keep_days = 30                            # finished requests' files; inf: for ever
quarantine_days = 30
lifecycle_log_mb = 64                     # rotate events/adaptord.jsonl above this size
```
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import os
import re
import shlex
import stat
import sys
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

from adaptor._home import OWNER_VAR, writable_by, xdg_base
from adaptor.drivers import NAMES as DRIVER_NAMES
from adaptor.skill import Directories

if TYPE_CHECKING:
    from adaptor.errors import AdaptorError
    from adaptor.tool import Definition
    from hosttools.a2adelegation import DelegationRequest, DelegationResult, RemoteAgentSpec

DELEGATE_TOOL = "delegate_to_agent"
"""The host tool a request may select when ``[a2a.remotes.*]`` are configured."""

_AGENT_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# The bridge sets these per A2A message; a template cannot.
_TEMPLATE_FORBIDDEN = ("prompt", "id", "format")
_THREAD_MODES = ("none", "per_context")


class ConfigError(ValueError):
    """The configuration file is unreadable or has a bad value; names the file and key."""


def one_line(text: str) -> str:
    """``text`` with its line breaks shown as ``\\n``: each fact the daemon logs (and each item
    ``adaptord check`` reports) stays one line, for journald and grep, whatever an exception's
    message holds (a host tool's module may raise one of several lines)."""
    return "\\n".join(text.splitlines())


@dataclass(frozen=True)
class ExposedAgent:
    """A local agent that ``adaptord serve --a2a`` serves: its card and its request template."""

    key: str
    request: Mapping[str, Any]
    display_name: str = ""
    description: str = ""
    skills: tuple[Mapping[str, Any], ...] = ()
    # "per_context": every message of one A2A context is a turn of one thread.
    threads: str = "none"

    @property
    def name(self) -> str:
        return self.display_name or self.key


@dataclass(frozen=True)
class A2AConfig:
    """The ``[a2a]`` table: agents served over A2A, the bridge's credential, delegation targets."""

    agents: tuple[ExposedAgent, ...] = ()
    bearer_token: str | None = field(default=None, repr=False)
    bearer_token_env: str | None = None
    public_url: str | None = None
    remotes: tuple[RemoteAgentSpec, ...] = ()

    def credential_variables(self) -> frozenset[str]:
        """The names of this process's environment variables that hold credentials of the
        daemon's own (the bridge's token, the remotes' tokens): agents never inherit them."""
        names = {self.bearer_token_env} if self.bearer_token_env else set()
        for remote in self.remotes:
            name = getattr(remote.auth, "name", None)  # BearerTokenFromEnv's variable
            if isinstance(name, str) and name:
                names.add(name)
        return frozenset(names)

    def credential_values(self) -> list[str]:
        """The values of :meth:`credential_variables` this process's environment holds: secrets
        of every run (redacted should one reach a run anyway)."""
        return [os.environ[name] for name in sorted(self.credential_variables()) if os.environ.get(name)]

    def token(self) -> str | None:
        """The bearer token A2A callers must present, or None; the variable is read now."""
        if self.bearer_token is not None:
            return self.bearer_token
        if self.bearer_token_env is None:
            return None
        value = os.environ.get(self.bearer_token_env, "")
        if not value:
            raise ConfigError(
                f"a2a.bearer_token_env: environment variable {self.bearer_token_env!r} is unset or empty"
            )
        why = _unusable_token(value)
        if why:
            raise ConfigError(f"a2a.bearer_token_env: the value of {self.bearer_token_env!r} {why}")
        return value


def _unusable_token(token: str) -> str:
    """Why no caller could ever present ``token``, or ``""``: HTTP drops a header value's
    surrounding whitespace, and a header holds no line break or other control character."""
    if token != token.strip():
        return "begins or ends with whitespace, which no Authorization header can carry"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in token):
        return "holds a control character, which no Authorization header can carry"
    return ""


# The longest a drain may wait for running work: a day.  Beyond it (or infinite, or NaN) the
# drain's deadline cannot be computed, and a stop would never end (or crash instead).
MAX_GRACE = 86400


@dataclass(frozen=True)
class Retention:
    """The ``[retention]`` table (docs/daemon.md, "Disk use"); ``inf`` keeps for ever.

    A month by default: far longer than any script waits to read a verdict, long enough to
    look back at last week's runs after a holiday, and a bound on the home's size (about
    thirty days of requests).
    """

    keep_days: float = 30.0  # a finished request's verdict, run folder and audit log; rotated lifecycle logs
    quarantine_days: float = 30.0  # entries of quarantine/
    lifecycle_log_mb: float = 64.0  # events/adaptord.jsonl is rotated once larger

    @property
    def lifecycle_log_bytes(self) -> float:
        return self.lifecycle_log_mb * 1024 * 1024


# The shortest a finished request's files may be kept: a script reading its verdict the next
# morning must still find it.
MIN_KEEP_DAYS = 1


@dataclass(frozen=True)
class DaemonConfig:
    workers: int = 4
    grace: float = 30.0
    scan_interval: float = 2.0
    # The daemon's own threads on one CPU (agent processes keep them all); see _place_threads.
    one_cpu: bool = True
    drivers: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: dict[str, str] = field(default_factory=dict)
    skill_dirs: tuple[str, ...] = ()
    a2a: A2AConfig = field(default_factory=A2AConfig)
    retention: Retention = field(default_factory=Retention)
    source: str | None = None
    # The top-level settings the file gives itself (the rest are defaults), so that a start or
    # a reload tells which the command line overrides.
    given: frozenset[str] = frozenset()
    # Why the file's secrets are not private (it holds some and others may read it), or None:
    # said by `check`, at a start and at each reload, never refused (see _readable_secrets).
    exposed: str | None = None

    def driver_defaults(self, name: str) -> dict[str, Any]:
        return dict(self.drivers.get(name, {}))

    def skill_catalogue(self) -> Directories | None:
        """The ``[skills] dirs`` as the catalogue requests' ``{"key": ...}`` skills come from."""
        return Directories(self.skill_dirs) if self.skill_dirs else None

    def load_tools(self) -> dict[str, Any]:
        """Import every configured host tool (``module:attribute``)."""
        loaded: dict[str, Any] = {}
        for name, target in self.tools.items():
            module_name, _, attribute = target.partition(":")
            where = f"{self.source}: " if self.source else ""
            if not module_name or not attribute:
                raise ConfigError(f"{where}tools.{name}: expected 'module:attribute', got {target!r}")
            try:
                obj: Any = _tool_module(module_name)
                for part in attribute.split("."):
                    obj = getattr(obj, part)
            # Any failure of the module's own code (a SyntaxError, a relative name, an error it
            # raises at import) is this config's problem, not the daemon's end.
            except (Exception, SystemExit) as exc:
                raise ConfigError(
                    f"{where}tools.{name}: cannot load {target!r}: {type(exc).__name__}: {exc}"
                ) from exc
            loaded[name] = obj
        if self.a2a.remotes:
            if DELEGATE_TOOL in loaded:
                raise ConfigError(f"tools.{DELEGATE_TOOL}: the name is taken by the [a2a.remotes] host tool")
            from adaptor.clients.a2a import require_sdk

            try:  # else every delegation would fail, with adaptord check saying ok
                require_sdk()
            except ImportError as exc:
                where = f"{self.source}: " if self.source else ""
                raise ConfigError(f"{where}a2a.remotes: {exc}") from exc
            loaded[DELEGATE_TOOL] = delegation_tool(self.a2a.remotes)
        return loaded


# Each module load_tools() imported, with its file as it was then (mtime and size; None when
# it has no file, (-1, -1) when the file is gone).
_tool_sources: dict[str, tuple[int, int] | None] = {}


def _source_stamp(module: ModuleType) -> tuple[int, int] | None:
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return None
    try:
        found = os.stat(path)
    except OSError:
        return (-1, -1)
    return (found.st_mtime_ns, found.st_size)


def _tool_module(name: str) -> ModuleType:
    """``name`` imported; imported afresh when its file changed since this last imported it.

    A reload that kept the imported module ran the old code and said nothing of a module that
    no longer imports, which the next start then refused (exit 2).  The fresh module is a new
    object: runs already going keep the old one, whose globals are left alone.  Only the
    module the config names is imported again, not the modules it imports.
    """
    module = sys.modules.get(name)
    if module is not None and name in _tool_sources and _source_stamp(module) != _tool_sources[name]:
        del sys.modules[name]
        importlib.invalidate_caches()  # a file replaced within the finder's cached listing
        try:
            module = importlib.import_module(name)
        except BaseException:
            sys.modules[name] = module  # the failed reload keeps the old config, and its module
            raise
    elif module is None:
        module = importlib.import_module(name)
    _tool_sources[name] = _source_stamp(module)
    return module


def invalid_tools(tools: Mapping[str, Any]) -> dict[str, str]:
    """Why each loaded ``[tools]`` entry that is not a valid tool definition is not one.

    Such an entry loads (a request selecting it then fails with the SDK's own
    ``ErrInvalidDefinition``, as in-process); ``adaptord check`` reports it and ``serve`` warns.
    """
    from adaptor._gateway import require_sdk
    from adaptor.tool import InvalidDefinitionError, check_catalogue

    if tools:
        try:  # without it no tool can be served: every request selecting one fails (exit 3)
            require_sdk()
        except InvalidDefinitionError as exc:
            return dict.fromkeys(tools, str(exc))
    problems: dict[str, str] = {}
    for name, obj in tools.items():
        try:
            check_catalogue([obj])
        except InvalidDefinitionError as exc:
            problems[name] = str(exc).replace("tools[0] is", "it is", 1)
    return problems


def shared_tool_names(tools: Mapping[str, Any]) -> dict[str, list[str]]:
    """The tool names more than one ``[tools]`` key serves (each valid tool's own name, which the
    agent sees), with those keys: each key works alone, but a request selecting two of them
    fails (two tools of one name, ``ErrInvalidDefinition``)."""
    keys: dict[str, list[str]] = {}
    for key, obj in tools.items():
        name = getattr(obj, "name", None)
        if isinstance(name, str):
            keys.setdefault(name, []).append(key)
    return {name: sorted(named) for name, named in keys.items() if len(named) > 1}


def delegation_tool(remotes: tuple[RemoteAgentSpec, ...]) -> Definition:
    """``delegate_to_agent`` over ``remotes`` as an ``adaptor.tool`` definition.

    Every call gets its own A2A clients, closed when it returns: a config reload replaces the
    tool, and pooled clients (one event-loop thread each) would outlive the config that made them.
    """
    from hosttools.a2adelegation import Delegator, Registry, delegate_to_agent

    class OneShot(Delegator):
        def delegate(self, request: DelegationRequest) -> DelegationResult:
            with Delegator(self.registry) as once:
                return once.delegate(request)

    return delegate_to_agent(OneShot(Registry(remotes)), name=DELEGATE_TOOL)


MAX_CONFIG_BYTES = 1 << 20
"""A config file larger than this is refused unread (ConfigError)."""


def default_config_path() -> Path:
    return xdg_base("XDG_CONFIG_HOME", ".config") / "adaptord" / "config.toml"


_READ_AT_RELOADS = "adaptord serve reads its config again at every reload"


def load(
    path: str | os.PathLike[str] | None,
    *,
    required: bool = False,
    regular: bool = False,
    why_regular: str = _READ_AT_RELOADS,
) -> DaemonConfig:
    """Read the config file; a missing default file means defaults, a missing explicit one fails.

    ``regular``: only a regular file (``serve``, which reads it again at every reload: a pipe
    would read empty then, and a FIFO with no writer would hold the reload for good); else a
    pipe (``check --config <(...)``) is read too.  ``why_regular`` is the refusal's reason.
    """
    target = Path(path) if path is not None else default_config_path()
    try:
        if regular:
            # Not blocking on a FIFO's open, then refused by what it is.
            descriptor = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                os.close(descriptor)
                raise ConfigError(f"{target}: not a regular file ({why_regular}: write it to a file)")
            handle: BinaryIO = os.fdopen(descriptor, "rb")
        else:
            handle = target.open("rb")  # a pipe (<(...)) too
        with handle:
            found = os.fstat(handle.fileno())
            untrusted = _writable_by_others(target, found)
            if untrusted is not None:
                raise ConfigError(untrusted)
            data = handle.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:  # /dev/zero, a log named by mistake: never all read
            raise ConfigError(f"{target}: larger than {MAX_CONFIG_BYTES} bytes; is it the config file?")
        # Windows editors start UTF-8 text with a byte-order mark, as request files may.
        text = data.decode("utf-8").removeprefix("\ufeff")
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{target}: {_with_key_named(str(exc), text)}") from exc
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{target}: no such file") from None
        return DaemonConfig()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{target}: {exc}") from exc
    except RecursionError:  # tomllib follows [[[...]]] with Python's stack
        raise ConfigError(f"{target}: nested too deeply to read") from None
    config = _parse(raw, str(target))
    exposed = _readable_secrets(target, found, config)
    return config if exposed is None else dataclasses.replace(config, exposed=exposed)


def _readable_secrets(target: Path, found: os.stat_result, config: DaemonConfig) -> str | None:
    """Why the secrets ``config`` holds (driver ``env`` values, ``a2a.bearer_token``) are not
    private, or ``None``.

    A warning, not a refusal, unlike a file others may write: reading a key is a leak already
    done, not a takeover to come, and a config that served yesterday keeps serving.  Only the
    settings are named, never a value.
    """
    if not stat.S_ISREG(found.st_mode) or not found.st_mode & 0o044:
        return None
    from adaptor import _request

    holding = [
        f"drivers.{name}.env" for name, table in sorted(config.drivers.items())
        if _request.secrets_of({}, table)
    ]
    if config.a2a.bearer_token:
        holding.append("a2a.bearer_token")
    if not holding:
        return None
    who = "others" if found.st_mode & 0o004 else "its group"
    return (f"{target}: readable by {who} (mode {stat.S_IMODE(found.st_mode):o}) and holds secrets "
            f"({', '.join(holding)}); make it private: chmod go-rwx {shlex.quote(os.path.realpath(target))}")


_OVERWRITE = re.compile(r"Cannot overwrite a value \(at line (\d+), column \d+\)")


def _with_key_named(message: str, text: str) -> str:
    """tomllib's "Cannot overwrite a value (at line 7, column 12)", with the key set there (a
    second `workers = 3`, a `command` set twice in one table): the value is never quoted."""
    found = _OVERWRITE.fullmatch(message)
    if found is None:
        return message
    lines = text.splitlines()
    end = int(found.group(1))  # where the second value ends: it may span lines
    for start in range(min(end, len(lines)) - 1, max(end - 1000, 0) - 1, -1):
        key, equals, _ = lines[start].partition("=")
        if not equals:
            continue
        try:
            tomllib.loads("\n".join(lines[start:end]))
        except tomllib.TOMLDecodeError:
            continue  # a line inside a multi-line value
        try:
            tomllib.loads(f"{key} = 0")
        except tomllib.TOMLDecodeError:
            return message  # a quoted key holding "=": not told apart from its value here
        if len(key) > 200:
            return message
        # Said with care: the key may be set once in a table declared twice (`[t]` and `[[t]]`).
        return f"{message}, setting {key.strip()}: that key, or a table holding it, is defined twice"
    return message


def _writable_by_others(target: Path, found: os.stat_result) -> str | None:
    """Why a config file cannot be trusted, or ``None``: it names the commands the daemon runs
    (``[drivers.*] command``, ``[tools]``, ``env``), so one another user owns (root aside) or
    that group or others may write is refused, as a home like that is."""
    if not stat.S_ISREG(found.st_mode):
        return None  # a pipe (check --config <(...)) is the caller's own
    me = os.geteuid()
    if found.st_uid not in (me, 0):
        return f"{target}: belongs to uid {found.st_uid}, not to this user (uid {me}) nor root"
    writable = writable_by(found)
    if writable is not None:
        # The file itself, not /dev/stdin (`check --config /dev/stdin < config.toml`): a chmod of
        # that in the user's shell would change their terminal.
        return (f"{target}: {writable}, who could have the daemon run commands as this user; make "
                f"it private: chmod go-w {shlex.quote(os.path.realpath(target))}")
    return None


def _parse(raw: dict[str, Any], source: str) -> DaemonConfig:
    _refuse_unknown(
        raw, ("workers", "grace", "scan_interval", "one_cpu", "drivers", "tools", "skills", "a2a", "retention"),
        source,
    )
    workers = raw.get("workers", 4)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 256:
        raise ConfigError(f"{source}: workers must be an integer from 1 to 256")
    grace = raw.get("grace", 30)
    if not isinstance(grace, int | float) or isinstance(grace, bool) or not 0 <= grace <= MAX_GRACE:
        raise ConfigError(f"{source}: grace must be a number of seconds from 0 to {MAX_GRACE}")
    scan = raw.get("scan_interval", 2.0)
    if not isinstance(scan, int | float) or isinstance(scan, bool) or not 0.05 <= scan <= 300:
        raise ConfigError(f"{source}: scan_interval must be from 0.05 to 300 seconds")
    one_cpu = raw.get("one_cpu", True)
    if not isinstance(one_cpu, bool):
        raise ConfigError(f"{source}: one_cpu must be true or false")
    drivers = raw.get("drivers", {})
    if not isinstance(drivers, dict) or not all(isinstance(v, dict) for v in drivers.values()):
        raise ConfigError(f"{source}: [drivers.<name>] tables expected")
    for name, table in drivers.items():
        _check_driver_table(name, table, source)
        if isinstance(table.get("env"), dict) and OWNER_VAR in table["env"]:
            raise ConfigError(f"{source}: [drivers.{name}] env: {OWNER_VAR} is set by adaptord itself")
    tools = raw.get("tools", {})
    if not isinstance(tools, dict) or not all(isinstance(v, str) for v in tools.values()):
        raise ConfigError(f"{source}: [tools] maps names to 'module:attribute' strings")
    if "" in tools:  # no request could select it ("tools": [""] is refused)
        raise ConfigError(f"{source}: [tools] has an empty name")
    skills = raw.get("skills", {})
    if not isinstance(skills, dict):
        raise ConfigError(f"{source}: [skills] must be a table (dirs = [...])")
    _refuse_unknown(skills, ("dirs",), f"{source}: [skills]")
    dirs = skills.get("dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise ConfigError(f"{source}: skills.dirs must be a list of paths")
    try:
        Directories(dirs)  # relative to what: the daemon's working directory is / under systemd
    except ValueError as exc:
        raise ConfigError(f"{source}: skills.dirs: {exc}") from None
    return DaemonConfig(
        workers=workers,
        grace=float(grace),
        scan_interval=float(scan),
        one_cpu=one_cpu,
        drivers={str(k): dict(v) for k, v in drivers.items()},
        tools=dict(tools),
        skill_dirs=tuple(dirs),
        a2a=_parse_a2a(raw.get("a2a", {}), source, tools, drivers),
        retention=_parse_retention(raw.get("retention", {}), source),
        source=source,
        given=frozenset(raw),
    )


def _parse_retention(raw: Any, source: str) -> Retention:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [retention] must be a table")
    _refuse_unknown(raw, [f.name for f in dataclasses.fields(Retention)], f"{source}: [retention]")
    values: dict[str, float] = {}
    for name, least, unit in (
        ("keep_days", MIN_KEEP_DAYS, "days"), ("quarantine_days", MIN_KEEP_DAYS, "days"), ("lifecycle_log_mb", 0, "MiB"),
    ):
        value = raw.get(name, getattr(Retention, name))
        number = isinstance(value, int | float) and not isinstance(value, bool)
        # NaN compares false: refused with the rest (inf, for ever, is a number).
        if not number or not (value >= least if least else value > 0):
            bound = f"at least {least}" if least else "more than 0"
            raise ConfigError(f"{source}: retention.{name} must be a number of {unit}, {bound}, or inf (never)")
        values[name] = float(value)
    return Retention(**values)


def _refuse_unknown(table: Mapping[str, Any], known: Collection[str], where: str) -> None:
    """A key nothing reads is a typo whose setting would silently do nothing: refuse it."""
    unknown = sorted(str(key) for key in table if key not in known)
    if not unknown:
        return
    named = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        named.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
    raise ConfigError(
        f"{where}: unknown setting(s): {', '.join(named)}; known: {', '.join(sorted(known))}"
    )


def _check_driver_table(name: str, table: Mapping[str, Any], source: str) -> None:
    """A ``[drivers.<name>]`` table must name a built-in driver and only its ``Config`` fields,
    the keys a request's ``config`` object may hold (checked by the driver's ``from_dict``)."""
    where = f"{source}: [drivers.{name}]"
    if name not in DRIVER_NAMES:
        close = difflib.get_close_matches(name, DRIVER_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{where}: unknown driver{hint}; known: {', '.join(DRIVER_NAMES)}")
    _refuse_unknown(table, _config_fields(name), where)
    cwd = table.get("cwd")
    if isinstance(cwd, str) and "\0" in cwd:  # no directory has one: every run would fail
        raise ConfigError(f"{where}: cwd holds a NUL character")
    if isinstance(cwd, str) and cwd and not os.path.isabs(cwd):  # as a request's config.cwd is
        raise ConfigError(
            f"{where}: cwd must be an absolute path (a relative one names a path under the "
            "daemon's working directory, / under systemd)"
        )
    from adaptor import _request
    from adaptor.errors import AdaptorError

    # A value the driver refuses (env = {A = 1}, grace_period = -1, a bad permission_mode)
    # would fail every run that uses the table, each with ErrInvalidDriverConfig: check the
    # table as a request giving no config of its own gets it.  A field the table may leave to
    # each request (the command driver's command) is stood in for.
    missing = {
        f.name: "probe" for f in dataclasses.fields(_config_class(name))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    probe = {"driver": name, "prompt": "probe"}
    defaults = {**missing, **table}
    try:
        _request.preflight(probe, driver_defaults=defaults)
    except AdaptorError as exc:
        raise ConfigError(f"{where}: {_described(exc, _request.secrets_of(probe, defaults))}") from None


def _config_class(driver: str) -> Any:
    """A built-in driver's ``Config`` dataclass."""
    return importlib.import_module(f"adaptor.drivers.{driver}").Config


def _config_fields(driver: str) -> list[str]:
    """The keys a built-in driver's config takes: its ``Config`` fields."""
    return [f.name for f in dataclasses.fields(_config_class(driver))]


def _parse_a2a(
    raw: Any, source: str, tools: Mapping[str, str], drivers: Mapping[str, Mapping[str, Any]]
) -> A2AConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: [a2a] must be a table")
    unknown = sorted(set(raw) - {"bearer_token", "bearer_token_env", "public_url", "agents", "remotes"})
    if unknown:
        raise ConfigError(f"{source}: unknown a2a setting(s): {', '.join(unknown)}")
    token, token_env = raw.get("bearer_token"), raw.get("bearer_token_env")
    if token is not None and token_env is not None:
        raise ConfigError(f"{source}: a2a: set bearer_token or bearer_token_env, not both")
    for name, value in (("bearer_token", token), ("bearer_token_env", token_env)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{source}: a2a.{name} must be a non-empty string")
    if isinstance(token, str) and _unusable_token(token):
        raise ConfigError(f"{source}: a2a.bearer_token {_unusable_token(token)}")
    public_url = raw.get("public_url")
    if public_url is not None:
        from adaptor.clients.a2a import origin_of

        try:
            origin_of(public_url if isinstance(public_url, str) else "")
        except ValueError:
            raise ConfigError(f"{source}: a2a.public_url must be an absolute http(s) URL") from None
        parts = urlsplit(public_url)
        # The URL goes into every public card, the log and adaptord.json: a password in it would
        # be published (and a query or fragment would end up before each card's path).
        if "@" in parts.netloc or parts.query or parts.fragment or public_url.endswith(("?", "#")):
            raise ConfigError(
                f"{source}: a2a.public_url must be a base URL without user:password@, query or fragment"
            )
        public_url = public_url.rstrip("/")
    remotes = _parse_remotes(raw.get("remotes", {}), source)
    selectable = set(tools) | ({DELEGATE_TOOL} if remotes else set())
    agents = raw.get("agents", {})
    if not isinstance(agents, dict) or not all(isinstance(v, dict) for v in agents.values()):
        raise ConfigError(f"{source}: [a2a.agents.<name>] tables expected")
    return A2AConfig(
        agents=tuple(
            _parse_agent(key, value, source, selectable, drivers) for key, value in agents.items()
        ),
        bearer_token=token,
        bearer_token_env=token_env,
        public_url=public_url,
        remotes=remotes,
    )


def _parse_agent(
    key: str, raw: dict[str, Any], source: str, tools: set[str], drivers: Mapping[str, Mapping[str, Any]]
) -> ExposedAgent:
    where = f"{source}: a2a.agents.{key}"
    if not _AGENT_KEY.fullmatch(key) or key in (".", ".."):
        # (".." and "." are path segments: /agents/.. is /, where no agent answers.)
        raise ConfigError(f"{where}: the name must match [A-Za-z0-9_.-]{{1,64}}, and not be . or ..")
    unknown = sorted(set(raw) - {"display_name", "description", "skills", "request", "threads"})
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s): {', '.join(unknown)}")
    for name in ("display_name", "description"):
        if not isinstance(raw.get(name, ""), str):
            raise ConfigError(f"{where}.{name} must be a string")
    threads = raw.get("threads", "none")
    if threads not in _THREAD_MODES:
        raise ConfigError(f"{where}.threads must be one of: {', '.join(_THREAD_MODES)}")
    template = raw.get("request")
    if not isinstance(template, dict):
        raise ConfigError(f"{where}.request: a request template table is required")
    forbidden = _TEMPLATE_FORBIDDEN + (("thread",) if threads == "per_context" else ())
    taken = [name for name in forbidden if name in template]
    if taken:
        raise ConfigError(f"{where}.request: {', '.join(taken)}: set by the bridge per message, not here")
    from adaptor import _home, _request
    from adaptor.errors import AdaptorError
    from adaptor.spool import InvalidRequestError

    # The same validation a spool request gets, so a bad template fails at start, not per task.
    try:
        # As a request file is written: orjson alone writes NaN and inf as null, which passed
        # here and then failed every message to the agent ("too large: ... inf").
        _request.parse(_home.request_file_bytes({**template, "prompt": "probe"}), "a2a-template")
    except InvalidRequestError as exc:
        raise ConfigError(f"{where}.request: {_described(exc, [])}") from None
    except (ValueError, TypeError) as exc:  # (orjson's JSONEncodeError is a TypeError)
        raise ConfigError(f"{where}.request: {exc}") from None
    missing = [name for name in template.get("tools") or () if name not in tools]
    if missing:
        raise ConfigError(f"{where}.request.tools: no host tool(s) {', '.join(map(repr, missing))}")
    driver = str(template["driver"])
    _refuse_unknown(template.get("config") or {}, _config_fields(driver), f"{where}.request.config")
    # A task's request as the bridge makes it: with per-context threads it names a thread.
    probe = {**template, "prompt": "probe"} | ({"thread": {"key": "probe"}} if threads == "per_context" else {})
    defaults = drivers.get(driver, {})
    try:
        _request.preflight(probe, driver_defaults=defaults)
    except AdaptorError as exc:
        # The driver config checked is the template's over [drivers.<driver>]: the fault may be there.
        merged = f" (over [drivers.{driver}])" if defaults else ""
        problem = _described(exc, _request.secrets_of(probe, defaults))
        raise ConfigError(f"{where}.request{merged}: {problem}") from None
    return ExposedAgent(
        key=key,
        request=template,
        display_name=raw.get("display_name", ""),
        description=raw.get("description", ""),
        skills=_parse_skills(raw.get("skills", []), f"{where}.skills"),
        threads=threads,
    )


def _described(error: AdaptorError, secrets: list[str]) -> str:
    """A request template's problem as config error text, with ``secrets`` redacted."""
    from adaptor import _redact
    from adaptor.spool import InvalidRequestError

    if isinstance(error, InvalidRequestError):
        text = "; ".join(f"{p['path'] or '/'}: {p['message']}" for p in error.errors)
    else:
        text = str(error)
    return _redact.Redactor(secrets).text(text)


def _parse_skills(raw: Any, where: str) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(raw, list) or not all(isinstance(s, dict) for s in raw):
        raise ConfigError(f"{where} must be a list of tables")
    for skill in raw:
        unknown = sorted(set(skill) - {"id", "name", "description", "tags"})
        if unknown:
            raise ConfigError(f"{where}: unknown skill key(s): {', '.join(unknown)}")
        if not isinstance(skill.get("id"), str) or not skill["id"]:
            raise ConfigError(f"{where}: every skill needs a non-empty id")
        if not all(isinstance(skill.get(k, ""), str) for k in ("name", "description")):
            raise ConfigError(f"{where}: skill name and description must be strings")
        tags = skill.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ConfigError(f"{where}: skill tags must be a list of strings")
    return tuple(dict(skill) for skill in raw)


def _parse_remotes(raw: Any, source: str) -> tuple[RemoteAgentSpec, ...]:
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(f"{source}: [a2a.remotes.<key>] tables expected")
    from hosttools.a2adelegation import RemoteAgentSpec

    specs = []
    for key, value in raw.items():
        if "key" in value:
            raise ConfigError(f"{source}: a2a.remotes.{key}: the key is the table name; remove 'key'")
        try:
            specs.append(RemoteAgentSpec.from_mapping({**value, "key": key}))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: a2a.remotes.{key}: {exc}") from None
    return tuple(specs)
