"""What the CLI drivers (claude, codex, gemini, cursor, codebuddy) share above the process
runner (:mod:`._process`) and line decoding (:mod:`._lines`): the ``Config`` fields every CLI
has, the ``Driver`` methods that only differ by name, one run's spawn-parse-respond loop,
``replay``, the session and failure rules they have in common, and the helpers for Claude
Code's stream-json envelope (which CodeBuddy speaks too).

A driver module keeps what is specific to its CLI: argv and env, its event parser and the
shapes of its failures.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, Protocol, Self, TypeVar

from adaptor import _nesting
from adaptor.driver import (
    Checkpoint,
    DecisionChoice,
    DecisionKind,
    DecisionRequest,
    DecisionResponse,
    EventSink,
    Request,
    Response,
    RunFailure,
    SessionCodec,
    SessionState,
    StandardSessionCodec,
    canonical_fingerprint,
)
from adaptor.drivers import _process
from adaptor.drivers._lines import FailureKind, as_dict, as_int, as_list, as_str
from adaptor.drivers._lines import Protocol as LineProtocol
from adaptor.drivers._process import CannotStart, Child, Exit, Line, Spec, StreamName
from adaptor.errors import ResumeRejectedError
from adaptor.result import StructuredOutput, TerminalPayload, Usage, raw_streams_of

# --- Config and Driver --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessConfig:
    """The fields every driver that runs an executable has in its ``Config``, in this order
    (positional construction depends on it)."""

    command: str
    # Values are secrets (see secret_values): a repr (a log line, a traceback) leaves them out.
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    extra_args: tuple[str, ...] = ()
    cwd: str | None = None
    grace_period: float = 2.0

    def __post_init__(self) -> None:
        if isinstance(self.extra_args, list):
            object.__setattr__(self, "extra_args", tuple(self.extra_args))

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> Self:
        """A config from a JSON object (daemon requests); unknown keys are refused."""
        return _process.config_from_dict(cls, obj)


@dataclass(frozen=True)
class CliConfig(ProcessConfig):
    """A coding-agent CLI's ``Config`` fields; a driver redeclares ``command`` with its
    binary's name (a redeclared field keeps its place)."""

    command: str = ""
    model: str = ""


C = TypeVar("C", bound=CliConfig)


class CliDriver(Generic[C]):
    """The SPI methods a CLI driver has regardless of its CLI.  A subclass names its type,
    config class and fingerprint, and implements ``_check`` (the config's own rules)."""

    _type: ClassVar[str]
    _fingerprint_domain: ClassVar[str]
    # Config fields a resumed conversation depends on; the names of ``env`` always count.
    _fingerprint_fields: ClassVar[tuple[str, ...]]
    # The variables holding the CLI's credentials (API keys, tokens): their inherited values
    # are secrets of the run, as its config's env values are.
    _credentials: ClassVar[tuple[str, ...]] = ()
    _config_type: type[C]

    def __init__(self, config: C | Mapping[str, Any] | None = None) -> None:
        self._config: C = copy.deepcopy(self._config_type() if config is None
                                        else self._coerce(config))

    def __repr__(self) -> str:
        c = self._config
        return f"{self._type}.Driver(command={c.command!r}, model={c.model!r})"

    def validate_config(self, config: object | None = None) -> None:
        """Check ``config`` (``None``: the captured one); raise ``TypeError``/``ValueError``."""
        self._check(self._config if config is None else self._coerce(config))

    def session_codec(self) -> SessionCodec:
        return StandardSessionCodec(self._type)

    def secret_values(self) -> list[str]:
        """Values no event, result or error of a run may show (SPI, optional)."""
        return _process.secret_values(self._config.env, self._credentials)

    def session_config_fingerprint(self) -> str:
        c = self._config
        values: dict[str, Any] = {name: getattr(c, name) for name in self._fingerprint_fields}
        values["env_names"] = sorted(c.env)
        return canonical_fingerprint(self._fingerprint_domain, values)

    def _check(self, config: C) -> None:
        raise NotImplementedError

    def _coerce(self, config: object) -> C:
        return _process.coerce_config(self._config_type, config, self._type)

    def _config_for(self, request: Request) -> C:
        """The run's config (the request's, else the captured one), validated."""
        config = self._config if request.config is None else self._coerce(request.config)
        self._check(config)
        return config


