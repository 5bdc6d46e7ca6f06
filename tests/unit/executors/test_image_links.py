"""The readers of a container's root file system that `supervisor_container._image_link` judges: a
mounted one (podman's `mount`), overlay layer directories read without mounting them (docker's
overlay2) and an exported tar (docker's `export`). The layers are merged here as the kernel's
overlayfs merges them: each reader is compared with the kernel's own mount of the same layers.
Needs root (whiteouts are device nodes, opaque directories carry a trusted xattr, mounts)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from aisched.executors.mounts import syscall
from aisched.executors.supervisor_container import (
    _exported_kinds,
    _image_link,
    _layers_kind,
    _rootfs_kind,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="whiteouts, opaque directories and overlay mounts need root"
)

# Each layer, the uppermost first: path -> "dir", "opaque" (an opaque directory), "link",
# "file", "whiteout" or "hardlink" (a second name of the layer's /f/link).
LAYERS: list[dict[str, str]] = [
    {"/a": "link", "/b": "dir", "/c": "opaque", "/d": "whiteout", "/e": "dir", "/g": "file",
     "/h": "dir", "/i": "dir", "/f": "dir", "/f/link": "link", "/f/hard": "hardlink"},
    {"/a": "dir", "/b/link": "link", "/c/link": "link", "/d": "link", "/e": "file",
     "/h/w": "whiteout", "/k": "dir"},
    {"/e/link": "link", "/h/w": "link", "/i/j": "link", "/k": "link"},
]  # fmt: skip
PATHS = ["/a", "/a/x", "/b", "/b/link", "/c/link", "/d", "/d/x", "/e/link", "/f", "/f/link",
         "/f/hard", "/g", "/g/x", "/h/w", "/i/j", "/i/j/x", "/k", "/missing"]  # fmt: skip


def make_layer(top: Path, entries: dict[str, str]) -> None:
    for path, kind in sorted(entries.items(), key=lambda e: (e[1] == "hardlink", e[0])):
        at = top / path.lstrip("/")
        at.parent.mkdir(parents=True, exist_ok=True)
        if kind in ("dir", "opaque"):
            at.mkdir()
            if kind == "opaque":
                os.setxattr(at, "trusted.overlay.opaque", b"y")
        elif kind == "link":
            at.symlink_to("/elsewhere")
        elif kind == "file":
            at.write_text("x\n")
        elif kind == "whiteout":
            os.mknod(at, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        else:
            os.link(at.parent / "link", at, follow_symlinks=False)


@pytest.fixture
def layers() -> Iterator[tuple[list[str], str]]:
    """The layer directories, the uppermost first, and the kernel's read-only overlay of
    them."""
    top = Path(tempfile.mkdtemp())
    dirs = [str(top / str(k)) for k in range(len(LAYERS))]
    for d, entries in zip(dirs, LAYERS, strict=True):
        os.mkdir(d)
        make_layer(Path(d), entries)
    merged = top / "merged"
    merged.mkdir()
    syscall("mount", "overlay", str(merged), "overlay", 1, f"lowerdir={':'.join(dirs)}")
    try:
        yield dirs, str(merged)
    finally:
        syscall("umount2", str(merged), 0)
        shutil.rmtree(top)


def test_each_reader_sees_what_the_kernels_overlay_shows(
    layers: tuple[list[str], str], tmp_path: Path
) -> None:
    dirs, merged = layers
    # Exported as docker does: the merged tree, a second name of a file as a hard link.
    tar = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", merged, "-cf", str(tar), "."], check=True)
    with open(tar, "rb") as f:
        readers = [_rootfs_kind(merged), _layers_kind(dirs), _exported_kinds(f, PATHS)]
        kinds = [{p: reader(p) for p in PATHS} for reader in readers]
    want = {
        "/a": "link", "/a/x": "missing", "/b": "dir", "/b/link": "link", "/c/link": "missing",
        "/d": "missing", "/d/x": "missing", "/e/link": "missing", "/f": "dir", "/f/link": "link",
        "/f/hard": "link", "/g": "other", "/g/x": "missing", "/h/w": "missing", "/i/j": "link",
        "/i/j/x": "missing", "/k": "dir", "/missing": "missing",
    }  # fmt: skip
    assert kinds == [want, want, want]


@pytest.mark.parametrize(
    ("path", "mounted", "link"),
    [
        ("/a/x/y", set(), "/a"),  # the first link on the way
        ("/i/j/data", set(), "/i/j"),  # a link of a layer below, under a merged directory
        ("/f/link", set(), "/f/link"),  # the mount point itself
        ("/c/link/data", set(), None),  # hidden by an opaque directory above it
        ("/h/w/data", set(), None),  # hidden by a whiteout
        ("/e/link/data", set(), None),  # a file above ends the merge
        ("/g/x", set(), None),  # no directory: the engine fails on it, no link followed
        ("/b/link/data", {"/b"}, None),  # below a mount: the mount's, not the image's
        ("/b/link/data", {"/b/link"}, "/b/link"),  # a mount point that is a link
        ("/missing/../a/x", set(), "/a"),  # `..` dropped first, as the engines do
        ("/b/link/data", {"/x/../b/"}, None),  # a mount's path read the same way
    ],
)
def test_the_walk_stops_at_the_first_link_up_to_a_mount(
    layers: tuple[list[str], str], path: str, mounted: set[str], link: str | None, tmp_path: Path
) -> None:
    dirs, merged = layers
    assert _image_link(_layers_kind(dirs), path, mounted) == link
    assert _image_link(_rootfs_kind(merged), path, mounted) == link
    tar = tmp_path / "rootfs.tar"
    subprocess.run(["tar", "-C", merged, "-cf", str(tar), "."], check=True)
    with open(tar, "rb") as f:  # the export reads only the names on the way to the paths
        assert _image_link(_exported_kinds(f, [path, *mounted]), path, mounted) == link
