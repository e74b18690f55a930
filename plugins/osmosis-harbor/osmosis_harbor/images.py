"""Task images without a Docker daemon: each task's Dockerfile built once, into a read-only rootfs.

``ImageCache.build(environment_dir)`` builds ``environment/Dockerfile`` with buildah (as root,
``--isolation chroot``, ``--pull=never``, the overlay storage driver, all in the cache's own
storage) and exports the image once to ``<cache>/images/<key>/rootfs``, with the image's ``Env``,
``WorkingDir`` and ``User`` in ``image.json``. The key is the sha256 of the Dockerfile, the build
context as the build sees it (``.dockerignore`` applied), each base's image id, the builder's
version and the host ids the rootfs is owned by. A build runs under a lock of its key, into a
temporary folder that is renamed into place: a published rootfs is never changed (a change makes
another key), and two runs wanting one key build it once.

Bases come from no registry: ``debian:bookworm``, ``debian:trixie`` (and ``-slim``), ``ubuntu:22.04``
and ``ubuntu:24.04`` are made here from the distributions' package archives with mmdebstrap (once,
about 15-25 s each), given the host's extra certificate authorities (the ones an intercepting proxy
needs), and tagged with their registry names, so ``FROM debian:13-slim`` resolves locally. Any other
base (``python:3.12-slim``, ``ghcr.io/...``) is the user's to give: a rootfs tarball or an OCI
archive (``bases={"python:3.12-slim": "py312.tar"}``), else the build fails naming it and the two ways
out.

The rootfs's files belong to the sandbox's host ids (:func:`osmosis_harbor.bwrap.sandbox_id_base`):
the image's root is the trial's root, never the host's.

Needs root, ``buildah`` and ``mmdebstrap`` (``apt-get install -y buildah mmdebstrap``).

>>> cache = ImageCache(Path("/nonexistent/cache"))
>>> cache.images_dir.as_posix()
'/nonexistent/cache/images'
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from osmosis_core import InfraError
from osmosis_harbor.dockerfile import KNOWN_BASES, Base, DockerfileError, base_names, context_digest, resolve_base

__all__ = [
    "CACHE_ENV",
    "FORMAT",
    "HEREDOC_BUILDAH",
    "BaseUnavailable",
    "ImageBuildError",
    "ImageBuilds",
    "ImageCache",
    "TaskImage",
    "default_cache_dir",
    "has_dockerfile",
    "image_build_missing",
    "uses_heredocs",
]

CACHE_ENV = "OSMOSIS_IMAGE_CACHE"
"""The variable naming the image cache folder (default: ``$XDG_CACHE_HOME/osmosis/images``)."""
FORMAT = 1
"""The layout of a cached image; part of every key (a new layout never reads an old one)."""
_LOG_TAIL = 40
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_CA_FOLDER = Path("/usr/local/share/ca-certificates")
_HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_UBUNTU_KEYRING = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
_ARCHIVES = {
    "debian": "http://deb.debian.org/debian",
    "ubuntu": "http://archive.ubuntu.com/ubuntu",
}
_WAYS_OUT = (
    "osmosis makes {known} itself (no registry); for another base, either build where its registry is "
    'reachable, or give it as a rootfs tarball or an OCI archive: [backend.harbor.sandbox] bases = {{"{name}" = '
    '"path/to/rootfs.tar"}} (or `osmosis harbor build --base {name}=path/to/rootfs.tar`)'
)
Progress = Callable[[str], None]


class ImageBuildError(InfraError):
    """A task's image could not be built (the message names the task and ends with the build log's tail)."""


class BaseUnavailable(ImageBuildError):
    """A Dockerfile's base cannot be made here and was not given (the message names both ways out)."""


