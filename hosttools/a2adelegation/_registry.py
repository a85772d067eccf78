"""Remote agent specs and the registry that names them."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptor import _options
from adaptor.clients.a2a import AgentCard, Auth, BearerTokenFromEnv, origin_of

_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class Policy:
    """Limits a host puts on delegations to one remote agent.

    ``max_timeout`` caps every request's timeout (seconds); ``require_streaming`` refuses agents
    that cannot stream and never falls back to polling; ``poll_interval`` and ``max_polls`` pace
    and bound polling; ``max_artifact_bytes`` bounds the artifact content accepted;
    ``allow_input_required`` returns an ``input_required`` result instead of failing.
    """

    max_timeout: float = 600.0
    require_streaming: bool = False
    poll_interval: float = 1.0
    max_polls: int = 600
    max_artifact_bytes: int = 8 << 20
    allow_input_required: bool = False

    def __post_init__(self) -> None:
        for name in ("max_timeout", "poll_interval"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Policy.{name} must be a positive number of seconds")
        for name in ("max_polls", "max_artifact_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Policy.{name} must be a positive integer")
        # Truthiness would read require_streaming = "no" (a config file's string) as yes.
        for name in ("require_streaming", "allow_input_required"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Policy.{name} must be true or false")


@dataclass(frozen=True)
class RemoteAgentSpec:
    """One remote A2A agent a host may delegate to.

    ``card_url`` is fetched on first use; ``card`` (ProtoJSON) is used as is.  ``auth`` goes
    only to the card URL's origin and ``trusted_origins`` (see ``adaptor.clients.a2a.Client``).
    """

    key: str
    card_url: str | None = None
    card: Mapping[str, Any] | None = None
    display_name: str = ""
    description: str = ""
    auth: Auth | None = field(default=None, compare=False)
    trusted_origins: tuple[str, ...] = ()
    policy: Policy = field(default_factory=Policy)

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not _KEY.fullmatch(self.key):
            raise ValueError("agent key must match [A-Za-z0-9_.-]{1,64}")
        if self.card_url is None and self.card is None:
            raise ValueError(f"agent {self.key!r} needs a card_url or a card")
        if self.card_url is not None:
            if not isinstance(self.card_url, str):
                raise ValueError("card_url must be a URL string")
            origin_of(self.card_url)
        if self.card is not None and not isinstance(self.card, Mapping | AgentCard):
            raise ValueError("card must be an agent card (a mapping or an a2a.AgentCard)")
        for name in ("display_name", "description"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string")
        if self.auth is not None and not _options.provides(self.auth, Auth):
            raise ValueError("auth must provide headers() (e.g. BearerTokenFromEnv)")
        # A lone string would otherwise be taken one character at a time.
        if isinstance(self.trusted_origins, str | bytes) or not all(
            isinstance(origin, str) for origin in self.trusted_origins
        ):
            raise ValueError("trusted_origins must be a list of origin URL strings")
        object.__setattr__(self, "trusted_origins", tuple(self.trusted_origins))
        for origin in self.trusted_origins:
            origin_of(origin)
        if not isinstance(self.policy, Policy):
            raise ValueError("policy must be a Policy")

    @property
    def name(self) -> str:
        return self.display_name or self.key

    @classmethod
    def from_mapping(cls, obj: Mapping[str, Any]) -> RemoteAgentSpec:
        """A spec from configuration data (e.g. a daemon config file):

        ``{"key", "card_url" | "card", "display_name", "description", "bearer_token_env",
        "trusted_origins": [...], "policy": {...Policy fields...}}``.  Unknown keys are refused
        so a typo never silently drops a limit.
        """
        allowed = {
            "key",
            "card_url",
            "card",
            "display_name",
            "description",
            "bearer_token_env",
            "trusted_origins",
            "policy",
        }
        unknown = set(obj) - allowed
        if unknown:
            raise ValueError(f"unknown agent spec keys: {sorted(unknown)}")
        policy_obj = obj.get("policy") or {}
        if not isinstance(policy_obj, Mapping):
            raise ValueError("policy must be a table of Policy fields")
        trusted = obj.get("trusted_origins", ())
        if not isinstance(trusted, list | tuple):
            raise ValueError("trusted_origins must be a list of origin URL strings")
        policy_fields = set(Policy.__dataclass_fields__)
        if set(policy_obj) - policy_fields:
            raise ValueError(f"unknown policy keys: {sorted(set(policy_obj) - policy_fields)}")
        token_env = obj.get("bearer_token_env")
        if token_env is not None and (not isinstance(token_env, str) or not token_env):
            # "" sent no token at all, without a word: name a variable or leave the key out.
            raise ValueError("bearer_token_env must name an environment variable (leave it out for no token)")
        return cls(
            key=obj["key"],
            card_url=obj.get("card_url"),
            card=obj.get("card"),
            display_name=obj.get("display_name", ""),
            description=obj.get("description", ""),
            auth=BearerTokenFromEnv(token_env) if token_env else None,
            trusted_origins=tuple(trusted),
            policy=Policy(**policy_obj),
        )


class Registry:
    """The remote agents a delegator may use, by key.  Thread-safe."""

    def __init__(self, specs: Iterable[RemoteAgentSpec] = ()) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, RemoteAgentSpec] = {}
        for spec in specs:
            self.add(spec)

    def add(self, spec: RemoteAgentSpec) -> None:
        if not isinstance(spec, RemoteAgentSpec):
            raise TypeError("Registry.add needs a RemoteAgentSpec")
        with self._lock:
            if spec.key in self._specs:
                raise ValueError(f"duplicate agent key {spec.key!r}")
            self._specs[spec.key] = spec

    def get(self, key: str) -> RemoteAgentSpec | None:
        with self._lock:
            return self._specs.get(key)

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._specs)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._specs

    def __iter__(self) -> Iterator[RemoteAgentSpec]:
        with self._lock:
            specs = [self._specs[key] for key in sorted(self._specs)]
        return iter(specs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._specs)
