"""Run policy: sandbox, features, approvals and the active-execution budget.

A ``Policy`` accepts any values when built (hosts pass values straight from config files);
``validate`` checks them when a run starts, before anything is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from adaptor.driver import (
    Descriptor,
    HumanDecisionModeUnsupportedError,
    InvalidPolicyError,
    PolicyCapabilityUnsupportedError,
)

__all__ = ["ApprovalPolicy", "EffectiveApprovals", "Policy", "validate"]

SANDBOX_LEVELS = ("read_only", "workspace_write", "unrestricted")
FEATURE_LEVELS = ("allow", "deny")
APPROVAL_MODES = ("ask", "auto_approve", "auto_reject")
QUESTION_MODES = ("ask", "auto_reject")
FALLBACKS = ("abort", "continue", "retry")

DEFAULT_APPROVAL_TIMEOUT = 30.0
DEFAULT_MAX_RETRIES = 3


@dataclass(frozen=True)
class ApprovalPolicy:
    """How approvals are decided.  ``None`` fields inherit the defaults."""

    permission: Any = None
    plan_review: Any = None
    question: Any = None
    timeout: Any = None
    on_timeout: Any = None
    on_reject: Any = None
    max_retries: Any = None


@dataclass(frozen=True)
class Policy:
    """Run policy.  Replaced whole at the call site (no field merge)."""

    sandbox: Any = None
    web_search: Any = None
    browser: Any = None
    active_execution_timeout: Any = None
    approvals: ApprovalPolicy = field(default_factory=ApprovalPolicy)


@dataclass(frozen=True)
class EffectiveApprovals:
    """The approval policy with defaults applied."""

    permission: str = "ask"
    plan_review: str = "ask"
    question: str = "auto_reject"
    timeout: float | None = DEFAULT_APPROVAL_TIMEOUT  # None: no deadline
    on_timeout: str = "abort"
    on_reject: str = "abort"
    max_retries: int = DEFAULT_MAX_RETRIES

    def mode(self, kind: str) -> str:
        return {"permission": self.permission, "plan_review": self.plan_review}.get(
            kind, self.question
        )

    @property
    def ask_kinds(self) -> frozenset[str]:
        modes = {"permission": self.permission, "plan_review": self.plan_review,
                 "question": self.question}
        return frozenset(kind for kind, mode in modes.items() if mode == "ask")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


_NO_DEADLINE_BEYOND = 100 * 365 * 24 * 3600.0
"""An approval timeout this long is no deadline at all."""


def validate(policy: Policy | None, descriptor: Descriptor) -> EffectiveApprovals:
    """Check ``policy`` against its domains and the driver's capabilities, first problem wins.

    Order: active timeout; sandbox, web_search, browser; permission, plan_review, question;
    on_timeout, on_reject; max_retries; then capabilities (sandbox, web_search, browser) and
    explicit approval modes (permission, plan_review, question).  Inherited (``None``) values
    are never checked against capabilities.
    """
    driver = descriptor.type
    policy = policy if policy is not None else Policy()
    if not isinstance(policy, Policy):
        raise InvalidPolicyError(driver, "Policy", type(policy).__name__)
    approvals = policy.approvals if policy.approvals is not None else ApprovalPolicy()
    if not isinstance(approvals, ApprovalPolicy):
        raise InvalidPolicyError(driver, "Policy.Approvals", type(approvals).__name__)

    budget = policy.active_execution_timeout
    if budget is not None and (not _is_number(budget) or budget < 0):
        raise InvalidPolicyError(driver, "Policy.ActiveExecutionTimeout", _shown(budget))

    domains: list[tuple[str, Any, tuple[str, ...]]] = [
        ("Policy.Sandbox", policy.sandbox, SANDBOX_LEVELS),
        ("Policy.WebSearch", policy.web_search, FEATURE_LEVELS),
        ("Policy.Browser", policy.browser, FEATURE_LEVELS),
        ("Policy.Approvals.Permission", approvals.permission, APPROVAL_MODES),
        ("Policy.Approvals.PlanReview", approvals.plan_review, APPROVAL_MODES),
        ("Policy.Approvals.Question", approvals.question, QUESTION_MODES),
        ("Policy.Approvals.OnTimeout", approvals.on_timeout, FALLBACKS),
        ("Policy.Approvals.OnReject", approvals.on_reject, FALLBACKS),
    ]
    for name, value, allowed in domains:
        if value is not None and value not in allowed:
            raise InvalidPolicyError(driver, name, _shown(value))
        if name == "Policy.Approvals.Question":
            timeout = approvals.timeout
            if timeout is not None and not _is_number(timeout):
                raise InvalidPolicyError(driver, "Policy.Approvals.Timeout", _shown(timeout))

    retries = approvals.max_retries
    if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool) or retries < 0):
        raise InvalidPolicyError(driver, "Policy.Approvals.MaxRetries", _shown(retries))

    caps = descriptor.run_policy_caps
    for dimension, value, supported in (
        ("sandbox", policy.sandbox, caps.isolation),
        ("web_search", policy.web_search, caps.web_search),
        ("browser", policy.browser, caps.browser),
    ):
        if value is not None and not supported:
            raise PolicyCapabilityUnsupportedError(driver, dimension, value)

    for kind, mode in (
        ("permission", approvals.permission),
        ("plan_review", approvals.plan_review),
        ("question", approvals.question),
    ):
        if mode is not None and not getattr(getattr(caps, kind), mode):
            raise HumanDecisionModeUnsupportedError(driver, kind, mode)

    timeout = approvals.timeout
    effective_timeout: float | None
    if timeout is None or timeout == 0:
        effective_timeout = DEFAULT_APPROVAL_TIMEOUT
    elif timeout < 0 or timeout >= _NO_DEADLINE_BEYOND:
        effective_timeout = None  # (a deadline past year 9999 cannot even be written down)
    else:
        effective_timeout = float(timeout)
    return EffectiveApprovals(
        permission=approvals.permission or "ask",
        plan_review=approvals.plan_review or "ask",
        question=approvals.question or "auto_reject",
        timeout=effective_timeout,
        on_timeout=approvals.on_timeout or "abort",
        on_reject=approvals.on_reject or "abort",
        max_retries=DEFAULT_MAX_RETRIES if retries is None else retries,
    )


def _shown(value: Any) -> Any:
    """A policy value as it may appear in an error's wire fields (a JSON scalar)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)[:100]


def explicit_ask_kinds(policy: Policy | None) -> frozenset[str]:
    if policy is None or policy.approvals is None:
        return frozenset()
    a = policy.approvals
    modes = {"permission": a.permission, "plan_review": a.plan_review, "question": a.question}
    return frozenset(kind for kind, mode in modes.items() if mode == "ask")
