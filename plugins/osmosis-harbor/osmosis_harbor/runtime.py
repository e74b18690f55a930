"""osmosis's own runtime inside a task image: this Python, whatever the image has, touching none of it.

A task image may have no Python, or one too old for osmosis. The trial gets this interpreter
instead, read-only: its prefix, standard library and site-packages below :data:`RUNTIME_PY` at
their own paths (never over the image's own folders), and at :data:`RUNTIME_DIR` a folder with the
dynamic loader and every shared library that the interpreter and its extension modules load (found
with ``ldd`` on the host, copied once into the image cache). The interpreter runs through that
loader with ``--library-path``, so the image's own libraries never mix with the host's, and nothing
the interpreter starts (the agent's tools, the image's programs) inherits the folder: it is on no
variable. ``env`` (coreutils) comes the same way: a command entering the trial uses it for its
folder and the loader's variables, whatever the image has.

>>> RUNTIME_DIR, RUNTIME_PYTHON, relocated("/usr/lib/python3.12")
('/.osmosis', '/.osmosis/bin/python', '/.osmosis/py/usr/lib/python3.12')
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from osmosis_harbor.bwrap import python_paths

__all__ = ["RUNTIME_DIR", "RUNTIME_PY", "RUNTIME_PYTHON", "Runtime", "relocated", "runtime_for"]

RUNTIME_DIR = "/.osmosis"
"""Where the runtime's loader, libraries and tools are shown in a trial (read-only)."""
RUNTIME_PY = f"{RUNTIME_DIR}/py"
"""Where this Python's folders are shown in a trial: below it, at their own paths (``/.osmosis/py/usr/lib/...``),
so they never hide the image's own (its ``/usr/local``, its ``/usr/lib/python3``)."""
RUNTIME_PYTHON = f"{RUNTIME_DIR}/bin/python"
"""The interpreter a trial on a task image runs osmosis with (a ``/bin/sh`` script into the loader)."""
_TOOLS = ("env",)
_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)")


def relocated(path: str | Path) -> str:
    """Where the host path ``path`` of this Python's is shown in a trial (below :data:`RUNTIME_PY`)."""
    return f"{RUNTIME_PY}{Path(path).absolute()}"


def _interpreter() -> str:
    """This Python's own binary (a virtualenv's ``python`` is a link to it), where a trial sees it."""
    return relocated(os.path.realpath(sys.executable))


class Runtime:
    """A runtime folder on the host (``lib/``, ``bin/``) and how to run its programs inside a trial."""

    def __init__(self, folder: Path, loader: str) -> None:
        self.folder = folder
        self.loader = loader
        """The loader's file name in ``lib/`` (``ld-linux-x86-64.so.2``)."""

    def python(self) -> list[str]:
        """The command line that runs this Python inside a trial, through the runtime's loader."""
        return self._through_loader(_interpreter())

    def command(self, tool: str) -> list[str]:
        """The command line that runs one of the runtime's tools inside a trial."""
        return self._through_loader(f"{RUNTIME_DIR}/bin/{tool}")

    def _through_loader(self, program: str) -> list[str]:
        lib = f"{RUNTIME_DIR}/lib"
        return [f"{lib}/{self.loader}", "--library-path", lib, program]


def _ldd(paths: Iterable[Path]) -> dict[str, Path]:
    """The shared libraries that the ELF files ``paths`` load (the loader too), by the name they are asked for."""
    found: dict[str, Path] = {}
    batch = [str(p) for p in paths]
    for start in range(0, len(batch), 200):
        proc = subprocess.run(["ldd", *batch[start : start + 200]], capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            match = _LDD_LINE.match(line)
            if match:
                name = Path(match.group(1) or match.group(2)).name
                found[name] = Path(os.path.realpath(match.group(2)))
    return found


def _extension_modules() -> list[Path]:
    """This interpreter's binary and every compiled module it can import."""
    found = [Path(os.path.realpath(sys.executable))]
    for root in python_paths():
        if root.is_dir():
            for folder, _, files in os.walk(root):
                found.extend(Path(folder, name) for name in files if name.endswith(".so") or ".so." in name)
    return found


@functools.cache
def runtime_for(cache_root: Path) -> Runtime:
    """The runtime of this interpreter, made once in ``cache_root/runtime/<digest>``.

    :raises RuntimeError: no dynamic loader was found (``ldd`` missing, a static interpreter).
    """
    modules = _extension_modules()
    absent = [name for name in _TOOLS if shutil.which(name) is None]
    if absent:
        raise RuntimeError(
            f"{', '.join(absent)} not found: a trial on a task image sets each command's folder and "
            "loader variables with it (`apt-get install -y coreutils`)"
        )
    tools = [Path(found) for name in _TOOLS if (found := shutil.which(name))]
    stamp = hashlib.sha256()
    for path in [*modules, *tools]:
        with contextlib.suppress(OSError):
            info = path.stat()
            stamp.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    folder = Path(cache_root) / "runtime" / stamp.hexdigest()[:24]
    loader_file = folder / "loader"
    if loader_file.is_file():
        return Runtime(folder, loader_file.read_text().strip())
    libraries = _ldd([*modules, *tools])
    loaders = sorted(name for name in libraries if name.startswith(("ld-linux", "ld64")))
    if not loaders:
        raise RuntimeError(f"cannot find the dynamic loader of {sys.executable} (is ldd installed?)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix="new-", dir=folder.parent))
    (temp / "lib").mkdir()
    (temp / "bin").mkdir()
    for name, library in libraries.items():
        shutil.copy2(library, temp / "lib" / name)
    for tool in tools:
        shutil.copy2(os.path.realpath(tool), temp / "bin" / tool.name)
    (temp / "bin" / "python").write_text(
        f'#!/bin/sh\nexec {RUNTIME_DIR}/lib/{loaders[0]} --library-path {RUNTIME_DIR}/lib {_interpreter()} "$@"\n'
    )
    os.chmod(temp / "bin" / "python", 0o755)
    (temp / "loader").write_text(loaders[0])
    os.chmod(temp, 0o755)
    try:
        os.rename(temp, folder)
    except OSError:  # another process made it first
        shutil.rmtree(temp, ignore_errors=True)
    return Runtime(folder, loaders[0])
