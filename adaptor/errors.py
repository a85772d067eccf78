"""The one error taxonomy: identities, matching helpers, the wire codec and CLI exit codes.

Every failure a user can see is an instance of a class defined here or in a leaf module
(``adaptor.driver``, ``adaptor.skill``, ...).  The class name, its wire ``code`` and its typed
fields are the public contract; messages are diagnostics only.
"""

from __future__ import annotations

import builtins
import copy
import importlib
import math
import pickle
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from adaptor._redact import Redactor, redact_credentials

if TYPE_CHECKING:
    from adaptor.result import Result

__all__ = [
    "EXIT_CODES",
    "ActiveExecutionTimeoutError",
    "AdaptorError",
    "AgentClosedError",
    "AgentFailedError",
    "ApprovalDeniedError",
    "ApprovalExpiredError",
    "ApprovalKindMismatchError",
    "ApprovalResolvedError",
    "ApprovalTimeoutError",
    "ApprovalUnavailableError",
    "CancelledError",
    "DeadlineExceededError",
    "ExternalError",
    "PolicyViolationError",
    "ResumeRejectedError",
    "RunCancelledError",
    "RunDeadlineExceededError",
    "RunError",
    "ThreadAlreadyExistsError",
    "ThreadBusyError",
    "ThreadCheckpointMissingError",
    "ThreadIncompatibleError",
    "ThreadLeaseLostError",
    "ThreadNotFoundError",
    "ThreadStoreRequiredError",
    "exit_code_for",
    "find",
    "from_wire",
    "matches",
    "to_wire",
]

E = TypeVar("E", bound=BaseException)

# JSON shapes a typed field may take on the wire.  Validated on decode so that a wire object
# whose fields have the wrong shape never rebuilds into the specific class.
_Str = (str,)
_OptStr = (str, type(None))
_Num = (int, float)
_Scalar = (str, int, float, bool, type(None))

FIND_NODE_LIMIT = 100
"""How many exceptions ``find`` visits at most; also the deepest cause chain on the wire."""

# Where classes that are not defined in this module live, so ``from_wire`` can rebuild them
# without the caller having imported the leaf module first.  Importing these modules must stay
# cheap and free of optional dependencies.
_LEAF_MODULES = (
    "adaptor.driver",
    "adaptor.skill",
    "adaptor.mcp",
    "adaptor.tool",
    "adaptor.threadstore",
    "adaptor.spool",
    "adaptor.clients.a2a",
    "hosttools.sessionrecorder",
    "hosttools.a2adelegation",
)

_REGISTRY: dict[str, type[AdaptorError]] = {}