def default_cache_dir() -> Path:
    """``$OSMOSIS_IMAGE_CACHE``, else ``$XDG_CACHE_HOME/osmosis/images``, else ``~/.cache/osmosis/images``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser().absolute()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "osmosis" / "images"


def image_build_missing() -> str | None:
    """Why task images cannot be built on this machine (not root, no buildah or mmdebstrap), or None."""
    if os.geteuid() != 0:
        return "building them needs root"
    absent = [name for name in ("buildah", "mmdebstrap") if shutil.which(name) is None]
    if absent:
        return f"{' and '.join(absent)} not installed (apt-get install -y {' '.join(absent)})"
    return None


_HEREDOC = re.compile(r"^\s*(?:RUN|COPY|ADD)\b[^\n]*<<-?\s*[\"']?[A-Za-z_][A-Za-z0-9_]*", re.IGNORECASE | re.MULTILINE)
HEREDOC_BUILDAH = (1, 39)
"""The first buildah that reads Dockerfile heredocs (``RUN <<EOF``); an older one on this machine builds
such a Dockerfile with buildah from a Debian trixie tools tree made once in the cache."""


def uses_heredocs(dockerfile: Path) -> bool:
    """True when a Dockerfile has a heredoc (``RUN <<EOF``, ``COPY <<EOF /path``)."""
    try:
        return _HEREDOC.search(dockerfile.read_text(encoding="utf-8", errors="replace")) is not None
    except OSError:
        return False


def has_dockerfile(environment_dir: Path) -> bool:
    """True when a task's ``environment/`` folder has a Dockerfile to build."""
    return (Path(environment_dir) / "Dockerfile").is_file()


@attrs.frozen
class TaskImage:
    """A built image: its read-only rootfs and what a container of it starts with."""

    key: str
    folder: Path
    env: dict[str, str]
    workdir: str
    user: str
    task: str
    """The environment folder it was built from (when first built)."""
    built: float
    """When it was published (seconds since the epoch)."""
    seconds: float
    """How long the build and export took."""

    @property
    def rootfs(self) -> Path:
        return self.folder / "rootfs"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "key": self.key,
            "env": self.env,
            "workdir": self.workdir,
            "user": self.user,
            "task": self.task,
            "built": self.built,
            "seconds": self.seconds,
        }

    @classmethod
    def load(cls, folder: Path) -> TaskImage:
        data = json.loads((folder / "image.json").read_text())
        return cls(
            key=data["key"],
            folder=folder,
            env=dict(data["env"]),
            workdir=data["workdir"],
            user=data["user"],
            task=data["task"],
            built=data["built"],
            seconds=data["seconds"],
        )

    def size(self) -> int:
        """Bytes of the rootfs (walked: slow on a big image)."""
        total = 0
        for folder, _, files in os.walk(self.rootfs):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(folder, name)).st_blocks * 512
        return total


def _tool(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ImageBuildError(
            f"{name} is not installed, and building a task's Dockerfile without Docker needs it: "
            f"`apt-get install -y {package}` (Debian/Ubuntu)"
        )
    return found


@functools.cache
def _builder_version(argv: tuple[str, ...]) -> str:
    """What ``argv`` (a buildah command line ending in ``--version``) prints: once a process."""
    out = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    return out.stdout.strip() or "buildah ?"


def _sweep_unfinished(work: Path, locks: Path) -> None:
    """Remove what builds killed mid-way left in ``work`` (``<lock name>-*``): those whose lock is free."""
    if not work.is_dir():
        return
    for entry in work.iterdir():
        name = entry.name.rpartition("-")[0]
        if not name:
            continue
        fd = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a build of that key is running
            shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made if missing) for the block: one builder of a key at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _tail(text: str, lines: int = _LOG_TAIL) -> str:
    kept = text.rstrip().splitlines()[-lines:]
    return "\n".join(f"  | {line}" for line in kept)


