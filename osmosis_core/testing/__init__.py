"""Test tools for rollout and plugin authors: a scripted OpenAI-compatible policy server that speaks
real HTTP on 127.0.0.1, rule-based scripts for it, and helpers that run one rollout end to end.

The server is a stand-in for a model (these machines have none), never a fake of osmosis itself.
"""

from osmosis_core.lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__)