class AdaptorError(Exception):
    """Base of every SDK-owned error.

    ``code`` is the wire identity.  ``exit_code`` is what the ``adaptor`` CLI exits with when
    this error is the outcome of a command.
    """

    code: ClassVar[str] = "AdaptorError"
    exit_code: ClassVar[int] = 70
    default_message: ClassVar[str] = "adaptor error"
    # Typed fields of the class: name -> accepted JSON types.  Part of the public contract.
    _fields: ClassVar[dict[str, tuple[type, ...]]] = {}

    message: str
    cause: BaseException | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            _REGISTRY[cls.__dict__["code"]] = cls

    def __init__(self, message: str = "", *, cause: BaseException | None = None) -> None:
        self.message = message or self.default_message
        super().__init__(self.message)
        self._set_cause(cause)

    def _set_cause(self, cause: BaseException | None) -> None:
        self.cause = cause
        if cause is not None:
            self.__cause__ = cause

    @property
    def wire_code(self) -> str:
        """The code this error travels under (a rebuilt unknown error keeps its original)."""
        return self.__dict__.get("_wire_code") or type(self).code

    @property
    def wire_type(self) -> str:
        return self.__dict__.get("_wire_type") or type(self).__name__

    def fields(self) -> dict[str, Any]:
        """The typed fields of this error as a JSON-ready dict (``{}`` when it has none)."""
        return {name: _jsonable(getattr(self, name, None)) for name in type(self)._fields}

    def to_wire(self, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
        return to_wire(self, secrets=secrets)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own would call the class with ``args`` (just the message), which
        # constructors with other required arguments refuse or misread (ProcessPoolExecutor
        # and multiprocessing rebuild errors that way).  The state is __dict__, plus the cause
        # the wire form reports (pickle drops __cause__ otherwise).  A cause that does not
        # pickle (a jsonschema error holds lambdas) would make this error unpicklable too: it
        # travels as the wire form writes it.
        state = self._state()
        stand_ins: dict[int, BaseException] = {}
        for name in ("cause", "__cause__"):
            cause = state.get(name)
            if isinstance(cause, BaseException):
                if id(cause) not in stand_ins:
                    stand_ins[id(cause)] = _picklable(cause)
                state[name] = stand_ins[id(cause)]
        return _rebuilt, (type(self), self.args), state

    # Copies need no pickling: they keep the very cause (copy would use __reduce__ otherwise).
    def __copy__(self) -> AdaptorError:
        copied = _rebuilt(type(self), self.args)
        copied.__setstate__(self._state())
        return copied

    def __deepcopy__(self, memo: dict[int, Any]) -> AdaptorError:
        copied = _rebuilt(type(self), copy.deepcopy(self.args, memo))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(self._state(), memo))
        return copied

    def _state(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.__cause__ is not None:
            state["__cause__"] = self.__cause__
        return state

    def __repr__(self) -> str:
        parts = [repr(self.message)]
        parts += [f"{k}={getattr(self, k, None)!r}" for k in type(self)._fields]
        return f"{type(self).__name__}({', '.join(parts)})"


def _picklable(err: BaseException, depth: int = 0) -> BaseException:
    """``err`` when it pickles, else an :class:`ExternalError` naming its class and message
    (with its own cause chain so made, to the wire form's depth)."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        try:
            message = str(err)
        except Exception:
            message = ""
        stand_in = ExternalError(_type_name(err), message)
        nested = _next_cause(err)
        if nested is not None and nested is not err and depth < FIND_NODE_LIMIT:
            stand_in.__cause__ = stand_in.cause = _picklable(nested, depth + 1)
        return stand_in
    return err


def _rebuilt(cls: type[AdaptorError], args: tuple[Any, ...]) -> AdaptorError:
    """An instance of ``cls`` made without its constructor; unpickling then sets its state."""
    error = cls.__new__(cls)
    error.args = args
    return error


class ExternalError(AdaptorError):
    """A foreign exception rebuilt from the wire whose Python class is not importable here.

    ``type_name`` is the original class's qualified name.
    """

    code = "external"
    default_message = "external error"

    def __init__(self, type_name: str, message: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name

    @property
    def wire_type(self) -> str:
        return self.type_name


# --- host cancellation and deadlines (plain AdaptorErrors, never RunErrors) -------------------


class CancelledError(AdaptorError):
    """The host cancelled the call before the driver was entered."""

    code = "context.Canceled"
    default_message = "cancelled by the host"


class DeadlineExceededError(AdaptorError, TimeoutError):
    """The call's timeout elapsed before the driver was entered."""

    code = "context.DeadlineExceeded"
    default_message = "deadline exceeded"


class AgentClosedError(AdaptorError):
    """``agent.close()`` has started; no new run is admitted."""

    code = "ErrAgentClosed"
    default_message = "agent is closed"


# --- run verdicts -----------------------------------------------------------------------------


class RunError(AdaptorError):
    """A completed business failure after the driver was entered.

    ``result`` holds the audit data gathered so far (an empty ``Result`` when the error was
    made without one, as ``from_wire`` without ``result=`` makes it).
    """

    code = "RunError"
    exit_code = 1
    default_message = "run failed"
    _reason: ClassVar[str | None] = None

    reason: str
    details: dict[str, Any]
    result: Result

    def __init__(
        self,
        reason: str,
        message: str = "",
        *,
        details: Mapping[str, Any] | None = None,
        result: Result | None = None,
        cause: BaseException | None = None,
    ) -> None:
        self.reason = reason
        self.details = dict(details or {})
        # Typed as always there, so `err.result.text` needs no None check (it was
        # `Result | None` though every run sets it).
        self.result = _no_result() if result is None else result
        super().__init__(message or f"run failed: {reason or 'agent_error'}", cause=cause)


def _no_result() -> Result:
    """The empty Result of a RunError made without one (imported late: the result module
    is not loaded by ``import adaptor.errors`` alone)."""
    from adaptor.result import Result

    return Result(run_id="")


class _FixedReasonRunError(RunError):
    """A RunError subclass whose reason is fixed by its class."""

    def __init__(
        self,
        message: str = "",
        *,
        details: Mapping[str, Any] | None = None,
        result: Result | None = None,
        cause: BaseException | None = None,
    ) -> None:
        reason = type(self)._reason
        assert reason is not None
        super().__init__(
            reason, message or self.default_message, details=details, result=result, cause=cause
        )


class ApprovalDeniedError(_FixedReasonRunError):
    code = "ErrApprovalDenied"
    _reason = "approval_denied"
    default_message = "approval denied"


class ApprovalTimeoutError(_FixedReasonRunError):
    code = "ErrApprovalTimeout"
    _reason = "approval_timeout"
    default_message = "approval timed out"


class AgentFailedError(_FixedReasonRunError):
    code = "ErrAgentFailed"
    _reason = "agent_error"
    default_message = "agent failed"


class RunCancelledError(_FixedReasonRunError):
    code = "ErrRunCancelled"
    _reason = "cancelled"
    default_message = "run cancelled"


class PolicyViolationError(_FixedReasonRunError):
    code = "ErrPolicyViolation"
    _reason = "policy_violation"
    default_message = "run violated its policy"


class RunDeadlineExceededError(_FixedReasonRunError, TimeoutError):
    code = "ErrDeadlineExceeded"
    _reason = "deadline_exceeded"
    default_message = "run deadline exceeded"


class ActiveExecutionTimeoutError(RunError):
    """The policy's active-execution budget (``limit`` seconds) ran out."""

    code = "ErrActiveExecutionTimeout"
    _reason = "active_execution_timeout"
    default_message = "active execution budget exhausted"
    _fields = {"limit": _Num}

    limit: float

    def __init__(
        self,
        limit: float,
        message: str = "",
        *,
        details: Mapping[str, Any] | None = None,
        result: Result | None = None,
        cause: BaseException | None = None,
    ) -> None:
        self.limit = limit
        super().__init__(
            "active_execution_timeout",
            message or f"active execution budget of {limit:g}s exhausted",
            details=details,
            result=result,
            cause=cause,
        )


# The driver failure codes errors.md maps, and the class each becomes.  No other code ever
# becomes a subclass: a driver's "deadline_exceeded" would be a RunDeadlineExceededError (a
# TimeoutError) with none of the details the SDK's own deadline gives.
_DRIVER_CODE_CLASSES: dict[str, type[_FixedReasonRunError]] = {
    "decision_rejected": ApprovalDeniedError,
    "decision_timeout": ApprovalTimeoutError,
    "agent_error": AgentFailedError,
    "": AgentFailedError,
    "cancelled": RunCancelledError,
    "policy_error": PolicyViolationError,
}


def run_error_for_driver_code(
    code: str | None,
    message: str = "",
    *,
    details: Mapping[str, Any] | None = None,
    result: Result | None = None,
) -> RunError:
    """The RunError of a driver's failure: a mapped code's subclass, else a plain
    ``RunError`` whose reason is the code verbatim."""
    cls = _DRIVER_CODE_CLASSES.get(code or "")
    if cls is None:
        return RunError(str(code), message, details=details, result=result)
    return cls(message, details=details, result=result)


# --- thread errors ----------------------------------------------------------------------------


class _ThreadError(AdaptorError):
    exit_code = 4


class ThreadStoreRequiredError(_ThreadError):
    code = "ErrThreadStoreRequired"
    default_message = "this operation needs a thread store (Agent(thread_store=...))"


class ThreadNotFoundError(_ThreadError):
    code = "ErrThreadNotFound"
    default_message = "thread not found"


class ThreadBusyError(_ThreadError):
    code = "ErrThreadBusy"
    exit_code = 75
    default_message = "thread is busy: another owner holds its lease"


class ThreadIncompatibleError(_ThreadError):
    code = "ErrThreadIncompatible"
    default_message = "stored thread is incompatible with this agent"


class ThreadLeaseLostError(_ThreadError):
    code = "ErrThreadLeaseLost"
    default_message = "thread lease lost; nothing was persisted"


class ThreadCheckpointMissingError(_ThreadError):
    code = "ErrThreadCheckpointMissing"
    default_message = "run did not produce a valid resumable checkpoint"


class ThreadAlreadyExistsError(_ThreadError):
    code = "ErrThreadAlreadyExists"
    default_message = "thread key already has an active conversation"


class ResumeRejectedError(_ThreadError):
    """The driver refused to resume the stored session; ``reason`` is the driver's word."""

    code = "ErrResumeRejected"
    default_message = "the agent rejected the stored session"
    _fields = {"reason": _Str}

    reason: str

    def __init__(
        self, reason: str = "", message: str = "", *, cause: BaseException | None = None
    ) -> None:
        self.reason = reason
        super().__init__(
            message or (f"resume rejected: {reason}" if reason else ""), cause=cause
        )


# --- approval responder errors ----------------------------------------------------------------


class ApprovalResolvedError(AdaptorError):
    code = "ErrApprovalResolved"
    exit_code = 5
    default_message = "approval request was already resolved"


class ApprovalExpiredError(ApprovalResolvedError):
    code = "ErrApprovalExpired"
    default_message = "approval request expired"


class ApprovalKindMismatchError(AdaptorError):
    code = "ErrApprovalKindMismatch"
    exit_code = 5
    default_message = "response does not fit the approval kind"


class ApprovalUnavailableError(AdaptorError):
    code = "ErrApprovalUnavailable"
    exit_code = 5
    default_message = "no such pending approval request"


# --- matching ---------------------------------------------------------------------------------


def _walk(err: BaseException) -> Iterator[BaseException]:
    """Depth-first over the error, its cause/context chain and group members."""
    seen: set[int] = set()
    stack: list[BaseException] = [err]
    visited = 0
    while stack and visited < FIND_NODE_LIMIT:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        visited += 1
        yield node
        children: list[BaseException] = []
        if node.__cause__ is not None:
            children.append(node.__cause__)
        elif node.__context__ is not None and not node.__suppress_context__:
            children.append(node.__context__)
        if isinstance(node, BaseExceptionGroup):
            children.extend(node.exceptions)
        stack.extend(reversed(children))


def find(err: BaseException | None, cls: type[E]) -> E | None:
    """The first exception of type ``cls`` in ``err``'s chain (``err`` itself included)."""
    if err is None:
        return None
    if not isinstance(err, BaseException):
        # Not an AttributeError about __cause__ from deep inside the walk.
        raise TypeError(f"find() looks through an exception or None, not {type(err).__name__}")
    for node in _walk(err):
        if isinstance(node, cls):
            return node
    return None


def matches(err: BaseException | None, cls: type[BaseException]) -> bool:
    return find(err, cls) is not None


# --- exit codes -------------------------------------------------------------------------------

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "a RunError (business failure) of any reason, but the RunErrors of 4 and 69 below"),
    (2, "usage: bad arguments, request file rejected by the schema (InvalidRequestError)"),
    (
        3,
        "configuration refused before invocation: invalid policy, schema, driver config, "
        "skill, MCP, capability unsupported, tool definition",
    ),
    (
        4,
        "thread state: not found, incompatible, already exists, resume rejected, "
        "checkpoint missing, store required (also as the cause of a RunError after the start)",
    ),
    (5, "approval response refused: resolved, expired, kind mismatch, unavailable"),
    (69, "the daemon is not running / spool not reachable / agent CLI binary not found"),
    (
        70,
        "internal or infrastructure failure outside the taxonomy, CancelledError, "
        "DeadlineExceededError",
    ),
    (75, "ThreadBusyError: retry later"),
    (124, "wait --timeout elapsed before a verdict (the run may still be going)"),
)