@attrs.define
class ImageCache:
    """The folder of built task images and of everything their builds need (bases, buildah's storage).

    :param root: the cache folder (:func:`default_cache_dir`).
    :param bases: images the user gives for bases osmosis cannot make, by name (``python:3.12-slim``):
        a rootfs tarball (``.tar``, ``.tar.gz``, ...) or an OCI archive (a tar with ``oci-layout``).
    :param id_base: the host id the rootfs's root belongs to (None: left as built, owned by the host's root).
    """

    root: Path = attrs.field(factory=default_cache_dir, converter=Path)
    bases: Mapping[str, Path] = attrs.field(factory=dict)
    id_base: int | None = None

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    def _storage(self) -> list[str]:
        return [
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            "overlay",
        ]

    def _argv(self, *args: str, tools: Path | None = None, context: Path | None = None) -> list[str]:
        """A buildah command line, run in a mount namespace of its own: whatever it mounts (its storage,
        a container's layers) is gone when it exits, even killed, so no build leaves a mount behind.

        :param tools: the trixie tools tree: its buildah (>= 1.39) in a bubblewrap sandbox on it, with
            this machine's devices, the cache and ``context`` (a build's folder) bound, and storage of its own.
        """
        if tools is None:
            private = [_tool("unshare", "util-linux"), "--mount", "--propagation", "private"]
            return [*private, _tool("buildah", "buildah"), *self._storage(), *args]
        sandbox = [_tool("bwrap", "bubblewrap"), "--bind", str(tools), "/", "--dev-bind", "/dev", "/dev"]
        sandbox += ["--proc", "/proc", "--ro-bind", "/sys", "/sys", "--bind", str(self.root), str(self.root)]
        sandbox += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf", "--die-with-parent"]
        if context is not None:
            sandbox += ["--ro-bind", str(context), str(context)]
        storage = ["--root", str(self.root / "tools-storage"), "--runroot", str(self.root / "tools-run")]
        return [*sandbox, "--", "/usr/bin/buildah", *storage, "--storage-driver", "overlay", *args]

    def _buildah(self, *args: str, check: bool = True, tools: Path | None = None) -> str:
        proc = subprocess.run(
            self._argv(*args, tools=tools), capture_output=True, text=True, check=False, env=_build_env()
        )
        if check and proc.returncode != 0:
            raise ImageBuildError(f"buildah {args[0]} failed (exit {proc.returncode}):\n{_tail(proc.stderr)}")
        return proc.stdout.strip()

    def export(self, image: str, target: Path, *, tools: Path | None = None) -> None:
        """The files of ``image`` (a name or id in the cache's storage), as they are, into the new folder
        ``target``: a container of it mounted, copied and removed in one mount namespace.

        :raises ImageBuildError: with buildah's or cp's message.
        """
        script = (  # a container named for the export: one a killed export left is removed first
            '"$@" rm "$OSMOSIS_NAME" >/dev/null 2>&1 || true; set -e; '
            'c=$("$@" from --quiet --pull=never --name "$OSMOSIS_NAME" "$OSMOSIS_IMAGE"); '
            'trap \'"$@" rm "$c" >/dev/null\' EXIT; '
            'm=$("$@" mount "$c"); mkdir "$OSMOSIS_TARGET"; cp -a --no-preserve=context "$m/." "$OSMOSIS_TARGET"'
        )
        argv = self._argv(tools=tools)
        at = argv.index("--") + 1 if tools is not None else 4  # the buildah command, after the sandbox's
        command = [*argv[:at], "/bin/sh", "-c", script, "sh", *argv[at:]]
        name = "osmosis-export-" + hashlib.sha256(image.encode()).hexdigest()[:16]
        env = {**_build_env(), "OSMOSIS_IMAGE": image, "OSMOSIS_TARGET": str(target), "OSMOSIS_NAME": name}
        proc = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            raise ImageBuildError(f"cannot export the files of {image}:\n{_tail(proc.stderr)}")

    # ---------------------------------------------------------------- bases

    def _image_id(self, name: str) -> str | None:
        """The id of the image ``name`` in the cache's storage, or None (no such image)."""
        return self._buildah("inspect", "--type", "image", "--format", "{{.FromImageID}}", name, check=False) or None

    def ensure_base(self, name: str, *, where: str, progress: Progress | None = None) -> str:
        """Make sure ``name`` resolves in the cache's storage; return its image id.

        :param where: the Dockerfile line naming it, for the error.
        :raises BaseUnavailable: it can be neither made nor found among the given ones.
        """
        given = self._given(name)
        stamp = _stamp(given) if given is not None else None
        marker = self.root / "bases" / f"{hashlib.sha256(_qualified(name).encode()).hexdigest()[:16]}.given"
        found = self._image_id(name)
        if found is not None and (stamp is None or _read(marker) == stamp):
            return found  # (a given archive that changed since it was imported is imported again)
        base = resolve_base(name)
        if given is None and base is None:
            known = ", ".join(KNOWN_BASES)
            ways_out = _WAYS_OUT.format(known=known, name=name)
            raise BaseUnavailable(f"{where}: the base image {name!r} cannot be made here. {ways_out}")
        lock = self.root / "locks" / f"base-{hashlib.sha256(name.encode()).hexdigest()[:16]}.lock"
        with _locked(lock):
            found = self._image_id(name)
            if found is not None and (stamp is None or _read(marker) == stamp):
                return found
            if given is not None:
                self._import(given, name, progress)
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(stamp or "")
            else:
                assert base is not None
                canonical = self._image_id(base.name) or self._seed(base, progress, lock.stem)
                if name != base.name:
                    self._buildah("tag", canonical, _qualified(name))
        image = self._image_id(name)
        if image is None:
            raise ImageBuildError(f"{where}: the base {name!r} was made but does not resolve in the cache's storage")
        return image

    def _given(self, name: str) -> Path | None:
        wanted = _qualified(name)
        for given, path in self.bases.items():
            if _qualified(given) == wanted:
                return Path(path)
        return None

    def _import(self, archive: Path, name: str, progress: Progress | None) -> None:
        """A user's rootfs tarball or OCI archive, tagged ``name``."""
        if not archive.is_file():
            raise BaseUnavailable(f"the rootfs or OCI archive given for {name!r} does not exist: {archive}")
        if progress:
            progress(f"importing {archive} as {name}")
        if _is_oci_archive(archive):
            pulled = self._buildah("pull", "--quiet", f"oci-archive:{archive}").splitlines()
            if not pulled:
                raise ImageBuildError(f"cannot import the OCI archive {archive} (buildah printed no image id)")
            self._buildah("tag", pulled[-1], _qualified(name))
            return
        self._commit_rootfs(archive, _qualified(name), env={"PATH": _DEFAULT_PATH})

    def _commit_rootfs(self, tarball: Path, tag: str, env: Mapping[str, str]) -> str:
        container = self._buildah("from", "--quiet", "scratch")
        try:
            self._buildah("add", "--quiet", container, str(tarball), "/")
            for source, target in _certificates():
                self._buildah("copy", "--quiet", container, str(source), target)
            for key, value in env.items():
                self._buildah("config", "--env", f"{key}={value}", container)
            self._buildah("config", "--cmd", "bash", container)
            return self._buildah("commit", "--quiet", container, tag)
        finally:
            self._buildah("rm", container, check=False)

    def _seed(self, base: Base, progress: Progress | None, lock_name: str) -> str:
        """mmdebstrap a minimal ``base`` from its archive into the storage, as ``base.name``."""
        mmdebstrap = _tool("mmdebstrap", "mmdebstrap")
        if progress:
            progress(f"making the base {base.distro}:{base.suite} from {_ARCHIVES[base.distro]} (once)")
        work = self.root / "tmp"
        work.mkdir(parents=True, exist_ok=True)
        with (
            tempfile.TemporaryDirectory(prefix=f"{lock_name}-", dir=work) as temp,
            tempfile.TemporaryDirectory(prefix="osmosis-keyring-") as keys,  # (the cache is its owner's alone)
        ):
            os.chmod(keys, 0o755)  # apt reads the keyring as its own user, _apt
            tarball = Path(temp) / "base.tar"
            args = [mmdebstrap, "--variant=minbase", "--mode=root", "--format=tar", "--quiet"]
            if base.distro == "ubuntu":
                args += ["--include=apt,ca-certificates", "--components=main,universe", *_ubuntu_keyring(Path(keys))]
                suites = [
                    f"deb {_ARCHIVES['ubuntu']} {base.suite} main universe",
                    f"deb {_ARCHIVES['ubuntu']} {base.suite}-updates main universe",
                    f"deb http://security.ubuntu.com/ubuntu {base.suite}-security main universe",
                ]
                proc = subprocess.run(
                    [*args, base.suite, str(tarball), *suites], capture_output=True, text=True, check=False
                )
            else:
                proc = subprocess.run(
                    [*args, base.suite, str(tarball), _ARCHIVES["debian"]], capture_output=True, text=True, check=False
                )
            if proc.returncode != 0:
                raise ImageBuildError(f"mmdebstrap could not make {base.name}:\n{_tail(proc.stderr or proc.stdout)}")
            return self._commit_rootfs(tarball, base.name, env={"PATH": _DEFAULT_PATH, **_CA_ENV})

    def tools(self, progress: Progress | None = None) -> Path:
        """The trixie tools tree (buildah >= 1.39), made once by mmdebstrap (about 15 s) and published by rename."""
        tree = self.root / "tools" / "trixie"
        if (tree / "usr/bin/buildah").is_file():
            return tree
        with _locked(self.root / "locks" / "tools.lock"):
            if (tree / "usr/bin/buildah").is_file():
                return tree
            if progress:
                progress("making buildah >= 1.39 (for Dockerfile heredocs) from Debian trixie's archive (once)")
            work = self.root / "tmp"
            work.mkdir(parents=True, exist_ok=True)
            temp = Path(tempfile.mkdtemp(prefix="tools-", dir=work))
            try:
                proc = subprocess.run(
                    [
                        *(_tool("mmdebstrap", "mmdebstrap"), "--variant=minbase", "--mode=root", "--quiet"),
                        *("--include=buildah,netavark,ca-certificates", "trixie", str(temp / "trixie")),
                        _ARCHIVES["debian"],
                    ],
                    capture_output=True,
                    text=True,
                    check=False,
                )
                if proc.returncode != 0:
                    raise ImageBuildError(f"mmdebstrap could not make the trixie tools tree:\n{_tail(proc.stderr)}")
                tree.parent.mkdir(parents=True, exist_ok=True)
                os.rename(temp / "trixie", tree)
            finally:
                shutil.rmtree(temp, ignore_errors=True)
        return tree

    def _carry_bases(self, dockerfile: Path, tools: Path, temp: Path) -> None:
        """The Dockerfile's bases, from this cache's storage into the tools tree's (as OCI archives)."""
        for name, _ in base_names(dockerfile):
            archive = temp / "base.oci.tar"
            self._buildah("push", "--quiet", _qualified(name), f"oci-archive:{archive}")
            pulled = self._buildah("pull", "--quiet", f"oci-archive:{archive}", tools=tools).splitlines()
            if not pulled:
                raise ImageBuildError(f"cannot carry the base {name} to the trixie tools tree's buildah")
            self._buildah("tag", pulled[-1], _qualified(name), tools=tools)
            archive.unlink(missing_ok=True)

    def _builder_for(self, dockerfile: Path, progress: Progress | None) -> Path | None:
        """The tools tree when the Dockerfile needs a newer buildah than this machine's, else None."""
        if not uses_heredocs(dockerfile) or _version(self._builder(None)) >= HEREDOC_BUILDAH:
            return None
        return self.tools(progress)

    def _builder(self, tools: Path | None) -> str:
        """The version line of the buildah that builds (this machine's, or the tools tree's)."""
        return _builder_version(tuple(self._argv("--version", tools=tools)))

    # ---------------------------------------------------------------- tasks

    def key(self, environment_dir: Path, *, progress: Progress | None = None) -> str:
        """The cache key of a task's image (making its bases first: their ids are part of it).

        :raises ImageBuildError: a base cannot be made or given; a Dockerfile cannot be read.
        """
        dockerfile = Path(environment_dir) / "Dockerfile"
        try:
            bases = base_names(dockerfile)
        except DockerfileError as exc:
            raise ImageBuildError(str(exc)) from None
        digest = hashlib.sha256()
        tools = self._builder_for(dockerfile, progress)
        builder = self._builder(tools)
        digest.update(f"osmosis-image {FORMAT}\0{builder}\0{self.id_base}\0".encode())
        digest.update(context_digest(Path(environment_dir)).encode())
        for name, line in bases:
            digest.update(self.ensure_base(name, where=f"{dockerfile}:{line}", progress=progress).encode())
        return digest.hexdigest()[:32]

    def get(self, key: str) -> TaskImage | None:
        folder = self.images_dir / key
        try:
            return TaskImage.load(folder)
        except (OSError, ValueError, KeyError):
            return None

    def build(self, environment_dir: Path, *, progress: Progress | None = None) -> TaskImage:
        """The image of a task's ``environment/`` (its Dockerfile): from the cache, or built now and published.

        :raises ImageBuildError: naming the task, with the build log's tail.
        """
        environment_dir = Path(environment_dir).absolute()
        if os.geteuid() != 0:
            raise ImageBuildError(f"{environment_dir}/Dockerfile: building a task's image without Docker needs root")
        if not has_dockerfile(environment_dir):
            raise ImageBuildError(f"{environment_dir} has no Dockerfile to build")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)  # the images, their storage and builds: root's alone
        key = self.key(environment_dir, progress=progress)
        found = self.get(key)
        if found is not None:
            return found
        _sweep_unfinished(self.root / "tmp", self.root / "locks")
        with _locked(self.root / "locks" / f"{key}.lock"):
            found = self.get(key)  # another run built it while this one waited
            if found is not None:
                return found
            return self._build(environment_dir, key, progress)

    def _build(self, environment_dir: Path, key: str, progress: Progress | None) -> TaskImage:
        started = time.monotonic()
        task = environment_dir.parent.name if environment_dir.name == "environment" else environment_dir.name
        if progress:
            progress(f"building the image of {task} ({environment_dir}/Dockerfile)")
        work = self.root / "tmp"
        work.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=work))
        tag = f"localhost/osmosis-task:{key}"
        tools = self._builder_for(environment_dir / "Dockerfile", progress)
        try:
            extra: list[str] = []
            if tools is not None:
                self._carry_bases(environment_dir / "Dockerfile", tools, temp)
                extra = [
                    f"--ulimit=nofile={_limit(resource.RLIMIT_NOFILE)}",
                    f"--ulimit=nproc={_limit(resource.RLIMIT_NPROC)}",
                ]
            proc = subprocess.run(
                self._argv(
                    "build",
                    "--pull=never",
                    "--isolation",
                    "chroot",
                    "--network",
                    "host",
                    "--layers",
                    *extra,
                    "-t",
                    tag,
                    "-f",
                    str(environment_dir / "Dockerfile"),
                    str(environment_dir),
                    tools=tools,
                    context=environment_dir,
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
                env=_build_env(),
            )
            (temp / "build.log").write_text(proc.stdout)
            if proc.returncode != 0:
                raise ImageBuildError(
                    f"the image of {task} failed to build ({environment_dir}/Dockerfile, exit {proc.returncode}); "
                    f"the build log's end:\n{_tail(proc.stdout)}"
                )
            inspected = self._buildah("inspect", "--type", "image", tag, tools=tools)
            config = json.loads(inspected)["OCIv1"]["config"]
            self.export(tag, temp / "rootfs", tools=tools)
            workdir = config.get("WorkingDir") or "/"
            _make_workdir(temp / "rootfs", workdir)
            if self.id_base is not None:
                _shift_owner(temp / "rootfs", self.id_base)
            env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
            image = TaskImage(
                key=key,
                folder=self.images_dir / key,
                env=env,
                workdir=workdir,
                user=config.get("User") or "",
                task=str(environment_dir),
                built=time.time(),
                seconds=round(time.monotonic() - started, 2),
            )
            (temp / "image.json").write_text(json.dumps(image.to_json(), indent=2))
            os.chmod(temp, 0o755)
            self.images_dir.mkdir(parents=True, exist_ok=True)
            os.rename(temp, image.folder)  # published whole, or not at all
            return image
        finally:
            if temp.exists():
                shutil.rmtree(temp, ignore_errors=True)

    # ---------------------------------------------------------------- listing

    def images(self) -> list[TaskImage]:
        """The published images, newest first."""
        if not self.images_dir.is_dir():
            return []
        found = [image for child in self.images_dir.iterdir() if (image := self.get(child.name)) is not None]
        return sorted(found, key=lambda image: image.built, reverse=True)

    def prune(self, *, keep: set[str] | None = None, everything: bool = False) -> list[str]:
        """Remove published images (all of them, or those not in ``keep``) and unfinished builds.

        Returns the removed keys. Prune only when no run is using the cache: a running trial's
        overlay would lose the files under it.
        """
        if os.geteuid() != 0:
            raise ImageBuildError(f"pruning the image cache {self.root} needs root (its files are the sandbox's)")
        removed: list[str] = []
        for image in self.images():
            if everything or (keep is not None and image.key not in keep):
                with _locked(self.root / "locks" / f"{image.key}.lock"):
                    shutil.rmtree(image.folder, ignore_errors=True)
                    (self.root / "locks" / f"{image.key}.lock").unlink(missing_ok=True)
                removed.append(image.key)
        _sweep_unfinished(self.root / "tmp", self.root / "locks")
        if everything and (self.root / "storage").exists():
            self._buildah("rmi", "--all", "--force", check=False)
        return removed


def _version(text: str) -> tuple[int, ...]:
    """``buildah version 1.28.2 (...)`` → (1, 28, 2)."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(g) for g in match.groups() if g is not None) if match else (0,)


def _limit(which: int) -> str:
    """``soft:hard`` for buildah's ``--ulimit``: this process's hard limit (a build cannot raise it here)."""
    hard = resource.getrlimit(which)[1]
    value = "-1" if hard == resource.RLIM_INFINITY else str(hard)
    return f"{value}:{value}"


def _stamp(path: Path) -> str:
    """What identifies a given archive's content well enough to notice a new one: size and modification time."""
    try:
        info = path.stat()
    except OSError:
        return "missing"
    return f"{path.absolute()}:{info.st_size}:{info.st_mtime_ns}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _qualified(name: str) -> str:
    """``debian:12`` → ``docker.io/library/debian:12`` (how buildah names it)."""
    ref = name if ":" in name.rsplit("/", 1)[-1] or "@" in name else f"{name}:latest"
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        return f"docker.io/library/{ref}"
    if "." not in first and ":" not in first and first != "localhost":
        return f"docker.io/{ref}"
    return ref


def _is_oci_archive(path: Path) -> bool:
    import tarfile

    with contextlib.suppress(tarfile.TarError, OSError), tarfile.open(path) as archive:
        for member in archive:
            if member.name.lstrip("./") == "oci-layout":
                return True
            if member.name.lstrip("./").count("/") > 2:
                break
    return False


_CA_ENV = {
    "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
    "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt",
    "REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt",
}
"""What a base made here says to find the certificate authorities (the host's, its proxy's included)."""


def _certificates() -> list[tuple[Path, str]]:
    """The host's own certificate authorities (``/usr/local/share/ca-certificates``, where a proxy's CA
    goes) and its bundle, with where they go in a base made here: HTTPS from a build works where the
    host's does, and survives ``update-ca-certificates`` in a build."""
    found: list[tuple[Path, str]] = []
    if _CA_FOLDER.is_dir():
        found += [(e, f"{_CA_FOLDER}/") for e in sorted(_CA_FOLDER.iterdir()) if e.is_file() and e.suffix == ".crt"]
    if _HOST_BUNDLE.is_file():
        found.append((_HOST_BUNDLE, str(_HOST_BUNDLE)))
    return found


def _ubuntu_keyring(temp: Path) -> list[str]:
    """mmdebstrap's ``--keyring`` for Ubuntu's archive: the host's, or ``ubuntu-keyring`` fetched
    through apt from Debian's (signed) bookworm-backports."""
    if _UBUNTU_KEYRING.is_file():
        return [f"--keyring={_UBUNTU_KEYRING}"]
    sources = temp / "sources.list"
    sources.write_text("deb http://deb.debian.org/debian bookworm-backports main\n")
    lists = temp / "lists"
    (lists / "partial").mkdir(parents=True)
    options = [
        f"-oDir::Etc::SourceList={sources}",
        "-oDir::Etc::SourceParts=/dev/null",
        f"-oDir::State::Lists={lists}",
        f"-oDir::Cache::archives={temp}",
    ]
    update = subprocess.run(["apt-get", *options, "update"], capture_output=True, text=True, check=False)
    download = subprocess.run(
        ["apt-get", *options, "download", "ubuntu-keyring"], capture_output=True, text=True, check=False, cwd=temp
    )
    debs = sorted(temp.glob("ubuntu-keyring_*.deb"))
    if update.returncode != 0 or download.returncode != 0 or not debs:
        why = _tail(update.stderr + download.stderr)
        raise ImageBuildError(f"cannot get Ubuntu's archive keyring (ubuntu-keyring):\n{why}")
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(temp / "keyring")], check=True)
    return [f"--keyring={temp / 'keyring' / _UBUNTU_KEYRING.relative_to('/')}"]


