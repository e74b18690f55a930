"""What a trial on a task's own image costs: per trial against today's host-tools trial; builds cold and cached.

Per trial (the same in both, in one run, alternating): set the trial up, run its first command
(``bash -c true``), run the osmosis interpreter once (``python -c 'import osmosis_core'``), tear it down.

* ``host``: the bubblewrap sandbox on this machine's tools (``osmosis_harbor.bwrap.Sandbox``: a
  private root folder, one fresh sandbox per command);
* ``image``: the task image (``osmosis_harbor.image_sandbox.ImageSandbox``: the overlay, the trial's
  sandbox living for the trial, each command entered into it; osmosis's runtime through its loader).

Then builds (``osmosis_harbor.images.ImageCache``): a task's Dockerfile (``apt-get install units``
on ``debian:bookworm``) into a new cache (cold: the base made by mmdebstrap, then the build and the
export), once more (cached: the key and a lookup), and into the same cache with the base kept (the
build alone, ``--layers`` cache emptied by a Dockerfile change).

    python bench/harbor_image_overhead.py [--trials 20] [--no-cold]

Needs root, bubblewrap, buildah and mmdebstrap (``apt-get install -y bubblewrap buildah mmdebstrap``) and
Debian's package archive. The research measured 40-55 s a trial for Harbor's own podman environment here.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from osmosis_harbor.bwrap import Sandbox, python_paths, sandbox_id_base
from osmosis_harbor.image_sandbox import ImageSandbox
from osmosis_harbor.images import ImageCache
from osmosis_harbor.runtime import RUNTIME_PYTHON, relocated, runtime_for

IMPORT = "import sys; sys.path[:0] = [{}]; import osmosis_core".format(
    ",".join(repr(relocated(p)) for p in python_paths(import_path=True))
)
"""What the trial's runner does first: its import path (this Python's, below /.osmosis/py), then osmosis."""
DOCKERFILE = (
    "FROM debian:bookworm\nRUN apt-get update && apt-get install -y --no-install-recommends units\nWORKDIR /app\n"
)


async def host_trial(folder: Path) -> tuple[float, float, float]:
    started = time.perf_counter()
    sandbox = Sandbox(folder, expose=python_paths())
    sandbox.prepare(["/app"])
    await sandbox.run("true", cwd="/app")
    first = time.perf_counter() - started
    done = await sandbox.run("python -c 'import osmosis_core'", cwd="/app")
    assert done.return_code == 0, done.stderr
    python = time.perf_counter() - started - first
    await sandbox.close()
    shutil.rmtree(folder, ignore_errors=True)
    return first, python, time.perf_counter() - started


async def image_trial(image, runtime, folder: Path) -> tuple[float, float, float]:
    started = time.perf_counter()
    sandbox = ImageSandbox(image, folder, runtime, runtime_paths=python_paths())
    await sandbox.start()
    await sandbox.run("true")
    first = time.perf_counter() - started
    done = await sandbox.run(f'{RUNTIME_PYTHON} -I -c "{IMPORT}"')  # as the trial's runner starts
    assert done.return_code == 0, done.stderr
    python = time.perf_counter() - started - first
    await sandbox.close()
    shutil.rmtree(folder, ignore_errors=True)
    return first, python, time.perf_counter() - started


def timed(label: str, call) -> object:
    started = time.perf_counter()
    result = call()
    print(f"  {label:<44} {time.perf_counter() - started:8.2f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--no-cold", action="store_true", help="skip the cold build (a base made from scratch)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="osmosis-image-bench-"))
    try:
        task = work / "task"
        task.mkdir()
        (task / "Dockerfile").write_text(DOCKERFILE)
        cache = ImageCache(work / "cache", id_base=sandbox_id_base())
        print("builds:")
        if not args.no_cold:
            timed("cold (base by mmdebstrap, build, export)", lambda: cache.build(task))
        image = timed("cached (key and lookup)" if not args.no_cold else "first build", lambda: cache.build(task))
        (task / "Dockerfile").write_text(DOCKERFILE + "ENV CHANGED=1\n")
        timed("Dockerfile changed (base kept, layers reused)", lambda: cache.build(task))
        (task / "Dockerfile").write_text(DOCKERFILE.replace("units", "units bc"))
        timed("apt step changed (base kept, build again)", lambda: cache.build(task))
        runtime = timed("osmosis runtime (once per interpreter)", lambda: runtime_for(cache.root))

        async def trials() -> dict[str, list[tuple[float, float, float]]]:
            out: dict[str, list[tuple[float, float, float]]] = {"host": [], "image": []}
            await host_trial(work / "warm-host")
            await image_trial(image, runtime, work / "warm-image")
            for number in range(args.trials):
                out["host"].append(await host_trial(work / f"host-{number}"))
                out["image"].append(await image_trial(image, runtime, work / f"image-{number}"))
            return out

        found = asyncio.run(trials())
        print(f"\nper trial ({args.trials} each, alternating; medians):")
        print(f"  {'':<8} {'setup + first command':>22} {'+ python import':>16} {'whole trial':>12}")
        medians = {}
        for kind, rows in found.items():
            first, python, whole = (statistics.median(r[i] for r in rows) * 1000 for i in range(3))
            medians[kind] = (first, python, whole)
            print(f"  {kind:<8} {first:19.1f} ms {python:13.1f} ms {whole:9.1f} ms")
        ratio = medians["image"][2] / medians["host"][2]
        print(f"\nimage / host, whole trial: {ratio:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
