"""Host-defined tools served to agent CLIs.

::

    from adaptor import tool

    @dataclass
    class IssueQuery:
        number: int

    def lookup(query: IssueQuery) -> dict[str, str]:
        if query.number not in issues:
            raise tool.reject("not_found", "no such issue")
        return issues[query.number]

    lookup_issue = tool.define("lookup_issue", "Fetch an issue by number", lookup,
                               input=IssueQuery, revision="1", read_only=True)
    agent = adaptor.Agent(driver, tools=[lookup_issue])

``input``/``output`` are a dataclass, a TypedDict, a pydantic model class or a JSON Schema
``dict`` (draft 2020-12, local references only), compiled by :func:`adaptor.schema.compile_schema`.
``input`` must describe a JSON object; ``None`` means "no arguments".  The handler is a plain
(synchronous) callable taking one argument: an instance of the ``input`` type (a ``dict`` for a
JSON Schema or ``None`` input); one that cannot be called with one positional argument is an
invalid definition.  It may be called from several threads at once.  Its return
value is JSON-encoded (dataclasses and pydantic models included) and, with an ``output``,
validated; a ``str`` result without an ``output`` reaches the model as plain text.

:func:`define` never raises: a definition that cannot form a valid tool is kept and raises
:class:`InvalidDefinitionError` when a run starts, before the driver runs (and from
:meth:`Definition.descriptor`).

The model sees exactly three kinds of failure: the message of a :func:`reject` raised by the
handler, a safe ``invalid_input`` message that names fields but never echoes values, and a
fixed generic message for everything else (a failed output check included).  The full
exception goes to the ``adaptor.tool`` logger, never to the model.

Arguments and results are checked against a schema that could be costly to check (a
``pattern``, ``uniqueItems``, references: :func:`adaptor._schema_checker.costly`) in a child
process cut off after ``adaptor.schema.VALIDATION_LIMIT``: arguments not checked in time are
``invalid_input``, a result not checked in time is an :class:`InvalidOutputError`.  Other
schemas are checked in process.

Annotations are tri-state hints for the CLI: ``None`` leaves the hint unset, and MCP then
assumes a tool may be destructive and open-world.

A handler cannot be stopped, but it can stop itself: :func:`cancelled` says when the run it
serves has ended (cancelled, out of time, or finished), so nobody waits for its answer.  A handler
that waits on something slow (a remote agent, a subprocess, a poll) should wait on it.

An Agent serves its tools to the CLI through its tool gateway (``adaptor._gateway``), which
needs the ``mcp`` extra; without it a run is refused before launch with
:class:`InvalidDefinitionError` (its cause the ``ImportError``).  Thread runs need a
``revision`` on every tool: the catalogue, revisions included, is part of a thread's
compatibility fingerprint, and a tool without one refuses the run with
``ThreadIncompatibleError``.

A result bigger than ``max_result_bytes`` (:data:`MAX_RESULT_BYTES`, 1 MiB, unless the
definition says otherwise) is never sent: the model gets an error result naming the size and
the limit instead.  Without it each CLI does something else with an oversized result: claude
refuses one above 16 MB, codex cuts one of about 1 MiB and more short (docs/sdk.md, "Host
tools", has the measurements).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, NoReturn, final

import orjson

from adaptor import _nesting, errors
from adaptor.errors import AdaptorError

if TYPE_CHECKING:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError

    from adaptor._schema_checker import Judge
    from adaptor.schema import CompiledSchema

__all__ = [
    "GENERIC_FAILURE",
    "MAX_RESULT_BYTES",
    "Annotations",
    "CallOutcome",
    "Cancellation",
    "Definition",
    "InvalidDefinitionError",
    "InvalidInputError",
    "InvalidOutputError",
    "ToolDescriptor",
    "as_rejection",
    "cancelled",
    "catalogue_fingerprint",
    "check_catalogue",
    "define",
    "reject",
]

NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,128}")
GENERIC_FAILURE: Final = "the tool failed while handling this request"
INVALID_INPUT_CODE: Final = "invalid_input"
# The default ``max_result_bytes``: codex (0.171) cuts a result of this size and more short,
# claude (2.1.332) refuses one above 16 MB.
MAX_RESULT_BYTES: Final = 1_048_576

_DEFAULT_REJECT_CODE = "rejected"
_DEFAULT_REJECT_MESSAGE = "tool request rejected"
_MAX_CODE_BYTES = 64
_MAX_MESSAGE_BYTES = 4096
_MAX_ECHO_BYTES = 64
_INVALID_JSON: Final = "invalid JSON arguments; send a JSON object and retry"
_INEXACT_NUMBER: Final = (
    "a number in the arguments cannot be read exactly (an integer past 64 bits, or past a "
    "float's range); send a number within range (or text, where the field takes text) and retry"
)
_NO_ARGUMENTS: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {},
    "additionalProperties": False,
}

log = logging.getLogger("adaptor.tool")


class InvalidDefinitionError(AdaptorError):
    """A tool definition cannot form a valid tool; raised before the driver runs."""

    code = "tool.ErrInvalidDefinition"
    exit_code = 3
    default_message = "invalid tool definition"


class InvalidInputError(AdaptorError):
    """The model's arguments fail validation; the model sees a safe message naming no values."""

    code = "tool.ErrInvalidInput"
    default_message = "invalid tool input"


