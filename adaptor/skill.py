"""Skills: reusable instructions staged for the agent CLI before it starts.

::

    from adaptor import skill

    agent = adaptor.Agent(
        driver,
        skills=[skill.dir("/srv/skills/lint"), skill.key("release-notes")],
        skill_provider=skill.Set({"release-notes": skill.archive("release-notes", blob)}),
    )
    agent.run("...", skills=[skill.require(skill.inline("style", STYLE_MD), "house style")])

Sources: :func:`dir` (key = the directory's name), :func:`inline` (the text of ``SKILL.md``),
:func:`archive` (a zip, tar or compressed tar file or ``bytes``; ``subpath`` selects a
directory inside it), and :func:`key` (a reference resolved by the Agent's ``skill_provider``).
:func:`require` marks a skill or reference as required, with a reason the driver may show.

Resolution, per run, before anything starts (no events on a refusal):

1. the Agent's ``skills`` followed by the call's (call-site skills are appended) are read in
   order: an empty key is :class:`SkillKeyMissingError`, a skill without a source
   :class:`SkillSourceMissingError`; two skills under one key must be structurally equal (key,
   required, trimmed reason, metadata and source: the same absolute directory, inline text or
   archive) or the run fails with :class:`SkillKeyConflictError`;
2. the provider, if any, is asked once, with every referenced key (possibly none); what it
   returns joins the selection under the same conflict rule, so it may add mandatory skills;
3. a referenced key found nowhere is :class:`SkillNotFoundError`.

The selection is sorted by key.  Then, after the run is admitted, every selected skill is
copied into a private per-run directory (``0700``) that is removed after the run, under its
*runtime name*: ``metadata["runtime_name"]`` if set, else the last ``/``-separated segment of
the lowercased key reduced to ``[a-z0-9-]``, followed by ``-`` and 10 hex digits of the key's
hash whenever that differs from the key.  Staging refuses symlinks, devices and paths that
escape the skill directory, stops at 10,000 entries, 64 MiB per file and 256 MiB in total,
and requires a ``SKILL.md`` at the top.  A tar archive is unpacked no further than 256 MiB
plus 8 KiB of headers per entry, the members ``subpath`` leaves out included, so a small
compressed archive cannot make staging read or hold more; any failure is
:class:`SkillMaterializationError`
(joining its cause).  Drivers receive ``Request.skills``
(:class:`adaptor.driver.ResolvedSkill`), each with a content fingerprint that threads pin.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Final, Protocol, TypeAlias, overload, runtime_checkable

from adaptor.driver import canonical_fingerprint
from adaptor.driver._spi import ResolvedSkill
from adaptor.errors import AdaptorError

__all__ = [
    "DEFAULT_LIMITS",
    "METADATA_DISPLAY_NAME",
    "METADATA_RUNTIME_NAME",
    "ArchiveSource",
    "Catalogue",
    "DirSource",
    "Directories",
    "InlineSource",
    "Limits",
    "Provider",
    "Ref",
    "Set",
    "Skill",
    "SkillKeyConflictError",
    "SkillKeyMissingError",
    "SkillMaterializationError",
    "SkillNotFoundError",
    "SkillSourceMissingError",
    "archive",
    "dir",
    "fingerprint",
    "from_json",
    "inline",
    "key",
    "materialize",
    "require",
    "resolve",
    "runtime_name",
]

METADATA_RUNTIME_NAME: Final = "runtime_name"
METADATA_DISPLAY_NAME: Final = "display_name"
SKILL_FILE: Final = "SKILL.md"

_RUNTIME_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?")
_HASH_SUFFIX = 10
_CHUNK = 1 << 20
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# What opening a folder that was there a moment ago says once it is a link (O_NOFOLLOW),
# a file (O_DIRECTORY) or gone.
_REPLACED = frozenset({errno.ELOOP, errno.ENOTDIR, errno.ENOENT})
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")

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
        message = f"could not stage skill {key!r} as {runtime_name!r}"
        # Why, said in the message itself: a program or log that shows only str(error) (the
        # CLI's one line, a verdict's message) would otherwise never say what failed.
        why = str(cause) if cause is not None else ""
        super().__init__(f"{message}: {why}" if why else message, cause=cause)


class SkillSourceMissingError(_SkillError):
    code = "ErrSkillSourceMissing"
    default_message = "skill has no source"


class SkillKeyMissingError(_SkillError):
    code = "ErrSkillKeyMissing"
    default_message = "skill has an empty key"


# --- declarations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DirSource:
    """A directory on this machine (absolute, normalized when declared)."""

    path: str


@dataclass(frozen=True, repr=False)
class InlineSource:
    """The text of ``SKILL.md``; a skill made only of instructions."""

    skill_md: str

    def __repr__(self) -> str:
        return f"InlineSource({_describe(self)})"


@dataclass(frozen=True, repr=False)
class ArchiveSource:
    """A zip/tar/tgz archive: a file (``path``) or its bytes (``data``)."""

    path: str = ""
    data: bytes = b""
    subpath: str = ""

    def __repr__(self) -> str:
        return f"ArchiveSource({_describe(self)}, subpath={self.subpath!r})"


Source: TypeAlias = DirSource | InlineSource | ArchiveSource


@dataclass(frozen=True)
class Skill:
    """A concrete skill: a key and where its files come from."""

    key: str
    source: Source | None
    required: bool = False
    reason: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ref:
    """A catalogue reference (:func:`key`), resolved by the Agent's ``skill_provider``."""

    key: str
    required: bool = False
    reason: str = ""