def check_config(config: CliConfig) -> None:
    """Validate the :class:`CliConfig` fields; ``TypeError``/``ValueError``."""
    _process.check_common(
        config.command, config.env, config.extra_args, config.cwd, config.grace_period
    )
    if not isinstance(config.model, str):
        raise TypeError("model: expected a string")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value and value not in choices:
        raise ValueError(f"{name}: expected one of {', '.join(choices)}")


def check_optional_path(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"{name}: expected a non-empty string or null")


def flags_in(extra_args: Iterable[str]) -> Iterator[str]:
    """The flag each argument names, as these CLIs' parsers read it: ``--flag=value`` is
    ``--flag``, and ``-mgpt`` is ``-m`` (``-pc`` is ``-p -c``: the flag is the first letter; a
    value of another option that starts so counts too, ``--option=-mvalue`` says it
    unambiguously)."""
    for arg in extra_args:
        yield arg[:2] if len(arg) > 2 and arg[0] == "-" and arg[1] != "-" else arg.split("=", 1)[0]


def check_owned_flags(extra_args: tuple[str, ...], owned: frozenset[str],
                      why: str = "is set by the driver itself",
                      flags_of: Callable[[tuple[str, ...]], Iterable[str]] = flags_in) -> None:
    """Refuse ``extra_args`` that set a flag the driver owns, read by ``flags_of`` as the
    CLI's parser reads them."""
    for flag in flags_of(extra_args):
        if flag in owned:
            raise ValueError(f"extra_args: {flag} {why}")


# The permission modes of Claude-Code-compatible CLIs (claude, codebuddy) in which the CLI asks
# before a tool runs that needs permission ("manual" is claude's alias of "default"); the others
# decide alone (acceptEdits, auto, bypassPermissions allow; dontAsk denies without asking), so
# an explicit ask or auto_reject policy must not run under them.
ASKING_PERMISSION_MODES: Final = frozenset({"default", "manual", "plan"})


def permission_overridden(cli: str, request: Request, flags: Iterable[str],
                          pre_approving: frozenset[str], permissions: frozenset[str],
                          why: str) -> Response | None:
    """The refusal of a run whose explicit approval permission is one of ``permissions`` when
    ``flags`` (the extra_args' flags, as the CLI reads them) hold any of ``pre_approving``:
    the CLI would let tools run past the policy (``why``)."""
    approvals = None if request.policy is None else request.policy.approvals
    if approvals is None or approvals.permission not in permissions:
        return None
    found = sorted(set(flags) & pre_approving)
    if not found:
        return None
    what = f"the policy's permission {approvals.permission!r} ({why})"
    return overridden_by_extra_args(cli, what, found)


def overridden_by_extra_args(cli: str, what: str, found: Sequence[str]) -> Response:
    """The refusal of a run whose explicit setting ``what`` the ``found`` extra_args would
    override: the CLI would obey them, and the run report a success it did not have."""
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver",
        message=f"{cli} cannot honour {what}: extra_args override it ({', '.join(found)})",
        details={"kind": "policy_in_extra_args", "extra_args": list(found)},
    ))


# --- one run --------------------------------------------------------------------------------------


class Parser(Protocol):
    """What :func:`run_child` and :func:`replay` need of a driver's parser."""

    def feed(self, line: Line) -> object: ...

    def response(self, exit_: Exit, stdout: str, stderr: str) -> Response: ...


P = TypeVar("P", bound=Parser)