def _build_env() -> dict[str, str]:
    """buildah's environment: this one without the variables that would send it elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BUILDAH_", "CONTAINERS_", "REGISTRY_AUTH"))}
    env.setdefault("PATH", _DEFAULT_PATH)
    return env


def _make_workdir(rootfs: Path, workdir: str) -> None:
    """The image's ``WORKDIR``, made as Docker does when the build did not, never following a link of the
    image's (this runs as the host's root: a link is left for the trial to follow, in its own tree)."""
    folder = rootfs
    for part in Path(workdir).parts[1:]:
        folder = folder / part
        if os.path.islink(folder):
            return
        if not folder.exists():
            folder.mkdir(mode=0o755)


def _shift_owner(rootfs: Path, base: int) -> None:
    """Every file's owner and group moved up by ``base`` (root → the sandbox's root), set-id bits kept."""
    for folder, dirs, files in os.walk(rootfs):
        for name in [*dirs, *files, None]:
            path = folder if name is None else os.path.join(folder, name)
            info = os.lstat(path)
            if info.st_uid >= base:  # already shifted: a folder is met as its parent's entry and as itself
                continue
            os.lchown(path, info.st_uid + base, info.st_gid + base)
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & (stat.S_ISUID | stat.S_ISGID):
                os.chmod(path, stat.S_IMODE(info.st_mode))  # chown clears set-user-id and set-group-id


class ImageBuilds:
    """The images of a run's tasks: each built (or found in the cache) once per run, whatever the
    number of rows naming its task; concurrent builds of one key across runs wait on its lock.

    A failed build is remembered for the run: every row of that task fails with the same message,
    and the run goes on with the other tasks.
    """

    def __init__(self, cache: ImageCache, progress: Progress | None = None) -> None:
        self.cache = cache
        self._progress = progress
        self._builds: dict[Path, asyncio.Future[TaskImage]] = {}

    async def image(self, environment_dir: Path) -> TaskImage:
        """:raises ImageBuildError: the task's image cannot be built (the same error for each of its rows)."""
        folder = Path(environment_dir)  # the backend's, already absolute
        build = self._builds.get(folder)
        if build is None:
            build = asyncio.ensure_future(asyncio.to_thread(self.cache.build, folder, progress=self._progress))
            self._builds[folder] = build
        return await asyncio.shield(build)