def dir(path: str | os.PathLike[str], *, metadata: Mapping[str, str] | None = None) -> Skill:
    """The skill in directory ``path``; its key is the directory's name.

    An empty ``path`` is no source, and names no key (:class:`SkillKeyMissingError` when a
    run resolves it, the key being checked first), not the current directory:
    ``skill.dir(os.environ.get("SKILL_DIR", ""))`` must not stage whatever folder the
    program runs in.
    """
    if os.fspath(path) == "":
        return Skill("", None, metadata=dict(metadata or {}))
    absolute = os.path.abspath(os.fspath(path))
    return Skill(os.path.basename(absolute), DirSource(absolute), metadata=dict(metadata or {}))


def inline(key: str, skill_md: str, *, metadata: Mapping[str, str] | None = None) -> Skill:
    """A skill whose only file is ``SKILL.md`` with the text ``skill_md``."""
    if not isinstance(skill_md, str):
        # Found only when a run wrote the file, as a SkillMaterializationError.
        raise TypeError(f"skill.inline: skill_md takes the text of SKILL.md (a str), not a {type(skill_md).__name__}")
    return Skill(key, InlineSource(skill_md), metadata=dict(metadata or {}))


def archive(
    key: str,
    path_or_bytes: str | os.PathLike[str] | bytes,
    *,
    subpath: str = "",
    metadata: Mapping[str, str] | None = None,
) -> Skill:
    """A skill packed in a zip, tar, tar.gz, tar.bz2 or tar.xz archive (detected from content).

    ``subpath`` names the directory inside the archive that holds ``SKILL.md``.
    """
    source: ArchiveSource | None
    if isinstance(path_or_bytes, bytes | bytearray | memoryview):
        source = ArchiveSource(data=bytes(path_or_bytes), subpath=subpath)
    elif os.fspath(path_or_bytes) == "":  # no source (as skill.dir("")), not the current directory
        source = None
    else:
        source = ArchiveSource(path=os.path.abspath(os.fspath(path_or_bytes)), subpath=subpath)
    return Skill(key, source, metadata=dict(metadata or {}))


def key(name: str) -> Ref:
    """A reference to the skill ``name`` in the Agent's ``skill_provider``."""
    return Ref(name)


