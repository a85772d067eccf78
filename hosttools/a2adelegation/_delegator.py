"""The delegator: one remote A2A task per ``delegate`` call, streamed or polled to its end."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from adaptor.clients.a2a import (
    Artifact,
    ArtifactEvent,
    Client,
    EventStream,
    InvalidAgentCardError,
    Message,
    MessageEvent,
    NotFoundError,
    Part,
    ProtocolError,
    StatusEvent,
    StreamEvent,
    StreamRecoveryError,
    Task,
    TaskEvent,
    TaskState,
    TerminalEvent,
    UnauthorizedError,
    UnsupportedError,
    UntrustedOriginError,
)
from adaptor.events import SubagentUpdate

from ._registry import Policy, Registry, RemoteAgentSpec

if TYPE_CHECKING:
    from . import DelegationError

log = logging.getLogger(__name__)

UpdateSink = Callable[[SubagentUpdate], object]
"""Receives progress; e.g. the leader run's event sink ``emit``.  Exceptions are logged."""

_now = time.monotonic  # the delegation clock; tests replace it to expire deadlines on cue
_REMOTE_CANCEL_TIMEOUT = 5.0
# How long a cancelled delegation waits for the stream to name the remote task it must cancel
# (the leader's answer is dropped anyway); one past its deadline waits _REMOTE_CANCEL_TIMEOUT.
_AWAIT_TASK_ID = 30.0
_CANCEL_CHECK_INTERVAL = 0.05
_CLIENT_TIMEOUT = 30.0
# The messages a DelegationResult keeps (the latest; the last one is the answer's text when
# there are no artifacts).
_KEPT_MESSAGES = 1000

# Fixed, safe texts: a DelegationError never repeats anything the remote agent said.
_MESSAGES = {
    "agent_not_found": "no remote agent is registered under that key",
    "agent_unavailable": "the remote agent is unavailable",
    "invalid_agent_card": "the remote agent's card is invalid",
    "configuration_error": "the remote agent configuration was refused",
    "a2a_sdk_missing": "this host cannot delegate: the A2A client's extra is not installed",
    "unauthorized": "the remote agent refused the configured credentials",
    "untrusted_origin": "the remote agent's card points credentials at an untrusted origin",
    "capability_unsupported": "the remote agent does not support what the delegation requires",
    "streaming_unsupported": "the remote agent does not support streaming",
    "stream_unavailable": "the remote agent's stream could not be opened",
    "remote_failed": "the remote agent failed the task",
    "rejected": "the remote agent rejected the task",
    "input_required": "the remote agent needs more input",
    "auth_required": "the remote agent needs authorization",
    "task_not_found": "the remote agent no longer knows the task",
    "remote_cancelled": "the remote agent cancelled the task",
    "cancelled": "the delegation was cancelled",
    "deadline_exceeded": "the delegation deadline was exceeded",
    "max_polls": "the remote task did not finish within the allowed polls",
    "policy_violation": "the remote agent's artifacts exceed the size limit",
    "protocol_error": "the remote agent sent a malformed response",
    # Failures the remote agent classified (see _promoted), by their own code.
    "remote_active_execution_timeout": "the remote agent's active execution time ran out",
    "remote_approval_denied": "the remote agent's approval was denied",
    "remote_approval_timeout": "the remote agent's approval timed out",
    "remote_deadline_exceeded": "the remote agent's execution deadline was exceeded",
    "remote_agent_error": "the remote agent failed the task",
    "remote_policy_violation": "the remote agent's run violated its policy",
    "remote_infrastructure_error": "the remote agent's infrastructure failed",
}

# The failure codes a remote adaptor agent may state in its terminal status message
# (metadata["agentadaptor.failure"]); each pairs with FAILED, "cancelled" with CANCELED.
_FAILURE_KEY = "agentadaptor.failure"
_REMOTE_FAILURES = frozenset(
    {"active_execution_timeout", "approval_denied", "approval_timeout", "deadline_exceeded",
     "agent_error", "policy_violation", "infrastructure_error"}
)