def exit_code_for(err: BaseException) -> int:
    """The ``adaptor`` CLI exit code for an error outcome."""
    if isinstance(err, RunError) and err.details.get("kind") == "binary_not_found":
        return 69
    if (
        isinstance(err, RunError)
        and err.reason == "infrastructure_error"
        and isinstance(err.__cause__, _ThreadError)
    ):
        # A thread failure found after the driver was entered (checkpoint missing, lease lost,
        # fork target taken) must be a RunError to keep the run's Result, but what a script
        # has to act on is the thread's state: the table files it under 4, not 1.
        return type(err.__cause__).exit_code
    if isinstance(err, AdaptorError):
        return type(err).exit_code
    return 70


# --- the wire codec ---------------------------------------------------------------------------

def _scrub(text: str, redactor: Redactor, *, foreign: bool) -> str:
    text = redactor.text(text)
    return redact_credentials(text) if foreign else text


def _jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: a details value of another type (a datetime, a set, a
    path, bytes) becomes a list or its ``str()``, so every wire form serializes: a float
    NaN or infinity too (``"nan"``, ``"-inf"``), which ``json`` writes as no JSON and orjson
    as ``null``."""
    if isinstance(value, str | int | None):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    try:
        return str(value)
    except Exception:  # a foreign object's __str__ may fail: the wire form must not
        return f"<{type(value).__qualname__}>"


_KEY_REPR_LIMIT = 4096


class _ShownKey(str):
    """A key known only by what it showed: ``repr()`` gives that back, so a KeyError holding
    it says the message it said (``None``, an enum member, an object of a program's own)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


def _builtin_args(cls: type[BaseException], message: str) -> tuple[object, ...]:
    """The arguments that give a built-in exception ``message`` as its ``str()`` again.

    ``str(KeyError(key))`` is ``repr(key)``: the key, read back from that when it is a literal,
    rather than the message, which KeyError would quote a second time (``"'session_id'"``).
    """
    if not issubclass(cls, KeyError):
        return (message,)
    if not message:
        return ()  # KeyError() says "", KeyError("") says "''"
    if len(message) <= _KEY_REPR_LIMIT:
        import ast  # only here: most programs never read a KeyError back

        try:
            key = ast.literal_eval(message)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
        else:
            if repr(key) == message:
                return (key,)
    return (_ShownKey(message),)


def _next_cause(err: BaseException) -> BaseException | None:
    if err.__cause__ is not None:
        return err.__cause__
    if err.__context__ is not None and not err.__suppress_context__:
        return err.__context__
    return None


def _type_name(err: BaseException) -> str:
    cls = type(err)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _encode_one(err: BaseException, redactor: Redactor) -> dict[str, Any]:
    if isinstance(err, AdaptorError) and not isinstance(err, ExternalError):
        fields = err.fields() if type(err)._fields else dict(err.__dict__.get("_wire_fields", {}))
        obj: dict[str, Any] = {
            "code": err.wire_code,
            "type": err.wire_type,
            "message": _scrub(err.message, redactor, foreign=False),
            "fields": redactor.value(fields),
        }
        if isinstance(err, RunError):
            obj["reason"] = err.reason
            obj["details"] = redactor.value(_jsonable(err.details))
        return obj
    if isinstance(err, ExternalError):
        type_name, message = err.type_name, err.message
    else:
        type_name, message = _type_name(err), str(err)
    return {
        "code": "external",
        "type": type_name,
        "message": _scrub(message, redactor, foreign=True),
        "fields": {},
    }


def to_wire(err: BaseException, *, secrets: Iterable[str] = ()) -> dict[str, Any]:
    """The wire form of ``err`` and its cause chain (at most ``FIND_NODE_LIMIT`` deep).

    Only the class identity, message, typed fields and, for RunErrors, reason and details are
    written.  Every value in ``secrets`` (of at least ``MIN_SECRET_LENGTH`` characters, in any of
    its escaped forms) is replaced in messages, fields and details, and credential-looking text
    in foreign exception messages is redacted.
    """
    redactor = Redactor(secrets)
    head = _encode_one(err, redactor)
    tail = head
    seen = {id(err)}
    node = _next_cause(err)
    depth = 1
    while node is not None and id(node) not in seen and depth < FIND_NODE_LIMIT:
        seen.add(id(node))
        encoded = _encode_one(node, redactor)
        tail["cause"] = encoded
        tail = encoded
        node = _next_cause(node)
        depth += 1
    tail["cause"] = None
    return head


def _load_leaf_modules() -> None:
    for name in _LEAF_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # a leaf not built yet must not break decoding of the others
            continue


_leaves_loaded = False


def _class_for(code: str) -> type[AdaptorError] | None:
    global _leaves_loaded
    if code not in _REGISTRY and not _leaves_loaded:
        _leaves_loaded = True
        _load_leaf_modules()
    return _REGISTRY.get(code)


def _fields_fit(cls: type[AdaptorError], fields: Mapping[str, Any]) -> bool:
    for name, accepted in cls._fields.items():
        if name not in fields:
            return False
        value = fields[name]
        if isinstance(value, bool) and bool not in accepted:
            return False
        if not isinstance(value, accepted):
            return False
    return True


def _fits(cls: type[AdaptorError], fields: Mapping[str, Any], reason: str | None) -> bool:
    if not _fields_fit(cls, fields):
        return False
    if issubclass(cls, RunError):
        return reason is not None and cls._reason in (None, reason)
    return reason is None


def _builtin_exception(type_name: str) -> type[BaseException] | None:
    cls = getattr(builtins, type_name, None)
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, AdaptorError):
        return cls
    return None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


