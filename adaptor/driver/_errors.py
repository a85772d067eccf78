"""Pre-invocation errors owned by the Driver SPI (re-exported by ``adaptor.driver``)."""

from __future__ import annotations

from typing import Any

from adaptor.errors import AdaptorError

_Str = (str,)
_Scalar = (str, int, float, bool, type(None))


class _ConfigurationError(AdaptorError):
    """Refused before the driver runs: nothing was started."""

    exit_code = 3


class InvalidOutputSchemaError(_ConfigurationError):
    """A schema cannot be derived, parsed, normalized or compiled; joins its cause."""

    code = "ErrInvalidOutputSchema"
    default_message = "invalid output schema"
    _fields = {"reason": _Str}

    def __init__(self, reason: str, cause: BaseException | None = None) -> None:
        self.reason = reason
        super().__init__(f"invalid output schema: {reason}", cause=cause)


class StructuredOutputUnsupportedError(_ConfigurationError):
    code = "ErrStructuredOutputUnsupported"
    default_message = "structured output is not supported"
    _fields = {"driver": _Str, "reason": _Str}

    def __init__(self, driver: str, reason: str) -> None:
        self.driver = driver
        self.reason = reason
        super().__init__(f"driver {driver!r} cannot honour structured output: {reason}")


class InvalidDriverConfigError(_ConfigurationError):
    """The driver's ``validate_config`` rejected the configuration; joins its cause."""

    code = "ErrInvalidDriverConfig"
    default_message = "invalid driver configuration"
    _fields = {"driver": _Str}

    def __init__(self, driver: str, cause: BaseException | None = None) -> None:
        self.driver = driver
        detail = f": {cause}" if cause is not None and str(cause) else ""
        super().__init__(f"invalid configuration for driver {driver!r}{detail}", cause=cause)


class InvalidPolicyError(_ConfigurationError):
    """A policy enum, action, duration or retry value is out of domain."""

    code = "ErrInvalidPolicy"
    default_message = "invalid policy"
    _fields = {"driver": _Str, "field": _Str, "value": _Scalar}

    def __init__(self, driver: str, field: str, value: Any) -> None:
        self.driver = driver
        self.field = field
        self.value = value
        super().__init__(f"invalid policy value for {field}: {value!r}")


class PolicyCapabilityUnsupportedError(_ConfigurationError):
    code = "ErrPolicyCapabilityUnsupported"
    default_message = "policy capability unsupported"
    _fields = {"driver": _Str, "dimension": _Str, "value": _Scalar}

    def __init__(self, driver: str, dimension: str, value: Any) -> None:
        self.driver = driver
        self.dimension = dimension
        self.value = value
        super().__init__(f"driver {driver!r} cannot honour {dimension}={value!r}")


class HumanDecisionModeUnsupportedError(_ConfigurationError):
    code = "ErrHumanDecisionModeUnsupported"
    default_message = "approval mode unsupported"
    _fields = {"driver": _Str, "kind": _Str, "mode": _Str}

    def __init__(self, driver: str, kind: str, mode: str) -> None:
        self.driver = driver
        self.kind = kind
        self.mode = mode
        super().__init__(f"driver {driver!r} does not support {mode!r} for {kind} approvals")


class SessionConfigFingerprintError(AdaptorError):
    """A driver config value cannot be canonicalized for a session fingerprint.

    Fields name the Python shape only (``path`` is made of positions and field names, never
    dict keys), so no configuration value can leak through this error.
    """

    code = "SessionConfigFingerprintError"
    default_message = "driver config cannot be fingerprinted"
    _fields = {"path": _Str, "type": _Str, "kind": _Str, "why": _Str}

    def __init__(self, path: str, type: str, kind: str, why: str) -> None:
        self.path = path
        self.type = type
        self.kind = kind
        self.why = why
        super().__init__(f"cannot fingerprint driver config at {path} ({type}, {kind}): {why}")