class InvalidOutputError(AdaptorError):
    code = "tool.ErrInvalidOutput"
    default_message = "invalid tool output"


# --- rejections --------------------------------------------------------------------------------

# Only objects built by ``reject`` carry this exact object; a lookalike class with the same
# attributes, or a subclass, is not a rejection.
_MARKER: Final = object()


@final
class _Rejection(Exception):
    def __init_subclass__(cls, **kwargs: Any) -> None:
        raise TypeError("tool rejections cannot be subclassed; use adaptor.tool.reject()")

    def __init__(self, code: str, message: str, marker: object) -> None:
        if marker is not _MARKER:
            raise TypeError("use adaptor.tool.reject(code, message)")
        super().__init__(message)
        self.code = code
        self.message = message
        self._marker = marker

    def __repr__(self) -> str:
        return f"tool.reject({self.code!r}, {self.message!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own would call the class with the message alone, which it refuses.
        return reject, (self.code, self.message)


def reject(code: str, message: str) -> Exception:
    """The one model-visible expected failure: ``raise tool.reject("not_found", "no such issue")``.

    ``code`` is trimmed and must match ``[A-Za-z0-9_.-]`` in at most 64 bytes, else it becomes
    ``"rejected"``; ``message`` is trimmed and must be non-empty and at most 4096 bytes, else
    it becomes ``"tool request rejected"``.
    """
    clean_code = code.strip() if isinstance(code, str) else ""
    if not NAME.fullmatch(clean_code) or len(clean_code.encode()) > _MAX_CODE_BYTES:
        clean_code = _DEFAULT_REJECT_CODE
    clean_message = message.strip() if isinstance(message, str) else ""
    if not clean_message or len(clean_message.encode()) > _MAX_MESSAGE_BYTES:
        clean_message = _DEFAULT_REJECT_MESSAGE
    return _Rejection(clean_code, clean_message, _MARKER)


def as_rejection(err: BaseException | None) -> tuple[str, str] | None:
    """``(code, message)`` when ``err`` is an error made by :func:`reject`, or was raised
    ``from`` one (its ``__cause__`` chain, at most 100 links).

    Only explicit causes count: a handler that caught a rejection and then failed (the
    rejection is the failure's implicit ``__context__``), or an ``ExceptionGroup`` holding one
    beside other errors, failed; its failure is not the rejection's to tell the model.
    """
    seen: set[int] = set()
    while err is not None and id(err) not in seen and len(seen) < errors.FIND_NODE_LIMIT:
        if isinstance(err, _Rejection) and getattr(err, "_marker", None) is _MARKER:
            return err.code, err.message
        seen.add(id(err))
        err = err.__cause__
    return None


# --- cancellation of a call -------------------------------------------------------------------


@final
class Cancellation:
    """Whether the answer of the tool call being handled is still wanted (see :func:`cancelled`).

    Read-only: ``is_set()`` and ``wait(timeout)`` as on a ``threading.Event`` (so it can be
    passed wherever one is waited on, e.g. ``hosttools.a2adelegation``'s ``cancel``).
    """

    __slots__ = ("_event",)

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def is_set(self) -> bool:
        """``True`` once the call's run was cancelled, ran out of time or ended."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until :meth:`is_set` or ``timeout`` seconds passed; returns :meth:`is_set`."""
        return self._event.wait(timeout)

    def __repr__(self) -> str:
        return f"tool.Cancellation(set={self.is_set()})"


