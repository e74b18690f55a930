"""``osmosis harbor``: build task images ahead of a run, and list or prune the image cache.

::

    osmosis harbor build tasks/*                      # each task's environment/Dockerfile, once (cached)
    osmosis harbor build tasks/py --base python:3.12-slim=py312.tar   # a base osmosis cannot make
    osmosis harbor cache                              # what is built: key, task, size, age
    osmosis harbor cache --prune                      # remove images whose Dockerfile or context changed
    osmosis harbor cache --prune --all                # remove everything (bases and build layers too)

A run builds what is missing by itself (``[backend.harbor.sandbox] image``); building first shows
the build logs' tails now, not in the run's results. Nothing here imports Harbor.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from osmosis_harbor.images import ImageBuildError, ImageCache, default_cache_dir, has_dockerfile

__all__ = ["harbor"]


def _cache(cache_dir: Path | None, bases: tuple[str, ...]) -> ImageCache:
    from osmosis_harbor.bwrap import sandbox_id_base

    given: dict[str, Path] = {}
    for item in bases:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"{item!r} is not NAME=PATH (python:3.12-slim=py312.tar)", param_hint="--base")
        given[name] = Path(path).absolute()
    return ImageCache(cache_dir or default_cache_dir(), given, sandbox_id_base())


def _environment(task: Path) -> Path:
    """A task folder's ``environment/`` (or the folder itself when it holds the Dockerfile)."""
    return task if has_dockerfile(task) else task / "environment"


@click.group(short_help="Build and list task images (no Docker).")
def harbor() -> None:
    """Harbor tasks in their own images, without Docker (osmosis-harbor)."""


@harbor.command(short_help="Build task images ahead of a run.")
@click.argument("tasks", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False, path_type=Path), help="The image cache folder.")
@click.option("--base", "bases", multiple=True, metavar="NAME=PATH", help="A base osmosis cannot make: rootfs/OCI tar.")
def build(tasks: tuple[Path, ...], cache_dir: Path | None, bases: tuple[str, ...]) -> None:
    """Build each task's environment/Dockerfile into the image cache (once: a cached one is reused)."""
    cache = _cache(cache_dir, bases)
    failed = 0
    for task in tasks:
        environment = _environment(task.absolute())
        if not has_dockerfile(environment):
            click.echo(f"{task}: no environment/Dockerfile (it runs on this machine's tools)")
            continue
        started = time.monotonic()
        try:
            image = cache.build(environment, progress=lambda m: click.echo(f"  {m}", err=True))
        except ImageBuildError as exc:
            failed += 1
            click.echo(f"{task}: FAILED\n{exc}", err=True)
            continue
        took = time.monotonic() - started
        click.echo(f"{task}: {image.key} ({took:.1f} s; workdir {image.workdir}, user {image.user or 'root'})")
    click.echo(f"cache: {cache.root}")
    if failed:
        sys.exit(1)


@harbor.command(short_help="List or prune the image cache.")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False, path_type=Path), help="The image cache folder.")
@click.option("--prune", is_flag=True, help="Remove images whose task folder is gone or no longer matches.")
@click.option("--all", "everything", is_flag=True, help="With --prune: remove every image, base and layer.")
def cache(cache_dir: Path | None, prune: bool, everything: bool) -> None:
    """List the built task images (or prune them)."""
    images = _cache(cache_dir, ())
    if prune:
        keep: set[str] = set()
        if not everything:
            for image in images.images():
                task = Path(image.task)
                if has_dockerfile(task):
                    try:
                        if images.key(task) == image.key:
                            keep.add(image.key)
                    except ImageBuildError:
                        pass
        removed = images.prune(keep=keep, everything=everything)
        click.echo(f"removed {len(removed)} image(s) from {images.root}")
        return
    found = images.images()
    click.echo(f"{images.root}: {len(found)} image(s)")
    now = time.time()
    for image in found:
        age = (now - image.built) / 3600
        size = image.size() / 2**20
        click.echo(f"  {image.key}  {size:7.1f} MiB  {age:6.1f} h ago  {image.task}")