def _promoted(state: TaskState, message: Message | None) -> tuple[str, int | None] | None:
    """The failure code (and ``limit_ms``) a FAILED task's status message states, if it is a
    well-formed closed control object; anything else (unknown keys or codes, a code that does
    not pair with the state, a CANCELED task) is not promoted and stays ``remote_failed``."""
    if state is not TaskState.FAILED or message is None:
        return None
    for part in message.parts:
        control = part.metadata.get(_FAILURE_KEY) if part.kind == "text" else None
        if not isinstance(control, Mapping):
            continue
        code, limit_ms = control.get("code"), control.get("limit_ms")
        if (
            set(control) <= {"code", "limit_ms", "metadata"}
            and code in _REMOTE_FAILURES
            and (limit_ms is None or (type(limit_ms) in (int, float) and limit_ms >= 0))
        ):
            return str(code), None if limit_ms is None else math.ceil(limit_ms)
        return None
    return None


class CancelSignal(Protocol):
    """Local cancellation, e.g. a ``threading.Event`` or a driver's ``sink.cancelled``."""

    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True)
class DelegationRequest:
    """One piece of work for a registered agent.

    ``timeout`` (seconds) is clamped to the agent's ``Policy.max_timeout``; ``stream`` None
    streams when the card advertises it; ``cancel`` set means stop and cancel the remote task.
    """

    agent: str
    prompt: str
    context_id: str | None = None
    timeout: float | None = None
    stream: bool | None = None
    cancel: CancelSignal | None = field(default=None, compare=False)


@dataclass(frozen=True)
class DelegationResult:
    """A delegation that reached ``completed`` (or ``input_required`` when the policy allows).

    ``text`` is the artifacts' text, or the final message's when there are none.  ``messages``
    are the distinct messages the remote sent (status and progress), the latest 1,000 of them.
    ``task`` is the last full snapshot fetched (None when everything came from the stream).
    """

    delegation_id: str
    agent: str
    status: TaskState
    text: str
    remote_task_id: str = ""
    remote_context_id: str = ""
    artifacts: tuple[Artifact, ...] = ()
    messages: tuple[Message, ...] = ()
    streamed: bool = False
    recovered: bool = False
    task: Task | None = None