_NEVER_CANCELLED: Final = Cancellation(threading.Event())
# Set by the tool gateway in the thread it runs a call's handler on.
_current_cancellation: ContextVar[Cancellation] = ContextVar("adaptor.tool.cancellation")


def cancelled() -> Cancellation:
    """The cancellation of the call the calling handler serves.

    Set once the run whose CLI made the call ends: cancelled, out of time (its deadline or
    active-execution budget), or finished (a CLI that gave up on the call itself, while its
    run goes on, cannot be seen here).  The
    handler then runs on unless it looks: ``while not tool.cancelled().wait(1): ...``.
    Outside a call served by an Agent's tool gateway (:meth:`Definition.invoke` in a test) it
    is never set.  It belongs to the handler's thread: a thread the handler starts gets it
    passed, not looked up.
    """
    return _current_cancellation.get(_NEVER_CANCELLED)


# --- definitions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Annotations:
    """Behaviour hints for the CLI; ``None`` means "not stated"."""

    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None


@dataclass(frozen=True)
class ToolDescriptor:
    """A validated, detached view of a definition: what the CLI is told and what threads pin."""

    name: str
    description: str
    title: str
    revision: str
    input_schema: Mapping[str, Any]
    output_schema: Mapping[str, Any] | None
    annotations: Annotations


@dataclass(frozen=True)
class CallOutcome:
    """What the model receives for one call.

    ``structured`` is the JSON object result when the tool declares an object-typed output.
    """

    text: str
    is_error: bool = False
    structured: Mapping[str, Any] | None = None