def run_child(spec: Spec, sink: EventSink, request: Request, parser: P,
              converse: Callable[[Child, P], None] | None = None) -> Response:
    """Start the CLI, feed every line to ``parser`` (after ``converse``, which drives a
    conversation on stdin) until it exits, and return the parser's Response."""
    try:
        child = Child.start(spec, sink)
    except CannotStart as exc:
        return _process.cannot_start(exc)
    try:
        with child.watch(sink.cancelled, _process.monotonic_deadline(request.deadline)):
            if converse is not None:
                converse(child, parser)
            for line in child.lines(sink):
                parser.feed(line)
            exit_ = child.finish()
    except BaseException:  # no run may leave its CLI behind, whatever ended it
        child.abandon()
        raise
    stdout, stderr = child.take_raw()
    return parser.response(exit_, stdout, stderr)


def replay(parser: Parser, stdout: str | bytes, stderr: str | bytes,
           exit_code: int | None) -> Response:
    """Feed captured output to ``parser`` as if a run had printed it; ``None`` exit code: the
    process was killed (SIGTERM)."""
    data = [stdout.encode() if isinstance(stdout, str) else stdout,
            stderr.encode() if isinstance(stderr, str) else stderr]
    streams: tuple[tuple[StreamName, bytes], ...] = (("stdout", data[0]), ("stderr", data[1]))
    for stream, blob in streams:
        lines = blob.splitlines()
        # A stream that ends without a newline ends with a partial line, as a live run says.
        cut = not blob.endswith((b"\n", b"\r"))
        for number, raw in enumerate(lines, 1):
            if cut and number == len(lines):
                parser.feed(Line(stream, raw, partial=True, ending=b""))
            else:
                parser.feed(Line(stream, raw))
    exit_ = Exit(exit_code=exit_code, signal=None if exit_code is not None else 15)
    return parser.response(exit_, *(b.decode("utf-8", "replace") for b in data))


def cwds(config: CliConfig, request: Request) -> tuple[str | None, str]:
    """Where the CLI is spawned (``None``: here) and the absolute directory its sessions are
    kept under."""
    spawn_cwd = request.workspace_cwd or config.cwd
    return spawn_cwd, os.path.realpath(spawn_cwd or os.getcwd())


def resume_target(request: Request, session_cwd: str, *,
                  no_fork: str = "") -> tuple[str | None, bool]:
    """The session id to resume (``None``: a fresh one) and whether to fork it.

    ``no_fork``: the CLI cannot fork, and this is why.  A session stored from another
    directory is refused: the CLIs keep sessions per working directory.
    """
    session = request.session
    if session is None or session.state is None or session.mode == "stateless":
        return None, False
    if no_fork and session.mode == "fork":
        raise ResumeRejectedError(no_fork)
    stored_cwd = session.state.data.get("cwd")
    if stored_cwd and os.path.realpath(stored_cwd) != session_cwd:
        raise ResumeRejectedError("session working directory changed")
    return session.state.resume_id, session.mode == "fork"


def asked_questions(
    tool_input: Mapping[str, Any], untitled: str
) -> list[tuple[str, tuple[DecisionChoice, ...], str]]:
    """The questions of an ``AskUserQuestion`` call (Claude-Code-compatible CLIs take up to
    four), each as ``(title, choices, question)``; at least one (titled ``untitled``)."""
    asked = []
    for entry in [as_dict(q) for q in as_list(tool_input.get("questions"))] or [{}]:
        question = as_str(entry.get("question"))
        choices = tuple(
            DecisionChoice(key=as_str(o.get("label")), label=as_str(o.get("label")),
                           description=as_str(o.get("description")))
            for o in map(as_dict, as_list(entry.get("options"))) if as_str(o.get("label"))
        )
        asked.append((question or untitled, choices, question))
    return asked


