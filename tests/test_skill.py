"""adaptor.skill: sources, resolution with one provider call, conflicts, staging and limits."""

from __future__ import annotations

import io
import os
import stat
import tarfile
import threading
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptor import errors, skill

SKILL_MD = "---\nname: lint\ndescription: lint things\n---\nRun the linter.\n"


def make_dir(root: Path, name: str = "lint", files: Mapping[str, str] | None = None) -> Path:
    base = root / name
    for rel, text in (files or {"SKILL.md": SKILL_MD, "scripts/run.sh": "#!/bin/sh\n"}).items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return base


def zip_bytes(entries: Mapping[str, bytes], *, modes: Mapping[str, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name)
            if modes and name in modes:
                info.external_attr = modes[name] << 16
            z.writestr(info, data)
    return buffer.getvalue()


def tar_bytes(members: Sequence[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as t:  # type: ignore[call-overload]
        for info, data in members:
            if data is not None:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
            else:
                t.addfile(info)
    return buffer.getvalue()


def reg(name: str, mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    return info


class CountingProvider:
    def __init__(self, skills: Mapping[str, skill.Skill]) -> None:
        self.inner = skill.Set(skills)
        self.calls: list[list[str]] = []

    def get_skills(self, keys: Sequence[str]) -> Mapping[str, skill.Skill]:
        self.calls.append(list(keys))
        return self.inner.get_skills(keys)


# --- declarations --------------------------------------------------------------------------


def test_constructors(tmp_path: Path) -> None:
    d = skill.dir(tmp_path / "lint")
    assert d.key == "lint" and d.source == skill.DirSource(str(tmp_path / "lint"))
    i = skill.inline("style", SKILL_MD)
    assert i.source == skill.InlineSource(SKILL_MD)
    assert SKILL_MD not in repr(i)  # content stays out of reprs and errors
    a = skill.archive("pack", b"PK..", subpath="x")
    assert a.source == skill.ArchiveSource(data=b"PK..", subpath="x")
    assert "PK.." not in repr(a)
    r = skill.require(skill.key("notes"), "tenant policy")
    assert r == skill.Ref("notes", required=True, reason="tenant policy")
    assert skill.require(i, "why").required
    # Not text: it failed only when a run wrote SKILL.md (AttributeError: no 'encode').
    with pytest.raises(TypeError, match="skill_md takes the text of SKILL.md"):
        skill.inline("style", 5)  # type: ignore[arg-type]


def test_from_json() -> None:
    assert skill.from_json({"key": "a"}) == skill.Ref("a")
    assert skill.from_json(
        {"inline": "x", "key": "a", "required": True, "reason": "r"}
    ) == skill.Skill("a", skill.InlineSource("x"), required=True, reason="r")
    assert skill.from_json({"dir": "/srv/s/lint"}).key == "lint"
    assert skill.from_json({"dir": "/srv/s/lint", "key": "x"}).key == "x"
    with pytest.raises(ValueError):
        skill.from_json({"key": "a", "inline": "x", "dir": "/d"})
    with pytest.raises(ValueError):
        skill.from_json({"key": "a", "color": "red"})
    with pytest.raises(TypeError):
        skill.from_json(3)


# --- resolution ----------------------------------------------------------------------------


def test_resolution_batches_one_provider_call_and_sorts() -> None:
    provider = CountingProvider(
        {
            "notes": skill.inline("notes", "n"),
            "mandatory": skill.require(skill.inline("mandatory", "m"), "tenant"),
            "unused": skill.inline("unused", "u"),
        }
    )
    resolved = skill.resolve(
        [skill.inline("zeta", "z"), skill.key("notes"), skill.require(skill.key("notes"), "why")],
        provider,
    )
    assert provider.calls == [["notes"]]
    assert [s.key for s in resolved] == ["mandatory", "notes", "zeta"]
    notes = resolved[1]
    assert notes.required and notes.reason == "why"


def test_provider_is_asked_even_without_references() -> None:
    provider = CountingProvider({"m": skill.require(skill.inline("m", "m"), "always")})
    assert [s.key for s in skill.resolve([], provider)] == ["m"]
    assert provider.calls == [[]]


def test_not_found() -> None:
    with pytest.raises(skill.SkillNotFoundError, match="missing"):
        skill.resolve([skill.key("missing")], CountingProvider({}))
    with pytest.raises(skill.SkillNotFoundError):
        skill.resolve([skill.key("x")], None)


def test_a_reference_may_name_an_inline_skill() -> None:
    resolved = skill.resolve([skill.inline("a", "x"), skill.key("a")], None)
    assert [s.key for s in resolved] == ["a"]


def test_key_and_source_missing() -> None:
    with pytest.raises(skill.SkillKeyMissingError):
        skill.resolve([skill.inline("  ", "x")], None)
    with pytest.raises(skill.SkillKeyMissingError):
        skill.resolve([skill.key("")], None)
    with pytest.raises(skill.SkillSourceMissingError):
        skill.resolve([skill.Skill("a", None)], None)
    with pytest.raises(skill.SkillKeyMissingError):
        skill.resolve([], CountingProvider({"": skill.require(skill.inline("", "x"), "r")}))


def test_equal_duplicates_merge(tmp_path: Path) -> None:
    a = skill.dir(tmp_path / "lint")
    b = skill.dir(str(tmp_path / "x" / ".." / "lint"))
    assert len(skill.resolve([a, b, skill.inline("s", "t"), skill.inline("s", "t")], None)) == 2


@pytest.mark.parametrize(
    "other,detail",
    [
        (skill.inline("a", "different"), "different sources"),
        (skill.require(skill.inline("a", "text"), "r"), "required"),
        (skill.Skill("a", skill.InlineSource("text"), reason="r"), "reasons"),
        (skill.inline("a", "text", metadata={"runtime_name": "b"}), "metadata"),
        (skill.archive("a", b"x"), "different sources"),
    ],
)
def test_conflicts(other: skill.Skill, detail: str) -> None:
    with pytest.raises(skill.SkillKeyConflictError) as caught:
        skill.resolve([skill.inline("a", "text"), other], None)
    err = caught.value
    assert err.key == "a" and detail in err.detail
    assert len(err.sources) == 2 and all(isinstance(s, str) for s in err.sources)
    assert "text" not in " ".join(err.sources)  # inline content is shown as a hash
    rebuilt = errors.from_wire(err.to_wire())
    assert isinstance(rebuilt, skill.SkillKeyConflictError) and rebuilt.sources == err.sources


def test_provider_entries_conflict_with_inline_values() -> None:
    provider = CountingProvider({"a": skill.inline("a", "provider")})
    with pytest.raises(skill.SkillKeyConflictError):
        skill.resolve([skill.inline("a", "mine"), skill.key("a")], provider)


def test_set_catalogue() -> None:
    s = skill.Set({"b": skill.inline("x", "b"), "a": skill.inline("a", "a")})
    assert [k.key for k in s.catalogue()] == ["a", "b"]
    assert set(s.get_skills(["b", "zz"])) == {"b"}
    assert isinstance(s, skill.Catalogue)


# --- runtime names -------------------------------------------------------------------------


def test_runtime_names() -> None:
    assert skill.runtime_name(skill.inline("lint", "x")) == "lint"
    tenant = skill.runtime_name(skill.inline("tenant/Lint", "x"))
    assert tenant.startswith("lint-") and len(tenant) == len("lint-") + 10
    assert skill.runtime_name(skill.inline("a", "x", metadata={"runtime_name": "b"})) == "b"


@given(st.text(min_size=1, max_size=200))
def test_runtime_names_are_safe_and_distinct(key: str) -> None:
    name = skill.runtime_name(skill.inline(key, "x"))
    assert skill._RUNTIME_NAME.fullmatch(name)
    if name == key:
        return
    assert name != skill.runtime_name(skill.inline(key + "/", "x"))


# --- staging -------------------------------------------------------------------------------


def test_stage_dir_inline_and_archives(tmp_path: Path) -> None:
    source = make_dir(tmp_path / "src")
    os.chmod(source / "scripts" / "run.sh", 0o755)
    packed = zip_bytes({"SKILL.md": SKILL_MD.encode(), "ref/notes.txt": b"n"})
    tgz = tar_bytes([(reg("top/SKILL.md"), b"x"), (reg("top/bin/tool", 0o755), b"#!")], "w:gz")
    archive_file = tmp_path / "pack.tar"
    archive_file.write_bytes(tar_bytes([(reg("SKILL.md"), b"y")]))
    skills = skill.resolve(
        [
            skill.dir(source),
            skill.inline("style", SKILL_MD),
            skill.archive("zipped", packed),
            skill.archive("gzipped", tgz, subpath="top"),
            skill.archive("from-file", archive_file),
        ],
        None,
    )
    out = tmp_path / "run" / "skills"
    staged = {r.key: r for r in skill.materialize(skills, out)}
    assert set(staged) == {"lint", "style", "zipped", "gzipped", "from-file"}
    lint = Path(staged["lint"].path)
    assert lint == out / "lint"
    assert (lint / "scripts" / "run.sh").stat().st_mode & 0o111
    assert stat.S_IMODE(lint.stat().st_mode) == 0o700
    assert stat.S_IMODE((lint / "SKILL.md").stat().st_mode) == 0o600
    assert (Path(staged["style"].path) / "SKILL.md").read_text() == SKILL_MD
    assert (Path(staged["zipped"].path) / "ref" / "notes.txt").read_bytes() == b"n"
    gz = Path(staged["gzipped"].path)
    assert (gz / "SKILL.md").read_bytes() == b"x" and os.access(gz / "bin" / "tool", os.X_OK)
    assert (Path(staged["from-file"].path) / "SKILL.md").read_bytes() == b"y"
    for r in staged.values():
        assert r.fingerprint.startswith("sha256:") and r.runtime_name == Path(r.path).name


def test_fingerprints_follow_content(tmp_path: Path) -> None:
    def staged(text: str, where: str) -> str:
        (result,) = skill.materialize([skill.inline("a", text)], tmp_path / where)
        return result.fingerprint

    assert staged("x", "one") == staged("x", "two")
    assert staged("x", "three") != staged("y", "four")
    source = make_dir(tmp_path / "src")
    (first,) = skill.materialize([skill.dir(source)], tmp_path / "five")
    (source / "scripts" / "run.sh").write_text("changed\n")
    (second,) = skill.materialize([skill.dir(source)], tmp_path / "six")
    assert first.fingerprint != second.fingerprint
    assert skill.fingerprint([first]) != skill.fingerprint([second])


def failure(tmp_path: Path, made: skill.Skill, **limits: int) -> skill.SkillMaterializationError:
    out = tmp_path / "out"
    with pytest.raises(skill.SkillMaterializationError) as caught:
        skill.materialize([made], out, _limits=skill.Limits(**limits))
    err = caught.value
    assert err.key == made.key and err.runtime_name == skill.runtime_name(made)
    assert err.cause is not None and err.__cause__ is err.cause
    assert not (out / err.runtime_name).exists()  # a failed skill leaves nothing behind
    return err


def test_missing_skill_md(tmp_path: Path) -> None:
    err = failure(tmp_path, skill.archive("a", zip_bytes({"README": b"x"})))
    assert "SKILL.md" in str(err.cause)
    failure(tmp_path, skill.archive("b", tar_bytes([(reg("x/SKILL.md"), b"x")])))  # no subpath
    failure(tmp_path, skill.dir(tmp_path / "does-not-exist"))
    err = failure(tmp_path, skill.archive("c", tmp_path / "missing.zip"))
    # The error's own message says why, with the path: many show only str(error).
    assert str(err) == (
        "could not stage skill 'c' as 'c': [Errno 2] No such file or directory: "
        f"'{tmp_path / 'missing.zip'}'"
    )
    failure(tmp_path, skill.archive("d", b"neither zip nor tar"))


@pytest.mark.parametrize(
    "name",
    ["../evil/SKILL.md", "/etc/SKILL.md", "a/../../SKILL.md", "C:/SKILL.md", "a\\..\\SKILL.md"],
)
def test_path_escapes_are_refused(tmp_path: Path, name: str) -> None:
    entries = {"SKILL.md": b"ok", name: b"evil"}
    err = failure(tmp_path, skill.archive("z", zip_bytes(entries)))
    assert isinstance(err.cause, ValueError)
    failure(tmp_path, skill.archive("t", tar_bytes([(reg("SKILL.md"), b"ok"), (reg(name), b"e")])))
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()


def test_links_and_devices_are_refused(tmp_path: Path) -> None:
    symlink = reg("link")
    symlink.type, symlink.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hardlink = reg("hard")
    hardlink.type, hardlink.linkname = tarfile.LNKTYPE, "SKILL.md"
    device = reg("dev")
    device.type = tarfile.CHRTYPE
    fifo = reg("fifo")
    fifo.type = tarfile.FIFOTYPE
    for bad in (symlink, hardlink, device, fifo):
        failure(tmp_path, skill.archive("t", tar_bytes([(reg("SKILL.md"), b"x"), (bad, None)])))
    zipped_link = zip_bytes({"SKILL.md": b"x", "link": b"/etc/passwd"}, modes={"link": 0o120777})
    failure(tmp_path, skill.archive("z", zipped_link))
    source = make_dir(tmp_path / "src")
    (source / "escape").symlink_to("/etc/passwd")
    err = failure(tmp_path, skill.dir(source))
    assert "symlink" in str(err.cause)


def _swap_for_link(folder: Path, outside: Path) -> None:
    """What another process could do at any moment: move ``folder`` away, link its name out."""
    if not folder.is_symlink():  # once
        folder.rename(folder.with_name(folder.name + "-moved"))
        folder.symlink_to(outside, target_is_directory=True)


def test_a_folder_replaced_by_a_link_while_it_is_copied_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The copy checks each entry, then reads it: a sub-folder (or a file's parent folder)
    # swapped for a link in between must not bring the link's target into the skill.
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.md").write_text("SECRET")
    (outside / "secret.txt").write_text("SECRET")
    source = make_dir(tmp_path, "src", {"SKILL.md": SKILL_MD, "docs/a.md": "mine"})

    checked_folder = skill._Stager.directory

    def swap_after_check(self: skill._Stager, parts: tuple[str, ...]) -> None:
        checked_folder(self, parts)
        if parts == ("docs",):
            _swap_for_link(source / "docs", outside)

    monkeypatch.setattr(skill._Stager, "directory", swap_after_check)
    err = failure(tmp_path, skill.dir(source))
    assert "'docs' was replaced while the skill was copied" in str(err.cause)
    monkeypatch.undo()

    # The folder swapped after it was listed, before its file is opened: the file is read
    # from the folder that was listed (now moved), never through the link.
    (source / "docs").unlink()
    (source / "docs-moved").rename(source / "docs")
    checked_size = skill._Stager.declared_size

    def swap_before_open(self: skill._Stager, parts: tuple[str, ...], size: int) -> None:
        checked_size(self, parts, size)
        if parts == ("docs", "a.md"):
            _swap_for_link(source / "docs", outside)

    monkeypatch.setattr(skill._Stager, "declared_size", swap_before_open)
    (staged,) = skill.materialize([skill.dir(source)], tmp_path / "out2")
    assert (Path(staged.path) / "docs" / "a.md").read_text() == "mine"
    assert not any("SECRET" in p.read_text() for p in Path(staged.path).rglob("*") if p.is_file())


def test_an_archive_path_that_is_not_a_file_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "skill.tar"
    os.mkfifo(fifo)
    outcome: list[skill.SkillMaterializationError] = []
    staging = threading.Thread(
        target=lambda: outcome.append(failure(tmp_path / "one", skill.archive("f", fifo))),
        daemon=True,
    )
    staging.start()
    staging.join(10)
    if staging.is_alive():  # the old open() waits for a writer: give it one, then fail
        with open(fifo, "wb"):
            pass
        staging.join(30)
        pytest.fail("staging a FIFO named as an archive waited for a writer")
    assert "is a fifo, not a file" in str(outcome[0].cause)
    err = failure(tmp_path / "two", skill.archive("d", make_dir(tmp_path / "a-directory")))
    assert "is a directory, not a file" in str(err.cause)


def test_duplicate_entries_are_refused(tmp_path: Path) -> None:
    twice = tar_bytes([(reg("SKILL.md"), b"a"), (reg("SKILL.md"), b"b")])
    failure(tmp_path, skill.archive("t", twice))


ONE_KIB = b"x" * 1024


@pytest.mark.parametrize("kind", ["zip", "tar", "tgz", "dir"])
def test_entry_limit(tmp_path: Path, kind: str) -> None:
    files = {"SKILL.md": b"x", **{f"f{i}": b"" for i in range(5)}}
    made = _source(tmp_path, kind, files)
    (ok,) = skill.materialize([made], tmp_path / "ok", _limits=skill.Limits(max_entries=6))
    assert ok.key == made.key
    err = failure(tmp_path, made, max_entries=5)
    assert "entries" in str(err.cause)


@pytest.mark.parametrize("kind", ["zip", "tar", "tgz", "dir"])
def test_file_limit(tmp_path: Path, kind: str) -> None:
    made = _source(tmp_path, kind, {"SKILL.md": b"x", "big": ONE_KIB})
    skill.materialize([made], tmp_path / "ok", _limits=skill.Limits(max_file_bytes=1024))
    err = failure(tmp_path, made, max_file_bytes=1023)
    assert "larger than 1023" in str(err.cause)


@pytest.mark.parametrize("kind", ["zip", "tar", "tgz", "dir"])
def test_total_limit(tmp_path: Path, kind: str) -> None:
    made = _source(tmp_path, kind, {"SKILL.md": b"x", "a": ONE_KIB, "b": ONE_KIB})
    skill.materialize([made], tmp_path / "ok", _limits=skill.Limits(max_total_bytes=2049))
    err = failure(tmp_path, made, max_total_bytes=2048)
    assert "larger than 2048" in str(err.cause)


def test_understated_sizes_cannot_smuggle_bytes(tmp_path: Path) -> None:
    # A zip whose headers claim 10 bytes for a 1 KiB entry passes the declared-size check;
    # what is read must still be bounded and checked.
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        z.writestr("SKILL.md", b"x")
        z.writestr("big", ONE_KIB)
    data = bytearray(buffer.getvalue())
    local = data.rindex(b"PK\x03\x04")  # the second entry's local header
    central = data.rindex(b"PK\x01\x02")  # and its central directory record
    data[local + 22 : local + 26] = (10).to_bytes(4, "little")
    data[central + 24 : central + 28] = (10).to_bytes(4, "little")
    assert zipfile.ZipFile(io.BytesIO(bytes(data))).getinfo("big").file_size == 10
    err = failure(tmp_path, skill.archive("z", bytes(data)), max_file_bytes=100)
    assert err.cause is not None


def _zeros_after(header: bytes, size: int, compression: str) -> bytes:
    """``header`` then ``size`` zero bytes, compressed as a streaming archiver would."""
    import bz2
    import gzip
    import lzma

    buffer = io.BytesIO()
    packer: gzip.GzipFile | bz2.BZ2File | lzma.LZMAFile
    if compression == "gz":
        packer = gzip.GzipFile(fileobj=buffer, mode="wb")
    elif compression == "bz2":
        packer = bz2.BZ2File(buffer, "wb")
    else:
        packer = lzma.LZMAFile(buffer, "wb")
    with packer:
        packer.write(header)
        block = bytes(1 << 20)
        for _ in range(size >> 20):
            packer.write(block)
        packer.write(bytes(1024))
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("kind", "compression"),
    [(tarfile.GNUTYPE_LONGNAME, "gz"), (tarfile.XHDTYPE, "bz2"), (tarfile.GNUTYPE_LONGNAME, "xz")],
)
def test_a_tar_header_cannot_unpack_beyond_the_limits(
    tmp_path: Path, kind: bytes, compression: str
) -> None:
    # A long-name (or pax) record that claims 64 MiB: tarfile reads such a record into memory
    # whole, so a small compressed archive could make staging hold any amount it declares.
    import tracemalloc

    record = tarfile.TarInfo("././@LongLink")
    record.type, record.size = kind, 64 << 20
    bomb = _zeros_after(record.tobuf(tarfile.GNU_FORMAT), record.size, compression)
    assert len(bomb) < (1 << 20)
    tracemalloc.start()
    try:
        err = failure(
            tmp_path, skill.archive("bomb", bomb), max_total_bytes=1 << 20, max_entries=10
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (16 << 20), f"staging held {peak >> 20} MiB for a 1 MiB limit"
    assert "unpacks to more than" in str(err.cause)


def test_tar_members_outside_the_subpath_count_toward_the_limit(tmp_path: Path) -> None:
    # Skipping a member of a compressed tar decompresses it: what is skipped is bounded too.
    packed = tar_bytes(
        [(reg("top/SKILL.md"), b"x"), (reg("other/big"), bytes(4 << 20))], "w:gz"
    )
    made = skill.archive("k", packed, subpath="top")
    (ok,) = skill.materialize([made], tmp_path / "ok", _limits=skill.Limits(max_entries=10))
    assert (Path(ok.path) / "SKILL.md").read_bytes() == b"x"
    err = failure(tmp_path, made, max_total_bytes=1 << 20, max_entries=10)
    assert "unpacks to more than" in str(err.cause)


def test_duplicate_runtime_names_fail(tmp_path: Path) -> None:
    a = skill.inline("a", "x", metadata={"runtime_name": "same"})
    b = skill.inline("b", "x", metadata={"runtime_name": "same"})
    with pytest.raises(skill.SkillMaterializationError) as caught:
        skill.materialize([a, b], tmp_path)
    assert caught.value.key == "b" and caught.value.runtime_name == "same"
    with pytest.raises(skill.SkillMaterializationError):
        skill.materialize([skill.inline("c", "x", metadata={"runtime_name": "../up"})], tmp_path)


def test_errors_are_in_the_taxonomy() -> None:
    err = skill.SkillMaterializationError("k", "r", OSError("disk"))
    rebuilt = errors.from_wire(err.to_wire())
    assert isinstance(rebuilt, skill.SkillMaterializationError)
    assert (rebuilt.key, rebuilt.runtime_name) == ("k", "r")
    for cls in (
        skill.SkillNotFoundError,
        skill.SkillSourceMissingError,
        skill.SkillKeyMissingError,
    ):
        assert type(errors.from_wire(cls("m").to_wire())) is cls
        assert errors.exit_code_for(cls()) == 3


def _source(tmp_path: Path, kind: str, files: Mapping[str, bytes]) -> Any:
    if kind == "zip":
        return skill.archive("k", zip_bytes(files))
    if kind in ("tar", "tgz"):
        members = [(reg(name), data) for name, data in files.items()]
        return skill.archive("k", tar_bytes(members, "w:gz" if kind == "tgz" else "w"))
    base = tmp_path / "src" / "k"
    base.mkdir(parents=True)
    for name, data in files.items():
        (base / name).write_bytes(data)
    return skill.dir(base)


# --- skill.Directories ------------------------------------------------------------------------


def _skill_folder(base: Path, name: str) -> Path:
    (base / name).mkdir(parents=True)
    (base / name / "SKILL.md").write_text(f"# {name}\n")
    return base / name


def test_directories_offer_each_folder_under_its_name_the_first_directory_winning(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    lint = _skill_folder(first, "lint")
    _skill_folder(second, "lint")
    notes = _skill_folder(second, "notes")
    catalogue = skill.Directories([first, second, tmp_path / "missing"])
    found = catalogue.get_skills(["lint", "notes", "absent"])
    assert found == {"lint": skill.dir(lint), "notes": skill.dir(notes)}
    assert [s.key for s in catalogue.catalogue()] == ["lint", "notes"]
    assert catalogue.catalogue()[0] == skill.dir(lint)
    # Looked at on every call: a folder added later is offered at once.
    _skill_folder(first, "later")
    assert "later" in catalogue.get_skills(["later"])


def test_directories_leave_hidden_folders_out(tmp_path: Path) -> None:
    # A catalogue kept in git has a .git folder: it is no skill, and listing it made
    # `adaptord check` report a skill that cannot be staged.
    _skill_folder(tmp_path, "lint")
    _skill_folder(tmp_path, ".hidden")
    (tmp_path / ".git").mkdir()
    catalogue = skill.Directories([tmp_path])
    assert [s.key for s in catalogue.catalogue()] == ["lint"]
    assert catalogue.get_skills([".hidden", ".git", "lint"]) == {"lint": skill.dir(tmp_path / "lint")}


@pytest.mark.parametrize("key", ["../outside", "..", ".", "", "a/b", "/etc"])
def test_directories_never_look_outside_for_a_key(tmp_path: Path, key: str) -> None:
    _skill_folder(tmp_path, "outside")
    (tmp_path / "catalogue" / "a" / "b").mkdir(parents=True)
    assert skill.Directories([tmp_path / "catalogue"]).get_skills([key]) == {}


def test_directories_must_be_absolute() -> None:
    with pytest.raises(ValueError, match="absolute"):
        skill.Directories(["skills"])


def test_a_run_resolves_its_key_references_in_the_directories(tmp_path: Path) -> None:
    import adaptor
    from adaptor.testing import ScriptedDriver

    _skill_folder(tmp_path, "lint")
    agent = adaptor.Agent(
        ScriptedDriver([{"text": "ok"}]), skill_provider=skill.Directories([tmp_path])
    )
    assert agent.run("go", skills=[skill.key("lint")]).text == "ok"
    with pytest.raises(skill.SkillNotFoundError):
        agent.run("go", skills=[skill.key("../lint")])


def test_a_skill_provider_that_fails_is_named_in_the_error() -> None:
    import adaptor
    from adaptor.testing import ScriptedDriver

    class Broken:
        def get_skills(self, keys: Sequence[str]) -> Mapping[str, skill.Skill]:
            raise RuntimeError("catalogue service down")

    agent = adaptor.Agent(ScriptedDriver([{"text": "x"}]), skill_provider=Broken())
    with pytest.raises(RuntimeError, match="catalogue service down") as info:
        agent.run("go", skills=[skill.key("lint")])
    assert any("skill_provider" in note for note in getattr(info.value, "__notes__", []))


def test_a_skill_provider_without_get_skills_is_refused_at_construction() -> None:
    import adaptor
    from adaptor.testing import ScriptedDriver

    with pytest.raises(TypeError, match="get_skills"):
        adaptor.Agent(ScriptedDriver([]), skill_provider={"lint": skill.inline("lint", "x")})  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["agent", "call"])
def test_one_skill_passed_bare_is_a_clear_type_error(where: str) -> None:
    import adaptor
    from adaptor.testing import ScriptedDriver

    one = skill.inline("style", "# style")
    with pytest.raises(TypeError, match=r"skills takes a list, e\.g\. skills=\[\.\.\.\], not a Skill"):
        if where == "agent":
            adaptor.Agent(ScriptedDriver([]), skills=one)  # type: ignore[arg-type]
        else:
            adaptor.Agent(ScriptedDriver([])).stream("go", skills=one)


def test_an_empty_path_is_no_source_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # skill.dir("") staged the folder the program ran in (its name as the key):
    # skill.dir(os.environ.get("SKILL_DIR", "")) in a repository copied the repository.
    make_dir(tmp_path, "repo")
    monkeypatch.chdir(tmp_path / "repo")
    with pytest.raises(skill.SkillKeyMissingError):
        skill.resolve([skill.dir("")], None)
    with pytest.raises(skill.SkillSourceMissingError):
        skill.resolve([skill.archive("k", "")], None)


def test_a_catalogue_of_one_path_given_bare_says_to_pass_a_list(tmp_path: Path) -> None:
    # A str is an iterable of str: it was taken letter by letter ("must be absolute: w, o, r").
    with pytest.raises(TypeError, match=r"takes a list of directories, not one path"):
        skill.Directories(str(tmp_path))
    assert skill.Directories([str(tmp_path)]).directories == (str(tmp_path),)