@overload
def require(skill: Skill, reason: str) -> Skill: ...
@overload
def require(skill: Ref, reason: str) -> Ref: ...
def require(skill: Skill | Ref, reason: str) -> Skill | Ref:
    """``skill`` marked as required, with the reason the driver may show."""
    if not isinstance(skill, Skill | Ref):
        raise TypeError(f"require() takes a skill or skill.key(...), not {type(skill).__name__}")
    return replace(skill, required=True, reason=reason)


def from_json(obj: object) -> Skill | Ref:
    """A skill from its JSON form: ``{"dir": path}``, ``{"inline": text, "key": k}``,
    ``{"archive": path, "key": k, "subpath"?: p}`` or ``{"key": k}`` (a reference), each with
    optional ``required``, ``reason`` and ``metadata``.

    Raises ``ValueError``/``TypeError`` for any other shape.
    """
    if isinstance(obj, Skill | Ref):
        return obj
    if not isinstance(obj, Mapping):
        raise TypeError(
            f"a skill is a skill.dir/inline/archive/key value, not {type(obj).__name__}"
        )
    known = {"key", "dir", "inline", "archive", "subpath", "required", "reason", "metadata"}
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        raise ValueError(f"unknown skill field(s): {', '.join(unknown)}")
    sources = [name for name in ("dir", "inline", "archive") if name in obj]
    if len(sources) > 1:
        raise ValueError(f"a skill has one source, got {', '.join(sources)}")
    name = obj.get("key", "")
    required = obj.get("required", False)
    reason = obj.get("reason", "")
    metadata = obj.get("metadata") or {}
    if not isinstance(required, bool) or not isinstance(reason, str):
        raise TypeError("skill required must be a boolean and reason a string")
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise TypeError("skill metadata must map strings to strings")
    if not isinstance(name, str):
        raise TypeError("skill key must be a string")
    made: Skill | Ref
    if not sources:
        made = Ref(name)
    elif sources == ["dir"]:
        made = dir(_text(obj["dir"], "dir"), metadata=metadata)
        if name:
            made = replace(made, key=name)
    elif sources == ["inline"]:
        made = inline(name, _text(obj["inline"], "inline"), metadata=metadata)
    else:
        subpath = _text(obj.get("subpath", ""), "subpath")
        made = archive(name, _text(obj["archive"], "archive"), subpath=subpath, metadata=metadata)
    return replace(made, required=required, reason=reason) if required or reason else made


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"skill {name} must be a string")
    return value


# --- providers ---------------------------------------------------------------------------------


@runtime_checkable
class Provider(Protocol):
    """Resolves catalogue references; called once per run with every referenced key."""

    def get_skills(self, keys: Sequence[str]) -> Mapping[str, Skill]:
        """The skills for ``keys`` that exist, plus any the provider makes mandatory."""
        ...


@runtime_checkable
class Catalogue(Provider, Protocol):
    def catalogue(self) -> Sequence[Skill]:
        """Every skill on offer, sorted by key (for listing; nothing is auto-selected)."""
        ...


class Set:
    """A fixed catalogue: ``skill.Set({"lint": skill.dir(...), ...})`` or ``Set([skills])``.

    The mapping's keys win over the skills' own keys.  :meth:`get_skills` returns the requested
    keys that exist plus every required entry.
    """

    def __init__(self, skills: Mapping[str, Skill] | Iterable[Skill]) -> None:
        entries = skills.items() if isinstance(skills, Mapping) else ((s.key, s) for s in skills)
        self._skills: dict[str, Skill] = {}
        for name, item in entries:
            if not isinstance(item, Skill):
                raise TypeError(f"skill.Set entries are skills, not {type(item).__name__}")
            self._skills[name] = item if item.key == name else replace(item, key=name)

    def get_skills(self, keys: Sequence[str]) -> Mapping[str, Skill]:
        wanted = set(keys)
        return {k: s for k, s in self._skills.items() if k in wanted or s.required}

    def catalogue(self) -> Sequence[Skill]:
        return [self._skills[k] for k in sorted(self._skills)]

    def __repr__(self) -> str:
        return f"skill.Set({sorted(self._skills)!r})"