def decide_in_turn(
    sink: EventSink, kind: DecisionKind,
    asked: Sequence[tuple[str, tuple[DecisionChoice, ...], str]], *, source: str,
    tool_call_id: str, payload: Mapping[str, Any],
    decided: Callable[[DecisionResponse], object],
) -> tuple[DecisionResponse, dict[str, str]]:
    """Ask each of ``asked`` (one ``(title, choices, question)`` per decision) in turn, a
    question with its ``question_index``, telling ``decided`` of every response; the first not
    approved or answered decides the call.  Returns the deciding response and the answers by
    question."""
    answers: dict[str, str] = {}
    for index, (title, choices, question) in enumerate(asked):
        shown = {**payload, "question_index": index} if kind == "question" else payload
        decision = sink.request_decision(DecisionRequest(
            kind=kind, title=title, source=source, tool_call_id=tool_call_id,
            payload=shown, choices=choices))
        decided(decision)
        if decision.result not in ("approved", "answered"):
            break
        if kind == "question":
            answers[question] = decision.choice or decision.text
    return decision, answers


def stored_in_checkpoint(request: Request, key: str) -> str | None:
    """What the checkpoint of the session a run resumes keeps under ``key`` (None: nothing)."""
    state = None if request.session is None else request.session.state
    return None if state is None else state.data.get(key)


def prompt_of(request: Request) -> str:
    """The prompt with the run's instructions in front (none of the CLIs has a flag for them)."""
    if request.instructions:
        return f"{request.instructions}\n\n{request.prompt}"
    return request.prompt


def no_append(cli: str) -> Response:
    """The refusal of ``append_system_prompt`` by a CLI that can only replace its prompt."""
    return Response(exit_code=None, failure=RunFailure(
        code="unsupported_driver",
        message=f"{cli} cannot append to its system prompt",
        details={"kind": "append_system_prompt_unsupported"},
    ))


def checkpoint(session_id: str, session_cwd: str, **data: str) -> Checkpoint:
    """A valid checkpoint of ``session_id``, kept under the directory the CLI keeps it in
    (checked by :func:`resume_target`), with the driver's own ``data`` beside."""
    state = SessionState(resume_id=session_id, display_id=session_id,
                         data={**data, "cwd": session_cwd})
    return Checkpoint(state, valid=True)


def response(exit_: Exit, protocol: LineProtocol, stdout: str | bytes, stderr: str | bytes, *,
             terminal_event: str | None, output: str, provider: str, model: str,
             failure: RunFailure | None, checkpoint: Checkpoint | None,
             metadata: dict[str, str], usage: Usage | None = None,
             structured_output: StructuredOutput | None = None, summary: str = "") -> Response:
    """A run's Response: the raw streams (with the terminal line when ``terminal_event`` names
    the event that ended the run), the transcript and how the process ended, as every CLI
    driver reports them, plus what its parser made of the run.  The streams may be the bytes
    the process printed: they are decoded when first read."""
    return Response(
        output=output,
        raw_streams=raw_streams_of(
            stdout, stderr,
            None if terminal_event is None
            else TerminalPayload(event=terminal_event, json=protocol.terminal_line),
        ),
        transcript=tuple(protocol.transcript),
        exit_code=exit_.exit_code,
        signal=exit_.signal,
        timed_out=exit_.timed_out,
        usage=usage,
        checkpoint=checkpoint,
        metadata=metadata,
        provider=provider,
        model=model,
        summary=summary,
        structured_output=structured_output,
        failure=failure,
    )


# --- failures -------------------------------------------------------------------------------------


# An HTTP status quoted in an error message: after a word that says so ("status 503", "HTTP
# 429", "API Error: 401", "code": 500), or before its reason phrase ("503 Service
# Unavailable").  A bare number is not one: "parse error at line 512" or "exceeded 401 tokens"
# made deterministic failures retryable (or "auth") when any 4xx/5xx-looking number counted.
_HTTP_STATUS: Final = re.compile(
    r"""(?:\b(?:status|http(?:/[\d.]+)?|error|code)\b["']?\s*[:=]?\s*)([45]\d\d)\b"""
    r"|\b([45]\d\d)\s+(?:unauthori[sz]ed|forbidden|too many requests|internal server error|"
    r"bad gateway|service unavailable|gateway time-?out)\b",
    re.IGNORECASE,
)


def quoted_status(message: str) -> int | None:
    """The HTTP status an error message quotes (see ``_HTTP_STATUS``), if any."""
    found = _HTTP_STATUS.search(message)
    return None if found is None else int(found.group(1) or found.group(2))


