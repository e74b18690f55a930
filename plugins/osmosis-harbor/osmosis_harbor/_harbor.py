"""The one place that prepares the process for importing Harbor (and litellm, which Harbor pulls in).

Harbor sends PostHog telemetry unless ``HARBOR_TELEMETRY`` is off, and litellm fetches its model
cost map from GitHub (retrying for 7-20 s offline) unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set.
Both are set here when the user has not set them; every module that imports Harbor calls
:func:`prepare_harbor_import` first. The plugin's entry module never imports Harbor.
"""

from __future__ import annotations

import os

__all__ = ["HARBOR_ENV_DEFAULTS", "prepare_harbor_import"]

HARBOR_ENV_DEFAULTS = {"HARBOR_TELEMETRY": "0", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def prepare_harbor_import() -> None:
    """Set Harbor's and litellm's offline switches in ``os.environ`` unless already set."""
    for key, value in HARBOR_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
