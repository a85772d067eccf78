"""Skills: reusable instructions staged for the agent CLI before it starts."""

from __future__ import annotations

from adaptor.errors import AdaptorError

_Str = (str,)


class _SkillError(AdaptorError):
    exit_code = 3


class SkillNotFoundError(_SkillError):
    code = "ErrSkillNotFound"
    default_message = "skill not found"


class SkillKeyConflictError(_SkillError):
    """Structurally different skills use one key."""

    code = "ErrSkillKeyConflict"
    default_message = "skill key conflict"
    _fields = {"key": _Str, "sources": (list,), "detail": _Str}

    def __init__(self, key: str, sources: list[str], detail: str) -> None:
        self.key = key
        self.sources = list(sources)
        self.detail = detail
        super().__init__(f"skill key {key!r} is used by different skills: {detail}")


class SkillMaterializationError(_SkillError):
    """A resolved skill could not be staged; joins its cause."""

    code = "ErrSkillMaterializationFailed"
    default_message = "skill materialization failed"
    _fields = {"key": _Str, "runtime_name": _Str}

    def __init__(self, key: str, runtime_name: str, cause: BaseException | None = None) -> None:
        self.key = key
        self.runtime_name = runtime_name
        super().__init__(f"could not stage skill {key!r} as {runtime_name!r}", cause=cause)


class SkillSourceMissingError(_SkillError):
    code = "ErrSkillSourceMissing"
    default_message = "skill has no source"


class SkillKeyMissingError(_SkillError):
    code = "ErrSkillKeyMissing"
    default_message = "skill has an empty key"