@final
@dataclass(frozen=True, eq=False)
class Definition:
    """A host-defined tool made by :func:`define`.  Immutable; compares by identity."""

    name: str
    description: str
    handler: Callable[[Any], Any] = field(repr=False)
    title: str
    revision: str
    annotations: Annotations
    max_result_bytes: int
    _input: CompiledSchema | None = field(repr=False)
    _output: CompiledSchema | None = field(repr=False)
    _problem: InvalidDefinitionError | None = field(repr=False)
    # The longest checking one call's arguments, or its result, may take in seconds; ``None``
    # is adaptor.schema.VALIDATION_LIMIT.  Private: tests shorten it with dataclasses.replace.
    _check_limit: float | None = field(default=None, repr=False)

    @property
    def problem(self) -> InvalidDefinitionError | None:
        """Why this definition is invalid, or ``None``."""
        return self._problem

    def descriptor(self) -> ToolDescriptor:
        """The validated view; raises :class:`InvalidDefinitionError` for an invalid definition."""
        self._check()
        input_schema = _NO_ARGUMENTS if self._input is None else self._input.schema
        return ToolDescriptor(
            name=self.name,
            description=self.description,
            title=self.title,
            revision=self.revision,
            input_schema=_copy_json(input_schema),
            output_schema=None if self._output is None else _copy_json(self._output.schema),
            annotations=self.annotations,
        )

    def invoke(self, arguments: str | bytes | Mapping[str, Any] | None) -> str:
        """Run the handler on the model's arguments and return its result as JSON text.

        Raises :class:`InvalidInputError` (its cause is the safe ``invalid_input`` rejection),
        :class:`InvalidOutputError`, or whatever the handler raised.
        """
        return self._invoke(arguments)[0]

    def call(self, arguments: str | bytes | Mapping[str, Any] | None) -> CallOutcome:
        """What the gateway does per call: :meth:`invoke`, with every failure made model-safe."""
        try:
            text, plain = self._invoke(arguments)
        # SystemExit (argparse in a handler, sys.exit in a library) and KeyboardInterrupt raised
        # by a handler are its failures too: let through, they ended the gateway's event loop.
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            rejection = as_rejection(exc) if isinstance(exc, Exception) else None
            if rejection is not None:
                return CallOutcome(text=rejection[1], is_error=True)
            log.warning("tool %r failed", self.name, exc_info=True)
            return CallOutcome(text=GENERIC_FAILURE, is_error=True)
        structured = plain if isinstance(plain, dict) and _is_object_schema(self._output) else None
        shown = plain if isinstance(plain, str) else text
        # What the gateway sends: the text, and the structured content (``text``'s JSON) again.
        size = len(shown.encode()) + (len(text.encode()) if structured is not None else 0)
        if size > self.max_result_bytes:
            log.warning(
                "tool %r returned %d bytes, over its limit of %d bytes: the model got an error "
                "result instead",
                self.name,
                size,
                self.max_result_bytes,
            )
            return CallOutcome(text=_too_big(size, self.max_result_bytes), is_error=True)
        return CallOutcome(text=shown, structured=structured)

    # -- the invoke path ---------------------------------------------------------------------

    def _check(self) -> None:
        problem = self._problem
        if problem is not None:
            # A fresh error per raise: one shared instance would collect every run's traceback.
            raise InvalidDefinitionError(problem.message, cause=problem.cause)

    def _invoke(self, arguments: str | bytes | Mapping[str, Any] | None) -> tuple[str, Any]:
        self._check()
        result = self.handler(self._decode_input(arguments))
        return self._encode_output(result)

    def _decode_input(self, arguments: str | bytes | Mapping[str, Any] | None) -> Any:
        value = _parse_arguments(arguments)
        if self._input is None:
            if value:
                name = sorted(value)[0]
                _fail_input(f"invalid field {_echo(name)}; this tool takes no arguments")
            return {}
        from adaptor._schema_checker import CheckTimeout

        try:
            found = self._problems(self._input, value, "tool_input")
        except CheckTimeout:
            _fail_input(
                "the arguments could not be checked against the tool's input schema within "
                f"{self._limit():g}s; send simpler arguments and retry"
            )
        if found:
            _fail_input(found[0])
        if self._input.type_ is None:
            return value
        from adaptor.schema import convert

        try:
            return convert(value, self._input.type_)
        except (TypeError, ValueError):
            # convert() messages quote the values; only the fact reaches the model.
            _fail_input(
                "the arguments could not build the tool's input; check the values and retry"
            )

    def _encode_output(self, result: Any) -> tuple[str, Any]:
        try:
            raw = orjson.dumps(result, default=_encode_default)
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise InvalidOutputError(
                f"tool {self.name!r} returned a {type(result).__name__} that is not JSON: {exc}",
                cause=exc,
            ) from exc
        # orjson writes NaN and the infinities as null: the model would be told a value that
        # is not the handler's.  Only a result with a null can hold one, so only that is walked.
        non_finite = _nesting.unwritable_number_at(result) if b"null" in raw else None
        if non_finite is not None:
            where, value = non_finite
            raise InvalidOutputError(
                f"tool {self.name!r} returned {value!r}, which JSON cannot hold, at {where or '/'}"
            )
        plain = orjson.loads(raw)
        if self._output is not None:
            from adaptor._schema_checker import CheckTimeout

            try:
                found = self._problems(self._output, plain, "tool_output")
            except CheckTimeout as exc:
                raise InvalidOutputError(
                    f"tool {self.name!r} returned output that could not be checked against its "
                    f"output schema within {self._limit():g}s (a pattern that backtracks "
                    "catastrophically, or subschemas applied again and again)",
                    cause=exc,
                ) from exc
            if found:
                raise InvalidOutputError(f"tool {self.name!r} returned output {found[0]}")
        return raw.decode(), plain

    @property
    def _checks_in_child(self) -> bool:
        """Whether a call's arguments or result are checked in a schema checker's child."""
        return any(s is not None and s._costly for s in (self._input, self._output))

    def _problems(self, compiled: CompiledSchema, value: Any, judge: Judge) -> list[str]:
        """``value``'s first problem against ``compiled``, described as ``judge`` says.

        A schema whose check could take unbounded time is checked in a schema checker's child,
        for at most :meth:`_limit` (``CheckTimeout`` beyond): in process, a pattern that
        backtracks catastrophically holds the GIL, so every thread of this process (in the
        daemon, every run) would stop for hours.  Other schemas are checked here, sparing
        ordinary calls the IPC.
        """
        from adaptor import _schema_checker

        if compiled._costly:
            try:
                return _schema_checker.errors_of(
                    compiled._private, value, self._limit(), judge=judge
                )
            except _schema_checker.Unavailable:
                pass  # validated here instead, as adaptor.schema does
        in_process = _input_problems if judge == "tool_input" else _output_problems
        return in_process(compiled._private, value, compiled._validator)[0]

    def _limit(self) -> float:
        if self._check_limit is not None:
            return self._check_limit
        from adaptor.schema import VALIDATION_LIMIT

        return VALIDATION_LIMIT