class Directories:
    """A catalogue of skill folders: ``skill.Directories(["/srv/skills", ...])``.

    Each subdirectory of a catalogue directory is the skill :func:`dir` makes of it, under its
    own name (hidden ones, starting with ".", are left out); a key found in several directories
    comes from the first (as ``PATH`` does).  The directories are looked at on every call, so
    skills added or removed take effect at the next run.  A key is looked up only as a plain
    directory name (no ``/``, not starting with ``.``), so a reference cannot reach outside the
    catalogue; a missing directory offers nothing.
    """

    def __init__(self, directories: Iterable[str | os.PathLike[str]]) -> None:
        if isinstance(directories, str | bytes | os.PathLike):
            # A str is an iterable of str: it was taken letter by letter ("must be absolute:
            # w, o, r, k, ...").
            raise TypeError("Directories takes a list of directories, not one path: Directories([path])")
        self._directories = tuple(os.fspath(d) for d in directories)
        relative = [d for d in self._directories if not os.path.isabs(d)]
        if relative:
            raise ValueError(f"skill catalogue directories must be absolute: {', '.join(relative)}")

    @property
    def directories(self) -> tuple[str, ...]:
        return self._directories

    def get_skills(self, keys: Sequence[str]) -> Mapping[str, Skill]:
        found: dict[str, Skill] = {}
        for name in keys:
            if name in found or not _plain_name(name):
                continue
            for directory in self._directories:
                candidate = os.path.join(directory, name)
                if os.path.isdir(candidate):
                    found[name] = dir(candidate)
                    break
        return found

    def catalogue(self) -> Sequence[Skill]:
        offered: dict[str, Skill] = {}
        for directory in self._directories:
            try:
                entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
            except OSError:  # missing, not a directory, unreadable: offers nothing
                continue
            for entry in entries:
                if entry.name not in offered and _plain_name(entry.name) and entry.is_dir():
                    offered[entry.name] = dir(entry.path)
        return [offered[k] for k in sorted(offered)]

    def __repr__(self) -> str:
        return f"skill.Directories({list(self._directories)!r})"


def _plain_name(name: str) -> bool:
    # A hidden folder (".git", ".cache" of a catalogue kept in version control) is no skill.
    return bool(name) and not name.startswith(".") and "/" not in name and "\\" not in name and "\0" not in name


# --- resolution --------------------------------------------------------------------------------


def resolve(selected: Iterable[object], provider: Provider | None) -> tuple[Skill, ...]:
    """The run's skills, sorted by key, or the first problem (see the module docstring)."""
    chosen: dict[str, Skill] = {}
    refs: dict[str, Ref] = {}
    for item in selected:
        made = from_json(item)
        name = made.key.strip() if isinstance(made.key, str) else ""
        if not name:
            raise SkillKeyMissingError("a skill has an empty key")
        if isinstance(made, Ref):
            earlier = refs.get(name)
            if earlier is None or (made.required and not earlier.required):
                refs[name] = replace(made, key=name)
            continue
        _merge(chosen, replace(made, key=name))
    if provider is not None:
        try:
            found = provider.get_skills(sorted(refs))
        except Exception as exc:
            exc.add_note(f"raised by the Agent's skill_provider {provider!r}.get_skills()")
            raise
        if not isinstance(found, Mapping):
            raise TypeError("skill_provider.get_skills() must return a mapping of key to skill")
        for name, item in found.items():
            if not isinstance(item, Skill):
                raise TypeError(
                    f"skill_provider.get_skills() returned a {type(item).__name__} for {name!r}"
                )
            clean = name.strip() if isinstance(name, str) else ""
            if not clean:
                raise SkillKeyMissingError("the skill provider returned a skill with an empty key")
            _merge(chosen, replace(item, key=clean))
    for name in sorted(refs):
        found_skill = chosen.get(name)
        if found_skill is None:
            raise SkillNotFoundError(f"skill {name!r} is not in the catalogue")
        ref = refs[name]
        if ref.required and not found_skill.required:
            chosen[name] = replace(found_skill, required=True, reason=ref.reason.strip())
    return tuple(chosen[name] for name in sorted(chosen))