# Failures no retry mends, in the words of the providers (their error codes and messages) and
# of the CLIs that relay them: a spent quota or credit balance, a model the provider does not
# know, a prompt over the model's context window.  They are checked before any status, which
# says too little here: a spent quota is a 429 like a passing rate limit, and a script that
# retried it as one retried for ever.  Gemini words its per-minute limits like OpenAI's spent
# quota ("You exceeded your current quota, please check your plan and billing details"), so
# that sentence alone is no quota; Gemini CLI's own verdict is ("exhausted your daily quota",
# or the API's "limit: 0", a quota the project does not have at all).
_LASTING: Final[tuple[tuple[FailureKind, re.Pattern[str]], ...]] = (
    ("quota", re.compile(
        r"insufficient_quota|billing_error|credit balance is too low|"
        r"quota exceeded\W+check your plan and billing|exhausted your daily quota|"
        r"quota exceeded for metric\b.{0,200}?\blimit:\s*0(?![\d.])",
        re.IGNORECASE)),
    ("model_not_found", re.compile(
        r"model_not_found|\bmodel not found\b|\bmodels/\S+ is not found|"
        r"the model `[^`]+` does not exist|issue with the selected model|"
        r"not_found_error\b.{0,40}\bmodel:",
        re.IGNORECASE)),
    ("context_too_long", re.compile(
        r"prompt is too long|prompt_too_long|context_length_exceeded|maximum context length|"
        r"exceeds the context window|out of room in the model's context window|"
        r"exceeds the maximum number of tokens|"
        # (codex 0.171.0's own limit on a prompt, before any request: "input_too_large")
        r"\binput exceeds the maximum length\b|\binput_too_large\b",
        re.IGNORECASE)),
)


def lasting_kind(message: str) -> FailureKind:
    """The failure class of an error no retry mends (``quota``, ``model_not_found``,
    ``context_too_long``), if the message names one; checked before its status."""
    for kind, pattern in _LASTING:
        if pattern.search(message):
            return kind
    return ""


@dataclass(frozen=True)
class FailureShapes:
    """How a CLI words the provider failures it reports, checked in this order, after the
    failures no retry mends (:func:`lasting_kind`) and the HTTP status the message quotes
    (:func:`quoted_status`)."""

    auth: re.Pattern[str]
    rate_limit: re.Pattern[str]
    unavailable: re.Pattern[str]
    # The CLI's own words for a lasting ``quota`` failure (a plan without the product, say),
    # beside the providers' words :func:`lasting_kind` knows.
    quota: re.Pattern[str] | None = None

    def kind(self, message: str) -> FailureKind:
        lasting = lasting_kind(message)
        if lasting:
            return lasting
        if self.quota is not None and self.quota.search(message):
            return "quota"
        status = quoted_status(message)
        if status is not None and status_kind(status):
            return status_kind(status)
        if self.auth.search(message):
            return "auth"
        if self.rate_limit.search(message):
            return "rate_limit"
        if self.unavailable.search(message):
            return "provider_unavailable"
        return ""


def status_kind(status: int) -> FailureKind:
    """The failure class of an HTTP status the provider answered with."""
    if status in (401, 403):
        return "auth"
    if status == 429:
        return "rate_limit"
    return "provider_unavailable" if status >= 500 else ""


def run_failure(cli: str, exit_: Exit, protocol: LineProtocol, *,
                reported: RunFailure | None,
                terminal: bool,
                died: Callable[[RunFailure], RunFailure] | None = None) -> RunFailure | None:
    """A run's failure, in the order every CLI driver decides it: what the CLI ``reported``
    (its error terminal), a malformed stream (unless a signal ended the process before its
    terminal: see :func:`killed_early`), nothing for the host's own cancel or deadline, a
    process that ended without its ``terminal`` (``died`` may refine the plain verdict) and an
    unclean exit."""
    if reported is not None:
        return reported
    if protocol.malformed and not killed_early(exit_, protocol, terminal=terminal):
        return malformed(cli, protocol)
    if exit_.cancelled or exit_.timed_out:
        return None  # the host's cancellation or deadline keeps its own identity
    if not terminal:
        verdict = protocol.died(cli, exit_.describe(), exit_code=exit_.exit_code,
                                signal=exit_.signal)
        return verdict if died is None else died(verdict)
    if not exit_.clean:
        return exited_unsuccessfully(cli, exit_)
    return None


