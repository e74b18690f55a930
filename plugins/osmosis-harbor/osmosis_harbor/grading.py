"""Grading one finished sample exactly as the ``local`` backend grades it (used in and out of trials).

The grader stage runs through the core's :func:`~osmosis_core.lifecycle.run_grader`, what the
``local`` backend runs, so a missing label, a grader that sets no reward, a timeout or an
exception end the same way (and in the same category) as on the ``local`` backend. A reward the
agent put on its own sample is discarded first: only the grader sets it.
"""

from __future__ import annotations

import copy
from typing import Any

from osmosis_core import ExecutionRequest, ExecutionResult, Grader, GraderConfig, RolloutSample
from osmosis_core.plugin import run_grader

__all__ = ["grade_sample"]


async def grade_sample(
    grader: type[Grader[Any]],
    grader_config: GraderConfig | None,
    sample: RolloutSample,
    request: ExecutionRequest,
) -> ExecutionResult:
    """The grader stage's result for ``sample`` (a copy: the caller's sample is not changed).

    >>> import anyio
    >>> from osmosis_core import ExecutionRequest, Grader, PolicyEndpoint, RolloutSample
    >>> class Half(Grader):
    ...     async def grade(self, ctx):
    ...         return 0.5
    >>> req = ExecutionRequest("r1", [], PolicyEndpoint("http://127.0.0.1:1/v1", "m"), label="x")
    >>> anyio.run(grade_sample, Half, None, RolloutSample(reward=1.0), req).reward
    0.5
    """
    sample = copy.copy(sample)
    sample.metrics = dict(sample.metrics)
    sample.reward = None

    # the backend decided this rollout is graded: a row without a label is the grader's validation_error here
    return await run_grader(grader, grader_config, request, sample)
