"""Deprecated public names: each keeps working, with a warning, for one release after it is
replaced, and is named in ``CHANGELOG.md``; then it goes.

A public name is a promise: a plugin written against the last release's documented API must keep
loading. When a name moves or is replaced, the module that held it keeps a ``__getattr__`` that
hands out the new object with an :class:`OsmosisDeprecationWarning` (a ``DeprecationWarning``,
which the ``osmosis`` CLI shows once per place)::

    # my_package/old_module.py
    from osmosis_core.deprecation import moved_names

    __getattr__ = moved_names(__name__, {"old_name": ("my_package.new_module:new_name", "0.2.0")})

A name that moved to another distribution names it third (see :func:`moved_names`).

>>> import warnings
>>> getattr_ = moved_names("pkg.old", {"dumps": ("json:dumps", "0.2.0")})
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     getattr_("dumps")([1])
'[1]'
>>> str(caught[0].message)
'pkg.old.dumps is deprecated since osmosis 0.2.0 and will be removed in the next release: use json.dumps'
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["OsmosisDeprecationWarning", "moved_module", "moved_names", "warn_deprecated"]


class OsmosisDeprecationWarning(DeprecationWarning):
    """A public osmosis name that still works and will be removed in the next release."""


def warn_deprecated(old: str, new: str, since: str, *, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (both as the user writes them)."""
    warnings.warn(
        f"{old} is deprecated since osmosis {since} and will be removed in the next release: use {new}",
        OsmosisDeprecationWarning,
        stacklevel=stacklevel,
    )


def moved_names(
    module: str,
    moved: Mapping[str, tuple[str, str] | tuple[str, str, str]],
    *,
    fallback: Callable[[str], Any] | None = None,
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for names that moved: ``{old: ("new.module:name", since)}``,
    or ``{old: ("new.module:name", since, "distribution")}`` for a name now in another distribution.

    Each access warns and returns the object at its new home (nothing is copied, so the old and
    the new name are the same object). When the new home is in another distribution, the warning
    says ``pip install <distribution>``, and so does the ImportError when it is not installed.
    Any other name goes to ``fallback`` (a package's own lazy ``__getattr__``, as
    ``lazy_loader.attach`` returns it), or is an AttributeError.
    """

    def __getattr__(name: str) -> Any:
        try:
            target, since, *distribution = moved[name]
        except KeyError:
            if fallback is not None:
                return fallback(name)
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        new_module, _, attribute = target.partition(":")
        install = f" (pip install {distribution[0]})" if distribution else ""
        warn_deprecated(f"{module}.{name}", f"{new_module}.{attribute}{install}", since)
        try:
            value: Any = importlib.import_module(new_module)
        except ImportError as exc:
            if not distribution:
                raise
            raise ImportError(
                f"{module}.{name} moved to the {distribution[0]} distribution: pip install {distribution[0]}"
            ) from exc
        for part in attribute.split("."):
            value = getattr(value, part)
        return value

    return __getattr__


PUBLIC_MODULES = (
    "osmosis_core",
    "osmosis_core.plugin",
    "osmosis_core.http",
    "osmosis_core.wire",
    "osmosis_core.sampling",
    "osmosis_core.templates",
    "osmosis_core.frontend",
)


def moved_module(module: str, new: str, since: str, public: tuple[str, ...] = PUBLIC_MODULES) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` for a whole module that moved to ``new``.

    Each name ``new`` has warns and is handed out; the warning names the first module of ``public``
    that exports it, else its place in ``new``.
    """

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home = next((p for p in public if name in getattr(importlib.import_module(p), "__all__", ())), new)
        try:
            value = getattr(importlib.import_module(home), name)
        except AttributeError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        warn_deprecated(f"{module}.{name}", f"{home}.{name}", since)
        return value

    return __getattr__