def _merge(chosen: dict[str, Skill], skill: Skill) -> None:
    if skill.source is None:
        raise SkillSourceMissingError(f"skill {skill.key!r} has no source")
    if not isinstance(skill.source, DirSource | InlineSource | ArchiveSource):
        raise SkillSourceMissingError(
            f"skill {skill.key!r} has a {type(skill.source).__name__} where a source belongs"
        )
    earlier = chosen.get(skill.key)
    if earlier is None:
        chosen[skill.key] = skill
        return
    detail = _difference(earlier, skill)
    if detail:
        raise SkillKeyConflictError(
            skill.key, [_describe(earlier.source), _describe(skill.source)], detail
        )


def _difference(a: Skill, b: Skill) -> str:
    if a.source != b.source:
        return "different sources"
    if a.required != b.required:
        return "one is required and the other is not"
    if a.reason.strip() != b.reason.strip():
        return "different reasons"
    if dict(a.metadata) != dict(b.metadata):
        return "different metadata"
    return ""


def _describe(source: Source | None) -> str:
    """A source as it may appear in errors: paths, or a hash for content (never the content)."""
    if isinstance(source, DirSource):
        return "dir:" + source.path
    if isinstance(source, InlineSource):
        return "inline:" + _short_hash(source.skill_md.encode("utf-8", "surrogatepass"))
    if isinstance(source, ArchiveSource):
        return "archive:" + (source.path or _short_hash(source.data))
    return "none"


def _short_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


# --- materialization ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Staging limits.  The defaults are the contract; tests lower them."""

    max_total_bytes: int = 256 * 1024 * 1024
    max_file_bytes: int = 64 * 1024 * 1024
    max_entries: int = 10_000


DEFAULT_LIMITS: Final = Limits()


def runtime_name(skill: Skill) -> str:
    """The directory name the CLI sees for ``skill`` (see the module docstring)."""
    override = skill.metadata.get(METADATA_RUNTIME_NAME)
    if override:
        return override
    base = skill.key.lower().rsplit("/", 1)[-1]
    clean = re.sub(r"[^a-z0-9-]+", "-", base).strip("-") or "skill"
    if clean == skill.key and _RUNTIME_NAME.fullmatch(clean):
        return clean
    digest = hashlib.sha256(skill.key.encode("utf-8", "surrogatepass")).hexdigest()
    return clean[: 63 - _HASH_SUFFIX].rstrip("-") + "-" + digest[:_HASH_SUFFIX]


def materialize(
    skills: Iterable[Skill], root: str | os.PathLike[str], *, _limits: Limits = DEFAULT_LIMITS
) -> tuple[ResolvedSkill, ...]:
    """Stage every skill under ``root/<runtime name>``; ``root`` is created ``0700`` if missing.

    A failure removes what that skill had staged and raises :class:`SkillMaterializationError`.
    """
    base = Path(root)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    staged: list[ResolvedSkill] = []
    for skill in skills:
        name = runtime_name(skill)
        target = base / name
        try:
            if not _RUNTIME_NAME.fullmatch(name):
                raise ValueError(
                    "a runtime name is 1-64 lowercase letters, digits or '-', "
                    "starting and ending with a letter or digit"
                )
            # mkdir fails on an existing name: two skills with one runtime name.
            target.mkdir(mode=0o700)
        except (OSError, ValueError) as exc:
            raise SkillMaterializationError(skill.key, name, exc) from exc
        try:
            stager = _Stager(target, _limits)
            _stage(skill, stager)
            if not (target / SKILL_FILE).is_file():
                raise FileNotFoundError(f"the skill has no {SKILL_FILE} at its top level")
        except Exception as exc:
            shutil.rmtree(target, ignore_errors=True)
            raise SkillMaterializationError(skill.key, name, exc) from exc
        staged.append(
            ResolvedSkill(
                key=skill.key,
                runtime_name=name,
                path=str(target.absolute()),
                required=skill.required,
                reason=skill.reason.strip(),
                metadata=dict(skill.metadata),
                fingerprint=stager.fingerprint(skill, name),
            )
        )
    return tuple(staged)