def define(
    name: str,
    description: str,
    handler: Callable[[Any], Any],
    *,
    input: Any = None,
    output: Any = None,
    title: str | None = None,
    revision: str | None = None,
    read_only: bool | None = None,
    destructive: bool | None = None,
    idempotent: bool | None = None,
    open_world: bool | None = None,
    max_result_bytes: int = MAX_RESULT_BYTES,
) -> Definition:
    """Define a tool.  Never raises: an invalid definition is kept and fails the run later.

    ``max_result_bytes`` bounds what one call sends the model (UTF-8 bytes of the text, plus
    the structured content's JSON when there is one); a bigger result reaches the model as an
    error result asking for less, never cut short.
    """
    annotations = Annotations(read_only, destructive, idempotent, open_world)
    problem: InvalidDefinitionError | None = None
    input_schema: CompiledSchema | None = None
    output_schema: CompiledSchema | None = None
    try:
        _check_fields(name, description, handler, title, revision, annotations)
        _check_result_limit(max_result_bytes, f"tool {name!r}")
        label = f"tool {name!r}"
        if input is not None:
            input_schema = _compile(input, f"{label}: input")
            if input_schema.schema.get("type") != "object":
                # pydantic writes a recursive model as {"$defs": ..., "$ref": "#/$defs/<it>"}.
                hint = (
                    ': its root is a "$ref" (as pydantic writes a recursive model); write the '
                    'root object out, its "$defs" beside it' if "$ref" in input_schema.schema else ""
                )
                raise InvalidDefinitionError(
                    f"{label}: the input schema must describe a JSON object "
                    f'(top-level "type": "object"){hint}'
                )
        if output is not None:
            output_schema = _compile(output, f"{label}: output")
    except InvalidDefinitionError as exc:
        problem = exc
    except RecursionError as exc:  # a schema nested deeper than Python's stack (jsonschema's)
        problem = InvalidDefinitionError(f"tool {name!r}: a schema is nested too deeply", cause=exc)
        input_schema = output_schema = None
    return Definition(
        name=name,
        description=description.strip() if isinstance(description, str) else description,
        handler=handler,
        title=title.strip() if isinstance(title, str) else "",
        revision=revision.strip() if isinstance(revision, str) else "",
        annotations=annotations,
        max_result_bytes=max_result_bytes,
        _input=input_schema,
        _output=output_schema,
        _problem=problem,
    )


def check_catalogue(tools: Iterable[object]) -> tuple[Definition, ...]:
    """The tools of one Agent, validated in order; duplicate names are an invalid definition.

    So are names that differ only in ``.``/``-`` against ``_``: agent CLIs fold those into ``_``
    (Claude Code calls ``my.tool`` ``mcp__adaptor__my_tool``), so the model could not tell the
    two apart and its calls of one would reach the other.
    """
    checked: list[Definition] = []
    seen: dict[str, str] = {}
    for position, item in enumerate(tools):
        if not isinstance(item, Definition):
            raise InvalidDefinitionError(
                f"tools[{position}] is a {type(item).__name__}, not a tool made by "
                "adaptor.tool.define()"
            )
        item._check()
        folded = _FOLDED.sub("_", item.name)
        other = seen.get(folded)
        if other == item.name:
            raise InvalidDefinitionError(f"two tools are named {item.name!r}")
        if other is not None:
            raise InvalidDefinitionError(
                f"tools {other!r} and {item.name!r} would have the same name for the agent "
                f"({folded!r}: agent CLIs read '.' and '-' as '_')"
            )
        seen[folded] = item.name
        checked.append(item)
    return tuple(checked)


_FOLDED = re.compile(r"[.-]")