# The thread store's damaged-file error is outside the taxonomy, but ours and public: it comes
# back as itself, its fields read off its message ("PATH:LINE: WHY").
_CORRUPT_LOG_TYPE = "adaptor.threadstore.CorruptLogError"
_CORRUPT_LOG_MESSAGE = re.compile(r"(?P<path>.+):(?P<line>[0-9]+): (?P<why>.*)", re.DOTALL)


def _corrupt_log_error(message: str) -> BaseException | None:
    found = _CORRUPT_LOG_MESSAGE.fullmatch(message)
    if found is None:
        return None
    from adaptor.threadstore import CorruptLogError

    return CorruptLogError(found["path"], int(found["line"]), found["why"])


def _decode_one(obj: Mapping[str, Any]) -> BaseException:
    code = obj.get("code")
    code = code if isinstance(code, str) else ""
    message = _str(obj.get("message"))
    type_name = _str(obj.get("type"))
    raw_fields = obj.get("fields")
    fields: Mapping[str, Any] = raw_fields if isinstance(raw_fields, dict) else {}
    has_reason = "reason" in obj
    reason = _str(obj.get("reason"))
    raw_details = obj.get("details")
    details: dict[str, Any] = dict(raw_details) if isinstance(raw_details, dict) else {}

    if code == "external":
        if type_name == _CORRUPT_LOG_TYPE:
            corrupt = _corrupt_log_error(message)
            if corrupt is not None:
                return corrupt
        builtin = _builtin_exception(type_name)
        if builtin is not None:
            try:
                return builtin(*_builtin_args(builtin, message))
            except Exception:  # an exception class with an unusual constructor
                pass
        return ExternalError(type_name or "Exception", message)

    cls = _class_for(code)
    if cls is not None and _fits(cls, fields, reason if has_reason else None):
        err: AdaptorError = cls.__new__(cls)
        Exception.__init__(err, message)
        err.message = message
        err.cause = None
        for name in cls._fields:
            setattr(err, name, fields[name])
        if isinstance(err, RunError):
            err.reason = reason
            err.details = details
            err.result = _no_result()
        return err

    # Unknown code or a known code whose shape does not fit: a generic error that keeps the
    # wire identity verbatim, never a wrong subclass.
    generic: AdaptorError
    if has_reason:
        generic = RunError(reason, message, details=details)
    else:
        generic = AdaptorError(message)
    generic.message = message
    generic.args = (message,)
    generic.__dict__["_wire_code"] = code or "AdaptorError"
    # And as its own ``code``, shadowing the class's: a host comparing err.code sees what was
    # sent.  (Not what wire_code reads: some errors have a ``code`` field of their own.)
    generic.__dict__["code"] = generic.__dict__["_wire_code"]
    generic.__dict__["_wire_type"] = type_name or type(generic).__name__
    generic.__dict__["_wire_fields"] = _jsonable(dict(fields))
    return generic


def from_wire(obj: object, result: Result | None = None) -> BaseException:
    """Rebuild the exception written by :func:`to_wire`, cause chain included.

    ``result`` becomes ``.result`` of the outermost RunError.  Raises ``ValueError`` only when
    ``obj`` is not a JSON object.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"an error's wire form must be a JSON object, not {type(obj).__name__}")
    head = _decode_one(obj)
    if isinstance(head, RunError) and result is not None:
        head.result = result
    node, current = head, obj.get("cause")
    seen = {id(obj)}
    depth = 1
    while isinstance(current, dict) and id(current) not in seen and depth < FIND_NODE_LIMIT:
        seen.add(id(current))
        child = _decode_one(current)
        node.__cause__ = child
        if isinstance(node, AdaptorError):
            node.cause = child
        node, current = child, current.get("cause")
        depth += 1
    return head