def fingerprint(resolved: Iterable[ResolvedSkill]) -> str:
    """A stable hash of a staged selection (each skill's content fingerprint, in key order)."""
    view = [[r.key, r.fingerprint] for r in sorted(resolved, key=lambda r: r.key)]
    return canonical_fingerprint("adaptor/skills/v1", view, root="Skills")


class _Stager:
    """Writes one skill's files under ``target``, enforcing the limits as bytes arrive.

    Sizes an archive declares are checked early but never trusted: the counts are of bytes
    actually written, so a lying header cannot get past them.
    """

    def __init__(self, target: Path, limits: Limits) -> None:
        self.target = target
        self.limits = limits
        self.entries = 0
        self.total = 0
        self.files: dict[str, tuple[bool, str]] = {}
        self.dirs: set[str] = set()

    def count(self) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise ValueError(f"more than {self.limits.max_entries} entries")

    def directory(self, parts: tuple[str, ...]) -> None:
        path = self.target
        for index, part in enumerate(parts):
            path = path / part
            rel = "/".join(parts[: index + 1])
            if rel in self.dirs:
                continue
            if rel in self.files:
                raise ValueError(f"{rel!r} is both a file and a directory")
            path.mkdir(mode=0o700)
            self.dirs.add(rel)

    def file(self, parts: tuple[str, ...], reader: IO[bytes], executable: bool) -> None:
        rel = "/".join(parts)
        if rel in self.files or rel in self.dirs:
            raise ValueError(f"{rel!r} appears twice")
        if len(parts) > 1:
            self.directory(parts[:-1])
        mode = 0o700 if executable else 0o600
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
        fd = os.open(self.target.joinpath(*parts), flags, mode)
        digest = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as out:
            while chunk := reader.read(_CHUNK):
                size += len(chunk)
                self.total += len(chunk)
                if size > self.limits.max_file_bytes:
                    raise ValueError(f"{rel!r} is larger than {self.limits.max_file_bytes} bytes")
                if self.total > self.limits.max_total_bytes:
                    raise ValueError(
                        f"the skill is larger than {self.limits.max_total_bytes} bytes"
                    )
                digest.update(chunk)
                out.write(chunk)
        self.files[rel] = (executable, digest.hexdigest())

    def declared_size(self, parts: tuple[str, ...], size: int) -> None:
        if size > self.limits.max_file_bytes:
            raise ValueError(
                f"{'/'.join(parts)!r} is larger than {self.limits.max_file_bytes} bytes"
            )

    def fingerprint(self, skill: Skill, name: str) -> str:
        return canonical_fingerprint(
            "adaptor/skill/v1",
            {
                "key": skill.key,
                "runtime_name": name,
                "required": skill.required,
                "reason": skill.reason.strip(),
                "metadata": dict(skill.metadata),
                "dirs": sorted(self.dirs),
                "files": [[p, *self.files[p]] for p in sorted(self.files)],
            },
            root="Skill",
        )


def _stage(skill: Skill, stager: _Stager) -> None:
    source = skill.source
    if isinstance(source, InlineSource):
        import io

        stager.count()
        stager.file((SKILL_FILE,), io.BytesIO(source.skill_md.encode("utf-8")), False)
    elif isinstance(source, DirSource):
        _stage_dir(Path(source.path), stager)
    elif isinstance(source, ArchiveSource):
        _stage_archive(source, stager)
    else:  # resolve() lets no other source through
        raise SkillSourceMissingError(f"skill {skill.key!r} has no source")


