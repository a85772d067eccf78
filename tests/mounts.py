"""Filesystems mounted for one test (root only; a test elsewhere is skipped, saying why)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(mount_point: Path, options: str = "size=8m") -> Iterator[Path]:
    """A tmpfs mounted with ``options`` at ``mount_point`` (made if missing) for the block."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount")
    mount_point.mkdir(exist_ok=True)
    with _mounted(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], "a tmpfs"):
        yield mount_point


@contextlib.contextmanager
def exfat(tmp_path: Path, *options: str) -> Iterator[Path]:
    """An exFAT filesystem mounted (FUSE) with ``options`` for the block: no hard links, and
    with its default options every file shows mode 0777 (chmod succeeds and changes nothing),
    as on NTFS or FAT."""
    image, mount_point = _formatted_image(
        tmp_path, "exfat", ("losetup", "mkfs.exfat", "mount.exfat-fuse"), "losetup and exFAT's tools (exfatprogs, exfat-fuse)"
    )
    attached = subprocess.run(["losetup", "-f", "--show", str(image)], capture_output=True, text=True, timeout=60)
    if attached.returncode != 0:
        pytest.skip(f"no loop device here: {attached.stderr.strip()}")
    device = attached.stdout.strip()
    try:
        with _mounted(["mount.exfat-fuse", *options, device, str(mount_point)], "exFAT"):
            yield mount_point
    finally:
        subprocess.run(["losetup", "-d", device], check=True, timeout=60)


@contextlib.contextmanager
def fat(tmp_path: Path) -> Iterator[Path]:
    """A FAT filesystem mounted (FUSE, ``fusefat``: the kernel here may have no vfat) for the
    block: no hard links, and no chmod at all (``ENOSYS``)."""
    image, mount_point = _formatted_image(tmp_path, "vfat", ("mkfs.vfat", "fusefat"), "FAT's tools (dosfstools, fusefat)")
    with _mounted(["fusefat", "-o", "rw+", str(image), str(mount_point)], "FAT"):
        yield mount_point


def _formatted_image(tmp_path: Path, kind: str, tools: tuple[str, ...], named: str) -> tuple[Path, Path]:
    """A 32 MiB image in ``tmp_path`` made by ``mkfs.<kind>``, and a folder to mount it at (the
    test is skipped, saying why, without root, FUSE or ``tools``)."""
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in (*tools, "umount")) or not os.path.exists("/dev/fuse"):
        pytest.skip(f"needs root, /dev/fuse and {named}")
    image, mount_point = tmp_path / f"{kind}.img", tmp_path / kind
    mount_point.mkdir()
    with open(image, "wb") as blank:
        blank.truncate(32 << 20)
    formatted = subprocess.run([f"mkfs.{kind}", str(image)], capture_output=True, text=True, timeout=60)
    if formatted.returncode != 0:
        pytest.skip(f"mkfs.{kind} failed here: {formatted.stderr.strip() or formatted.stdout.strip()}")
    return image, mount_point


@contextlib.contextmanager
def _mounted(command: list[str], what: str) -> Iterator[None]:
    """``command`` mounts something at its last argument, unmounted after the block."""
    shown = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if shown.returncode != 0:
        pytest.skip(f"cannot mount {what} here: {shown.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", command[-1]], check=True, timeout=60)
