"""The Driver SPI: what a driver implements and the types it exchanges with the SDK."""

from __future__ import annotations

from adaptor.driver._errors import (
    HumanDecisionModeUnsupportedError,
    InvalidDriverConfigError,
    InvalidOutputSchemaError,
    InvalidPolicyError,
    PolicyCapabilityUnsupportedError,
    SessionConfigFingerprintError,
    StructuredOutputUnsupportedError,
)

__all__ = [
    "HumanDecisionModeUnsupportedError",
    "InvalidDriverConfigError",
    "InvalidOutputSchemaError",
    "InvalidPolicyError",
    "PolicyCapabilityUnsupportedError",
    "SessionConfigFingerprintError",
    "StructuredOutputUnsupportedError",
]