class Delegator:
    """Runs delegations against the agents of a ``Registry``.

    Clients (and the cards they discovered) are kept per agent and shared by ``bind`` copies;
    ``close()`` the delegator that created them.  Thread-safe: delegations may run in parallel.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        on_update: UpdateSink | None = None,
        client_timeout: float = _CLIENT_TIMEOUT,
    ) -> None:
        if not isinstance(registry, Registry):
            raise TypeError("Delegator needs a Registry")
        self._registry = registry
        self._on_update = on_update
        self._pool = _ClientPool(client_timeout)

    @property
    def registry(self) -> Registry:
        return self._registry

    def bind(self, on_update: UpdateSink | None) -> Delegator:
        """A delegator reporting progress to ``on_update`` (e.g. one leader run's sink)."""
        bound = Delegator.__new__(Delegator)
        bound._registry, bound._pool, bound._on_update = self._registry, self._pool, on_update
        return bound

    def delegate(self, request: DelegationRequest) -> DelegationResult:
        """Run ``request`` to its end; failures are ``DelegationError``."""
        if not isinstance(request, DelegationRequest):
            raise TypeError("delegate needs a DelegationRequest")
        if not isinstance(request.prompt, str) or not request.prompt:
            raise ValueError("a delegation needs a non-empty prompt")
        if request.timeout is not None and not (request.timeout > 0):  # (NaN is neither)
            raise ValueError(f"a delegation timeout must be a positive number of seconds, not {request.timeout!r}")
        return _Delegation(self._registry, self._pool, self._on_update, request).run()

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> Delegator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ClientPool:
    """One client per agent key: the card is discovered once and connections are reused."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._lock = threading.Lock()
        self._clients: dict[str, Client] = {}

    def timeout_for(self, spec: RemoteAgentSpec) -> float:
        """The bound of one request to ``spec``'s agent, deadline aside."""
        return min(self._timeout, spec.policy.max_timeout)

    def get(self, spec: RemoteAgentSpec) -> Client:
        with self._lock:
            client = self._clients.get(spec.key)
            if client is None:
                client = self._clients[spec.key] = Client(
                    spec.card_url,
                    card=spec.card,
                    auth=spec.auth,
                    trusted_origins=spec.trusted_origins,
                    timeout=self.timeout_for(spec),
                )
            return client

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


class _Delegation:
    """The state of one ``delegate`` call."""

    def __init__(
        self,
        registry: Registry,
        pool: _ClientPool,
        on_update: UpdateSink | None,
        request: DelegationRequest,
    ) -> None:
        self.registry = registry
        self.pool = pool
        self.on_update = on_update
        self.request = request
        self.id = uuid.uuid4().hex
        self.agent = request.agent
        self.deadline = 0.0
        self.limit = 0.0
        self.client_timeout = _CLIENT_TIMEOUT
        self.client: Client | None = None
        self.stream: EventStream | None = None
        self.sent = False  # the stream's message may have gone out (it goes at the first read)
        self.task_id = ""
        self.context_id = ""
        self.state: TaskState | None = None
        self.streamed = False
        self.artifacts = _Artifacts()
        self.messages = _Messages()
        self.policy = Policy()

    # -- the flow

    def run(self) -> DelegationResult:
        spec = self.registry.get(self.request.agent)
        if spec is None:
            raise self.fail("agent_not_found")
        self.policy = policy = spec.policy
        self.limit = min(self.request.timeout or policy.max_timeout, policy.max_timeout)
        self.deadline = _now() + self.limit
        self.client_timeout = self.pool.timeout_for(spec)
        self.emit("started", display_name=spec.name)
        from . import DelegationError

        try:
            return self.run_with(spec)
        except DelegationError:
            raise
        except BaseException:
            # KeyboardInterrupt or a bug: the remote task must not outlive this call.
            self.cancel_remote()
            raise

    def run_with(self, spec: RemoteAgentSpec) -> DelegationResult:
        policy = self.policy
        self.check_local()
        try:
            self.client = client = self.pool.get(spec)
        except ImportError as exc:  # the a2a extra is missing: this host's setup, no remote's
            raise self.fail("configuration_error", reason="a2a_sdk_missing", cause=exc) from exc
        bound, by_deadline = self.request_bound()
        try:
            card = client.agent_card(timeout=bound)
        except Exception as exc:
            raise self.request_failure(exc, by_deadline) from exc
        self.check_local()
        if (policy.require_streaming or self.request.stream) and not card.streaming:
            raise self.fail("capability_unsupported", reason="streaming_unsupported")
        wants_stream = self.request.stream if self.request.stream is not None else card.streaming
        if wants_stream or policy.require_streaming:
            result = self.run_stream(client, require=policy.require_streaming)
            if result is not None:
                return result
        return self.run_polls(client, known=False)

    def run_stream(self, client: Client, *, require: bool) -> DelegationResult | None:
        """The streamed delegation, or None when the stream could not be opened and polling may
        take over."""
        try:
            stream = client.send_stream(self.request.prompt, self.request.context_id)
        except UnsupportedError as exc:
            if require:
                raise self.fail("capability_unsupported", reason="streaming_unsupported") from exc
            return None
        except Exception as exc:
            raise self.client_failure(exc) from exc
        self.stream = stream
        self.streamed = True
        with stream:
            while True:
                self.check_local()
                self.sent = True
                try:
                    event = stream.next_event(self.wait_slice())
                except StreamRecoveryError as exc:
                    # The client already fetched the task once; polling keeps recovering until
                    # the task is final or the budget runs out.
                    self.task_id = exc.task_id or self.task_id
                    self.emit("stream.dropped", task_id=self.task_id)
                    break
                except ConnectionError as exc:
                    if self.task_id:
                        raise self.client_failure(exc) from exc
                    # Nothing reached us: the stream never opened.
                    if require:
                        raise self.fail("stream_unavailable", retryable=True) from exc
                    self.emit("stream.unavailable")
                    return None
                except Exception as exc:
                    raise self.client_failure(exc) from exc
                if event is None:
                    if stream.ended:
                        raise self.fail("protocol_error")
                    continue
                done = self.on_event(event)
                if done is not None:
                    return done
        return self.run_polls(client, known=True)

    def run_polls(self, client: Client, *, known: bool) -> DelegationResult:
        """Poll the task to its end; ``known`` means a dropped stream already created it."""
        policy = self.policy
        task: Task | None = None
        if not known:
            bound, by_deadline = self.request_bound()
            try:
                task = client.send(
                    self.request.prompt,
                    self.request.context_id,
                    return_immediately=True,
                    timeout=bound,
                )
            except Exception as exc:
                raise self.request_failure(exc, by_deadline) from exc
            self.observe_task(task)
        polls = 0
        while task is None or not task.state.final:
            if polls >= policy.max_polls:
                self.cancel_remote()
                raise self.fail("deadline_exceeded", reason="max_polls", max_polls=policy.max_polls)
            self.pause(policy.poll_interval)
            polls += 1
            bound, by_deadline = self.request_bound()
            try:
                task = client.get_task(self.task_id, timeout=bound)
            except Exception as exc:
                raise self.request_failure(exc, by_deadline) from exc
            self.observe_task(task)
        return self.finish(task.state, task.status_message, task=task, recovered=known)

    # -- events

    def on_event(self, event: StreamEvent) -> DelegationResult | None:
        if isinstance(event, TaskEvent):
            self.observe_task(event.task, artifacts=False)
        elif isinstance(event, StatusEvent):
            self.task_id = event.task_id or self.task_id
            self.context_id = event.context_id or self.context_id
            self.set_state(event.state, event.message)
        elif isinstance(event, ArtifactEvent):
            self.task_id = event.task_id or self.task_id
            self.add_artifact(event.artifact, append=event.append)
            self.emit(
                "delta",
                delta=event.artifact.text,
                artifact_id=event.artifact.artifact_id,
                append=event.append,
                last_chunk=event.last_chunk,
            )
        elif isinstance(event, MessageEvent):
            self.context_id = event.message.context_id or self.context_id
            self.messages.add(event.message, last=True)
            self.emit("delta", delta=event.message.text)
            return self.finish(TaskState.COMPLETED, None, task=None, recovered=False)
        elif isinstance(event, TerminalEvent):
            self.task_id = event.task_id or self.task_id
            if event.task is not None:
                self.observe_task(event.task, emit=False)
            return self.finish(
                event.state, event.message, task=event.task, recovered=event.recovered
            )
        return None

    def observe_task(self, task: Task, *, artifacts: bool = True, emit: bool = True) -> None:
        self.task_id = task.id or self.task_id
        self.context_id = task.context_id or self.context_id
        if emit:
            self.set_state(task.state, task.status_message)
        else:
            self.state = task.state
        if artifacts and task.artifacts:
            # A full snapshot is authoritative: it replaces what the stream assembled.
            self.artifacts = _Artifacts()
            for artifact in task.artifacts:
                self.add_artifact(artifact, append=False)

    def set_state(self, state: TaskState, message: Message | None) -> None:
        if message is not None:
            self.messages.add(message)
        if state is self.state:
            return
        self.state = state
        self.emit(
            "status",
            state=state.value,
            task_id=self.task_id,
            text=message.text if message is not None else "",
        )

    def add_artifact(self, artifact: Artifact, *, append: bool) -> None:
        self.artifacts.add(artifact, append=append)
        limit = self.policy.max_artifact_bytes
        if self.artifacts.size > limit:
            self.cancel_remote()
            raise self.fail("policy_violation", limit_bytes=limit)

    def finish(
        self, state: TaskState, message: Message | None, *, task: Task | None, recovered: bool
    ) -> DelegationResult:
        if message is not None:
            self.messages.add(message)
        self.state = state
        remote_status = state.value
        promoted = _promoted(state, message)
        if promoted is not None:
            code, limit_ms = promoted
            extra: dict[str, Any] = {} if limit_ms is None else {"limit_ms": limit_ms}
            raise self.fail(code, reason=f"remote_{code}", remote_status=remote_status, **extra)
        if state is TaskState.CANCELED:
            raise self.fail(
                "cancelled", reason="remote_cancelled", retryable=True, remote_status=remote_status
            )
        if state is TaskState.FAILED:
            raise self.fail("remote_failed", remote_status=remote_status)
        if state is TaskState.REJECTED:
            raise self.fail("remote_failed", reason="rejected", remote_status=remote_status)
        if state is TaskState.AUTH_REQUIRED:
            raise self.fail("remote_failed", reason="auth_required", remote_status=remote_status)
        if state is TaskState.INPUT_REQUIRED and not self.policy.allow_input_required:
            raise self.fail("remote_failed", reason="input_required", remote_status=remote_status)
        artifacts = self.artifacts.assembled()
        text = "".join(a.text for a in artifacts)
        last = self.messages.last()
        if not text and last is not None:
            text = last.text
        self.emit(
            "finished",
            state=state.value,
            task_id=self.task_id,
            recovered=recovered,
            streamed=self.streamed,
        )
        return DelegationResult(
            delegation_id=self.id,
            agent=self.agent,
            status=state,
            text=text,
            remote_task_id=self.task_id,
            remote_context_id=self.context_id,
            artifacts=artifacts,
            messages=self.messages.kept(),
            streamed=self.streamed,
            recovered=recovered,
            task=task,
        )

    # -- local cancellation and the deadline

    def remaining(self) -> float:
        return self.deadline - _now()

    def request_bound(self) -> tuple[float, bool]:
        """The bound of the next request to the remote, and whether it is the deadline's.

        A request (the card fetch, the polling send, a poll) cannot be sliced as a stream's
        reads are: it gets what is left of the deadline, so a remote that never answers fails
        the delegation at its deadline, not at the client's own bound.
        """
        remaining = max(self.remaining(), 0.001)
        if remaining <= self.client_timeout:
            return remaining, True
        return self.client_timeout, False

    def wait_slice(self) -> float:
        remaining = max(self.remaining(), 0.0)
        # A CancelSignal cannot wake a blocked read, so reads are sliced while one is set up.
        return min(remaining, _CANCEL_CHECK_INTERVAL) if self.request.cancel else remaining

    def check_local(self) -> None:
        cancel = self.request.cancel
        if cancel is not None and cancel.is_set():
            self.abort("cancelled")
        if self.remaining() <= 0:
            self.abort("deadline_exceeded")

    def pause(self, seconds: float) -> None:
        self.check_local()
        delay = min(seconds, max(self.remaining(), 0.0))
        cancel = self.request.cancel
        if cancel is not None:
            cancel.wait(delay)
        else:
            threading.Event().wait(delay)
        self.check_local()

    def abort(self, code: str) -> None:
        raise self.stopped(code)

    def stopped(self, code: str) -> DelegationError:
        """Stop here (cancelled, or out of time): the remote task is cancelled."""
        if self.stream is not None:
            if self.sent and not self.task_id:
                self.await_task_id(_AWAIT_TASK_ID if code == "cancelled" else _REMOTE_CANCEL_TIMEOUT)
            self.stream.close()
        self.cancel_remote()
        if code == "deadline_exceeded":
            return self.fail(code, limit_ms=round(self.limit * 1000))
        return self.fail(code)

    def await_task_id(self, within: float) -> None:
        """Read the open stream, for up to ``within`` seconds, until it names the task its
        message made.

        Cancelled or out of time before the remote named its task, the delegation must still
        cancel it: the message was sent, so the task runs on without this.  (``time.monotonic``,
        not ``_now``: the tests move the delegation's clock to expire its deadline.)
        """
        stream = self.stream
        assert stream is not None
        give_up = time.monotonic() + within
        while not stream.task_id and not stream.ended:
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return
            try:
                event = stream.next_event(remaining)
            except Exception as exc:  # best effort, as the cancel itself
                self.task_id = getattr(exc, "task_id", "") or self.task_id
                return
            if isinstance(event, MessageEvent):
                return  # answered without a task: nothing runs on
            if isinstance(event, TerminalEvent):
                self.state = event.state  # over already: nothing to cancel
        self.task_id = stream.task_id or self.task_id

    def cancel_remote(self) -> None:
        if self.client is None or not self.task_id or (self.state and self.state.final):
            return
        try:
            self.client.cancel_task(self.task_id, timeout=_REMOTE_CANCEL_TIMEOUT)
        except Exception as exc:  # best effort: the local outcome is already decided
            log.debug("remote cancel of task %s failed: %r", self.task_id, exc)

    # -- failures and progress

    def request_failure(self, exc: BaseException, by_deadline: bool) -> DelegationError:
        """``client_failure``, but a request cut short by the deadline is its own failure, and
        one that failed after a local cancel is that cancel (the leader gave up on the answer)."""
        cancel = self.request.cancel
        if cancel is not None and cancel.is_set():
            return self.stopped("cancelled")
        if by_deadline and isinstance(exc, TimeoutError):
            return self.stopped("deadline_exceeded")
        return self.client_failure(exc)

    def client_failure(self, exc: BaseException) -> DelegationError:
        if isinstance(exc, InvalidAgentCardError):
            return self.fail("agent_unavailable", reason="invalid_agent_card", cause=exc)
        if isinstance(exc, UnauthorizedError):
            return self.fail("configuration_error", reason="unauthorized", cause=exc)
        if isinstance(exc, UntrustedOriginError):
            return self.fail("configuration_error", reason="untrusted_origin", cause=exc)
        if isinstance(exc, UnsupportedError):
            return self.fail("capability_unsupported", cause=exc)
        if isinstance(exc, NotFoundError):
            return self.fail("remote_failed", reason="task_not_found", cause=exc)
        if isinstance(exc, ProtocolError):
            return self.fail("protocol_error", cause=exc)
        if isinstance(exc, ConnectionError | TimeoutError | StreamRecoveryError):
            # A throttled or failing server's Retry-After (the a2a client's attribute).
            retry_after = getattr(exc, "retry_after", None)
            extra = {} if retry_after is None else {"retry_after_s": retry_after}
            return self.fail("agent_unavailable", retryable=True, cause=exc, **extra)
        raise exc

    def fail(
        self,
        code: str,
        *,
        reason: str | None = None,
        retryable: bool = False,
        remote_status: str | None = None,
        cause: BaseException | None = None,
        **extra: Any,
    ) -> DelegationError:
        from . import DelegationError

        metadata: dict[str, Any] = {"delegation_id": self.id, "agent": self.agent}
        if reason is not None:
            metadata["reason"] = reason
        if self.task_id:
            metadata["remote_task_id"] = self.task_id
        metadata.update(extra)
        err = DelegationError(
            code,
            _MESSAGES[reason or code],
            retryable=retryable,
            remote_status=remote_status,
            metadata=metadata,
        )
        if cause is not None:
            err.cause = cause
            err.__cause__ = cause
        self.emit(
            "cancelled" if code == "cancelled" else "failed",
            code=code,
            reason=reason or code,
            retryable=retryable,
            remote_status=remote_status,
        )
        return err

    def emit(self, kind: str, *, delta: str = "", **data: Any) -> None:
        if self.on_update is None:
            return
        update = SubagentUpdate(
            agent=self.agent, kind=kind, delta=delta, data={"delegation_id": self.id, **data}
        )
        try:
            self.on_update(update)
        except Exception:  # a progress observer cannot fail the delegation
            log.exception("a2adelegation progress sink failed")


class _Messages:
    """The messages of one delegation, each once, the latest ``_KEPT_MESSAGES`` of them.

    A remote reporting progress a token at a time (the adaptord bridge sends a status message
    per text delta) sends thousands: looking each up in a list made a delegation quadratic
    (20,000 took a minute), and keeping them all let a chatty remote grow it without end.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[Hashable, Message] = OrderedDict()

    def add(self, message: Message, *, last: bool = False) -> None:
        """Keep ``message`` unless an equal one is kept; ``last`` moves that one to the end."""
        key = _message_key(message)
        if key in self._kept:
            if last:
                self._kept.move_to_end(key)
            return
        self._kept[key] = message
        if len(self._kept) > _KEPT_MESSAGES:
            self._kept.popitem(last=False)

    def last(self) -> Message | None:
        return next(reversed(self._kept.values()), None)

    def kept(self) -> tuple[Message, ...]:
        return tuple(self._kept.values())


def _message_key(message: Message) -> Hashable:
    """What tells ``message`` apart from another: what its equality compares."""
    try:
        hash(message)
    except TypeError:  # a data part holding a dict or a list
        return (
            message.message_id,
            message.role,
            message.context_id,
            message.task_id,
            tuple(
                (p.kind, p.text, p.url, p.raw, p.media_type, p.filename, _data_key(p.data))
                for p in message.parts
            ),
        )
    return message


def _data_key(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str)


class _Artifacts:
    """The artifacts of one delegation, assembled from the chunks the stream delivers.

    A remote that streams its answer a token at a time sends thousands of appended chunks: each
    costs its own size here, where rebuilding the artifact and recounting every byte held per
    chunk made a delegation quadratic in its answer (20,000 chunks of a few bytes took a
    minute of CPU, well within the 8 MiB limit).
    """

    def __init__(self) -> None:
        # Per artifact id: the first chunk (its name, description, metadata) and every part.
        self._first: dict[str, Artifact] = {}
        self._parts: dict[str, list[Part]] = {}
        self._sizes: dict[str, int] = {}
        self.size = 0
        """The content bytes held, over all artifacts (``Policy.max_artifact_bytes``)."""

    def add(self, artifact: Artifact, *, append: bool) -> None:
        key = artifact.artifact_id
        size = sum(_part_bytes(part) for part in artifact.parts)
        first = self._first.get(key)
        if append and first is not None:
            if not (first.name and first.description) and (artifact.name or artifact.description):
                self._first[key] = Artifact(
                    artifact_id=key,
                    name=first.name or artifact.name,
                    description=first.description or artifact.description,
                    metadata=first.metadata,
                )
            self._parts[key].extend(artifact.parts)
            self._sizes[key] += size
        else:
            # A chunk that does not append replaces the artifact with that id.
            self.size -= self._sizes.get(key, 0)
            self._first[key] = artifact
            self._parts[key] = list(artifact.parts)
            self._sizes[key] = size
        self.size += size

    def assembled(self) -> tuple[Artifact, ...]:
        return tuple(
            Artifact(
                artifact_id=key,
                name=first.name,
                description=first.description,
                parts=tuple(self._parts[key]),
                metadata=first.metadata,
            )
            for key, first in self._first.items()
        )


def _part_bytes(part: Part) -> int:
    size = len(part.text.encode()) + len(part.raw) + len(part.url.encode())
    if part.data is not None:
        size += len(json.dumps(part.data, default=str).encode())
    return size
