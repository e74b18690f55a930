"""The record codecs that 0.1 exported from ``osmosis_harbor.wire`` still work, with a warning."""

from __future__ import annotations

import warnings

import pytest

import osmosis_core
import osmosis_core.wire
import osmosis_harbor.wire


@pytest.mark.parametrize(
    "name", ["policy_to_json", "result_to_json", "result_from_json", "sample_to_json", "sample_from_json"]
)
def test_moved_codecs_warn_and_are_the_core_ones(name: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(osmosis_harbor.wire, name)
    assert value is getattr(osmosis_core.wire, name)
    assert [w.category for w in caught] == [osmosis_core.OsmosisDeprecationWarning]
    assert f"osmosis_harbor.wire.{name} is deprecated" in str(caught[0].message)