def killed_early(exit_: Exit, protocol: LineProtocol, *, terminal: bool) -> bool:
    """Whether a signal the host did not send ended the process before its terminal event (a
    crash, the OOM killer, a ``kill``): that death is the failure, more specific than the
    malformed stream it leaves, whose last line it may have cut in half.  The driver's own
    stop at an unreadable line (:func:`stopped_at_unreadable`) is no such death."""
    return (not terminal and exit_.signal is not None
            and not (exit_.cancelled or exit_.timed_out or protocol.stopped_unreadable))


def stopped_at_unreadable(child: Child, protocol: LineProtocol, line: Line) -> bool:
    """Stop ``child``'s group when ``line``, a whole stdout line, left ``protocol`` malformed;
    whether it did.  For the CLIs the driver converses with on stdin (claude, codebuddy's
    control transport).

    Such a CLI waits on stdin for its next input once it has printed its terminal event: when
    the line we cannot read (not UTF-8, JSON cut short) was that event, nothing else would end
    the turn before the run's deadline.  The run has failed as malformed whatever follows, so
    the CLI is stopped here; the lines it already printed are still read.  A partial line is
    the stream's end: the CLI is exiting, and how it died is the failure.
    """
    if not protocol.malformed or line.stream != "stdout" or line.partial:
        return False
    protocol.stopped_unreadable = True
    child.terminate()
    return True


def malformed(cli: str, protocol: LineProtocol) -> RunFailure:
    return RunFailure(code="agent_error",
                      message=f"{cli} printed a malformed stream: {protocol.problems[0]}",
                      details={"kind": "protocol", "problems": protocol.problems[:5]})


def exited_unsuccessfully(cli: str, exit_: Exit) -> RunFailure:
    return RunFailure(code="agent_error",
                      message=f"{cli} exited unsuccessfully ({exit_.describe()})",
                      details={"exit_code": exit_.exit_code, "signal": exit_.signal})


# --- Claude Code's stream-json envelope (claude, codebuddy) ---------------------------------------


def control_response(request_id: Any, *, response: Any = None, error: str = "") -> bytes:
    inner: dict[str, Any] = {"request_id": request_id}
    if error:
        inner.update(subtype="error", error=error)
    else:
        inner.update(subtype="success", response=response)
    # The response can echo the agent's own tool input, which may nest deeper than orjson writes.
    return _nesting.dumps({"type": "control_response", "response": inner}) + b"\n"


def envelope_usage(result: Mapping[str, Any]) -> Usage | None:
    """The ``usage`` and ``total_cost_usd`` of a ``result`` event."""
    usage = as_dict(result.get("usage"))
    cost = result.get("total_cost_usd")
    if not usage and cost is None:
        return None
    return Usage(
        input_tokens=as_int(usage.get("input_tokens")),
        output_tokens=as_int(usage.get("output_tokens")),
        cached_input_tokens=as_int(usage.get("cache_read_input_tokens")),
        cost_usd=float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool)
        else None,
    )


def content_text(content: Any) -> str:
    """The text of a message's ``content`` (a string or a list of blocks)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(as_str(p.get("text")) for p in content
                         if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else _nesting.dumps(content).decode()


def snake(name: str) -> str:
    """``AskUserQuestion`` → ``ask_user_question`` (decision sources).

    Only a capital after a small letter or digit starts a word: an MCP tool ``mcp__ADAPTOR__echo``
    is ``mcp__adaptor__echo``, not ``mcp___a_d_a_p_t_o_r__echo``.
    """
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