def _stage_dir(root: Path, stager: _Stager) -> None:
    # Every folder below the root is opened relative to its parent's descriptor and never
    # through a symbolic link, so one swapped for a link while the copy runs (after its entry
    # was checked) is refused instead of followed out of the skill.  The root itself is what
    # the caller named, link or not.
    try:
        root_fd = os.open(root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    except (NotADirectoryError, FileNotFoundError):
        raise NotADirectoryError(f"{root} is not a directory") from None
    try:
        pending: list[tuple[str, ...]] = [()]
        while pending:
            prefix = pending.pop()
            directory = _open_below(root_fd, prefix)
            try:
                with os.scandir(directory) as listing:
                    entries = sorted(listing, key=lambda e: e.name)
                for entry in entries:
                    stager.count()
                    parts = (*prefix, entry.name)
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode):
                        stager.directory(parts)
                        pending.append(parts)
                    elif stat.S_ISREG(info.st_mode):
                        stager.declared_size(parts, info.st_size)
                        fd = _open_file(entry.name, _O_NOFOLLOW, dir_fd=directory, shown=parts)
                        with os.fdopen(fd, "rb") as reader:
                            stager.file(parts, reader, bool(info.st_mode & 0o111))
                    else:
                        raise ValueError(
                            f"{'/'.join(parts)!r} is a {_kind(info.st_mode)}, not a file"
                        )
            finally:
                os.close(directory)
    finally:
        os.close(root_fd)