def catalogue_fingerprint(tools: Iterable[Definition]) -> str:
    """A stable hash of the catalogue (names, texts, schemas, annotations, revisions)."""
    from adaptor.driver import canonical_fingerprint

    descriptors = sorted((t.descriptor() for t in tools), key=lambda d: d.name)
    return canonical_fingerprint("adaptor/tools/v1", descriptors, root="Tools")


# --- helpers -----------------------------------------------------------------------------------


def _check_fields(
    name: object,
    description: object,
    handler: object,
    title: object,
    revision: object,
    annotations: Annotations,
) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidDefinitionError(
            f"tool name {name!r} must be 1-128 characters of letters, digits, '_', '.' or '-'"
        )
    label = f"tool {name!r}"
    if not isinstance(description, str) or not description.strip():
        raise InvalidDefinitionError(f"{label}: the description must be a non-empty string")
    if not callable(handler):
        raise InvalidDefinitionError(f"{label}: the handler is not callable")
    # (An object whose __call__ is async is one too: inspect looks at functions only.)
    call = None if inspect.isroutine(handler) else inspect.getattr_static(type(handler), "__call__", None)
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call):
        raise InvalidDefinitionError(f"{label}: the handler must be a plain function, not async")
    _check_arity(handler, label)
    if title is not None and not isinstance(title, str):
        raise InvalidDefinitionError(f"{label}: title must be a string")
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise InvalidDefinitionError(f"{label}: revision must be a non-empty string or None")
    for hint in dataclasses.fields(annotations):
        value = getattr(annotations, hint.name)
        if value is not None and not isinstance(value, bool):
            raise InvalidDefinitionError(f"{label}: {hint.name} must be True, False or None")
    if annotations.read_only and annotations.destructive:
        raise InvalidDefinitionError(f"{label}: a tool cannot be both read_only and destructive")


def _check_result_limit(limit: object, label: str) -> None:
    # bool is an int, but max_result_bytes=True is a mistake, not a one-byte limit.
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise InvalidDefinitionError(
            f"{label}: max_result_bytes must be a positive int, not a {type(limit).__name__}"
        )
    if limit <= 0:
        raise InvalidDefinitionError(f"{label}: max_result_bytes must be positive, not {limit}")


def _too_big(size: int, limit: int) -> str:
    """The model's error result for a result over the limit: sizes only, never its content."""
    return (
        f"the tool's result was {size} bytes, over this tool's limit of {limit} bytes, so it was "
        "not sent; call the tool again asking for less (a narrower query, or one page at a time)"
    )


def _check_arity(handler: Callable[..., Any], label: str) -> None:
    """Refuse a handler that cannot be called with the one input argument.

    Otherwise the tool is served and every call fails with the generic message, the cause
    only in a warning log.
    """
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return  # no introspectable signature (some builtins): the call itself will tell
    try:
        signature.bind(None)
    except TypeError:
        raise InvalidDefinitionError(
            f"{label}: the handler must take exactly one positional argument (the input), "
            f"not {signature}"
        ) from None


def _compile(schema: object, where: str) -> CompiledSchema:
    from adaptor.driver import InvalidOutputSchemaError
    from adaptor.schema import compile_schema

    try:
        return compile_schema(schema)
    except InvalidOutputSchemaError as exc:
        raise InvalidDefinitionError(f"{where}: {exc.reason}", cause=exc) from exc


def _is_object_schema(compiled: CompiledSchema | None) -> bool:
    return compiled is not None and compiled.schema.get("type") == "object"


def _copy_json(value: Mapping[str, Any]) -> dict[str, Any]:
    copied: dict[str, Any] = orjson.loads(orjson.dumps(value))
    return copied


def _encode_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # a pydantic model: its JSON mode is the contract its author wrote,
        # under the names its schema has (model_json_schema() writes the aliases).
        return dump(mode="json", by_alias=True)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _parse_arguments(arguments: str | bytes | Mapping[str, Any] | None) -> Any:
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        if _nesting.unwritable_number_at(arguments) is not None:
            # What the gateway's MCP parser made of 1e400 (inf) or a 30-digit integer.
            _fail_input(_INEXACT_NUMBER)
        try:
            # A round trip: the handler gets plain JSON data, never the caller's objects.
            return orjson.loads(orjson.dumps(arguments))
        except (TypeError, orjson.JSONEncodeError):
            _fail_input(_INVALID_JSON)
    if isinstance(arguments, str | bytes) and not arguments.strip():
        return {}
    try:
        value = _nesting.loads_exactly(arguments)
    except _nesting.InexactNumberError:
        # Valid JSON an object may well be: "invalid JSON arguments" sent the model looking
        # for a syntax error.  (Where it is goes unsaid: a key is the model's text.)
        _fail_input(_INEXACT_NUMBER)
    except orjson.JSONDecodeError:
        _fail_input(_INVALID_JSON)
    if not isinstance(value, dict):
        _fail_input("the arguments must be a JSON object; send an object and retry")
    return value


