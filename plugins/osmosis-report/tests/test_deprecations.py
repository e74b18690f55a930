"""0.2's development name of a loaded rollout still works, with a warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import osmosis_core
import osmosis_report.load


def test_load_rollout_is_rollout_record_with_a_warning_naming_it():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = osmosis_report.load.Rollout
    assert value is osmosis_report.load.RolloutRecord
    assert [w.category for w in caught] == [osmosis_core.OsmosisDeprecationWarning]
    assert "osmosis_report.load.RolloutRecord" in str(caught[0].message)
    changelog = (Path(__file__).resolve().parents[3] / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "`osmosis_report.load.Rollout`" in changelog