def _open_below(root_fd: int, parts: tuple[str, ...]) -> int:
    """A descriptor of the folder ``parts`` below ``root_fd``, no component a symbolic link.

    Walked one component at a time from the root: only two descriptors are open at once,
    however deep the tree.
    """
    fd = os.dup(root_fd)
    for depth, name in enumerate(parts):
        try:
            child = os.open(name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno not in _REPLACED:
                raise
            raise _replaced(parts[: depth + 1]) from exc
        finally:
            os.close(fd)
        fd = child
    return fd


def _replaced(parts: tuple[str, ...]) -> ValueError:
    """The error for an entry checked a moment ago whose opening failed with one of
    :data:`_REPLACED`: it was replaced while the skill was copied."""
    return ValueError(f"{'/'.join(parts)!r} was replaced while the skill was copied")


def _open_file(
    path: str, flags: int = 0, *, dir_fd: int | None = None, shown: tuple[str, ...] = ()
) -> int:
    """A descriptor to read the regular file at ``path``; anything else raises ``ValueError``.

    Opened non-blocking, then checked: opening a FIFO for reading waits for a writer, so a
    skill naming one would hold its run (and a daemon worker) forever, beyond any cancel.
    ``shown``: the name to give in that error (a path relative to ``dir_fd``, else ``path``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | _O_NONBLOCK | _O_CLOEXEC | flags, dir_fd=dir_fd)
    except OSError as exc:
        if not shown or exc.errno not in _REPLACED:
            raise
        raise _replaced(shown) from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            name = repr("/".join(shown)) if shown else path
            raise ValueError(f"{name} is a {_kind(mode)}, not a file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _stage_archive(source: ArchiveSource, stager: _Stager) -> None:
    import io

    reader: IO[bytes]
    reader = (
        io.BytesIO(source.data) if not source.path else os.fdopen(_open_file(source.path), "rb")
    )
    with reader:
        head = reader.read(4)
        reader.seek(0)
        prefix = _member_parts(source.subpath, allow_empty=True) if source.subpath else ()
        members = (
            _zip_members(reader, stager) if head in _ZIP_MAGIC else _tar_members(reader, stager)
        )
        for parts, kind, size, opener, executable in members:
            if parts[: len(prefix)] != prefix:
                continue
            inner = parts[len(prefix) :]
            if not inner:
                continue
            if kind == "dir":
                stager.directory(inner)
                continue
            stager.declared_size(inner, size)
            with opener() as data:
                stager.file(inner, data, executable)


_Member: TypeAlias = tuple[tuple[str, ...], str, int, Any, bool]


def _zip_members(reader: IO[bytes], stager: _Stager) -> Iterator[_Member]:
    import zipfile

    with zipfile.ZipFile(reader) as archive_file:
        infos = archive_file.infolist()
        if len(infos) > stager.limits.max_entries:
            raise ValueError(f"more than {stager.limits.max_entries} entries")
        for info in infos:
            stager.count()
            parts = _member_parts(info.filename, allow_empty=info.is_dir())
            mode = info.external_attr >> 16
            # No file type bits: written without Unix attributes, a plain entry.
            if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ValueError(f"{info.filename!r} is a {_kind(mode)}, not a file")
            if info.is_dir():
                yield parts, "dir", 0, None, False
            else:
                yield (
                    parts,
                    "file",
                    info.file_size,
                    lambda info=info: archive_file.open(info),
                    bool(mode & 0o111),
                )


def _tar_members(reader: IO[bytes], stager: _Stager) -> Iterator[_Member]:
    import tarfile

    limits = stager.limits
    stream = _Unpacked(
        _decompressed(reader), limits.max_total_bytes + limits.max_entries * _TAR_ENTRY_OVERHEAD
    )
    try:
        # (typeshed wants a writable file; in mode "r:" tarfile only reads, seeks and tells)
        archive_file = tarfile.open(fileobj=stream, mode="r:")  # type: ignore[call-overload]
    except tarfile.ReadError as exc:
        raise ValueError("not a zip or tar archive") from exc
    with archive_file:
        for member in archive_file:  # lazily: the entry limit stops a huge listing early
            stager.count()
            parts = _member_parts(member.name, allow_empty=member.isdir())
            if member.isdir():
                yield parts, "dir", 0, None, False
            elif member.isreg():
                yield (
                    parts,
                    "file",
                    member.size,
                    lambda member=member: _extracted(archive_file, member),
                    bool(member.mode & 0o111),
                )
            else:
                kind = "link" if member.issym() or member.islnk() else "special file"
                raise ValueError(f"{member.name!r} is a {kind}, not a file")


# What a tar archive may take besides its members' bytes, per entry: a header block, a pax or
# GNU long-name record and its header, padding.
_TAR_ENTRY_OVERHEAD: Final = 8192


class _Stream(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...
    def tell(self) -> int: ...


def _decompressed(reader: IO[bytes]) -> _Stream:
    """The tar stream in ``reader``, decompressed when it starts as gzip, bzip2 or xz data."""
    import bz2
    import gzip
    import lzma

    head = reader.read(6)
    reader.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=reader, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(reader)
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(reader)
    return reader


class _Unpacked:
    """A tar stream that is never read or skipped beyond ``limit`` bytes.

    tarfile reads a pax or GNU long-name record into memory whole, at whatever size its header
    declares, and skipping a member of a compressed archive decompresses it: without a bound
    a few kilobytes of gzip could make staging hold or unpack gigabytes before any limit on
    the skill's own files is checked.
    """

    def __init__(self, inner: _Stream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    def read(self, size: int = -1) -> bytes:
        room = self._limit - self._inner.tell()
        if 0 <= size <= room:
            return self._inner.read(size)
        data = self._inner.read(max(room, 0) + 1)
        if len(data) > room:
            self._refuse()
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = offset if whence == os.SEEK_SET else offset + self._inner.tell()
        if whence not in (os.SEEK_SET, os.SEEK_CUR):
            raise OSError("a skill archive is read forwards")
        if target > self._limit:
            self._refuse()
        return self._inner.seek(target)

    def tell(self) -> int:
        return self._inner.tell()

    def _refuse(self) -> None:
        raise ValueError(f"the archive unpacks to more than {self._limit} bytes")


def _extracted(archive_file: Any, member: Any) -> IO[bytes]:
    data: IO[bytes] | None = archive_file.extractfile(member)
    if data is None:
        raise ValueError(f"{member.name!r} has no data")
    return data


def _member_parts(name: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    """The path components of an archive entry, refusing anything that could leave the skill."""
    if "\0" in name or "\\" in name:
        raise ValueError(f"unsafe archive path {name!r}")
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        raise ValueError(f"absolute archive path {name!r}")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ValueError(f"archive path {name!r} escapes the skill directory")
    if not parts and not allow_empty:
        raise ValueError(f"empty archive path {name!r}")
    return parts