def _fail_input(message: str) -> NoReturn:
    """Raise ``InvalidInputError`` whose cause is the safe rejection the model sees.

    Called inside an ``except`` block, the original problem (whose message may quote the
    model's values) stays the context, for the host's traceback only.
    """
    error = InvalidInputError(message, cause=reject(INVALID_INPUT_CODE, message))
    raise error from error.cause


def _input_problems(
    schema: dict[str, Any], value: Any, validator: Draft202012Validator | None = None
) -> tuple[list[str], Draft202012Validator]:
    """The model-safe message of the arguments' first problem, if any; and the validator used.

    The schema checker's child runs this too (``judge="tool_input"``).
    """
    validator, first, too_deep = _first_error(schema, value, validator)
    if too_deep:
        return ["the arguments nest too deeply to check; send flatter ones and retry"], validator
    return [] if first is None else [_safe_message(first)], validator


def _output_problems(
    schema: dict[str, Any], value: Any, validator: Draft202012Validator | None = None
) -> tuple[list[str], Draft202012Validator]:
    """What is wrong with a handler's result, completing "tool NAME returned output ..."; and
    the validator used.

    The schema checker's child runs this too (``judge="tool_output"``).
    """
    validator, first, too_deep = _first_error(schema, value, validator)
    if too_deep:
        return ["nested too deeply to check against its output schema"], validator
    if first is None:
        return [], validator
    # Path and keyword only: the output may hold data the logs should not.
    return [f"that fails its output schema at {first.json_path} ({first.validator})"], validator


def _first_error(
    schema: dict[str, Any], value: Any, validator: Draft202012Validator | None
) -> tuple[Draft202012Validator, ValidationError | None, bool]:
    """The validator (made when none is given), ``value``'s shallowest error if any, and
    whether the value nests deeper than jsonschema can follow (it recurses with Python's
    stack)."""
    if validator is None:
        from adaptor.schema import _new_validator

        validator = _new_validator(schema)
    try:
        found = sorted(validator.iter_errors(value), key=_error_depth)
    except RecursionError:
        return validator, None, True
    return validator, found[0] if found else None, False


def _error_depth(error: ValidationError) -> tuple[int, str]:
    # The shallowest problem first: a missing top-level field explains more than a nested one.
    return len(error.absolute_path), str(list(error.absolute_path))


def _safe_message(error: ValidationError) -> str:
    """Say where and what kind of problem, naming fields but never echoing a value."""
    where = _echo(error.json_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        declared = schema.get("properties") or {}
        extras = sorted(k for k in error.instance if k not in declared)
        if extras:
            return f"invalid field {_echo(extras[0])}; use a declared field name and retry"
    if error.validator == "required" and isinstance(error.instance, dict):
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = [k for k in required if isinstance(k, str) and k not in error.instance]
        if missing:
            return f"missing required field {_echo(missing[0])} at {where}; add it and retry"
    if error.validator == "type":
        expected = error.validator_value
        wanted = expected if isinstance(expected, str) else "/".join(map(str, expected))
        return f"wrong type at {where}: expected {wanted}; fix the type and retry"
    return f"invalid value at {where} ({error.validator}); check the tool's input schema and retry"


def _echo(text: str) -> str:
    """A quoted, escaped name of at most 64 bytes, safe to embed in a model-visible message."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > _MAX_ECHO_BYTES:
        text = encoded[:_MAX_ECHO_BYTES].decode("utf-8", "ignore") + "…"
    # JSON escapes the control characters; other unprintables (bidi overrides, separators)
    # could still disguise the message, so they are escaped too.
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in quoted)
