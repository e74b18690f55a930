"""500 rollouts at once through the real client, each with its own policy endpoint."""

from __future__ import annotations

from collections import Counter

from server_helpers import TOKEN, read_lines, run
from workflows import EndsWithLabel, OneCall

from osmosis_core import LocalBackend
from osmosis_server import RolloutStatus
from osmosis_trainer import RolloutClient, RolloutRequest


def test_500_concurrent_rollouts_each_on_its_own_policy_endpoint(serve, policy_server):
    served = serve(LocalBackend(OneCall, grader=EndsWithLabel, max_concurrent=64))
    base = policy_server.url.removesuffix("/v1")
    n = 500
    requests = []
    for i in range(n):
        a, b = 3 + i % 41, 7 + i % 13
        requests.append(
            RolloutRequest(
                rollout_id=f"e2e-{i}",
                initial_messages=[{"role": "user", "content": f"What is {a} times {b}?"}],
                # a per-rollout URL, as a trainer's gateway hands out
                chat_completions_url=f"{base}/rollouts/e2e-{i}/v1",
                llm_api_key=f"key-for-rollout-{i}",
                label=str(a * b),
                metadata={"a": a, "b": b},
                row=i // 4,
                sample_index=i % 4,
            )
        )

    async def go():
        client = RolloutClient(served.url, token=TOKEN)
        return [result async for result in client.run_many(requests, concurrency=n)]

    results = run(go)
    assert len(results) == n
    by_id = {r.rollout_id: r for r in results}
    assert set(by_id) == {f"e2e-{i}" for i in range(n)}
    for request in requests:
        result = by_id[request.rollout_id]
        assert result.status is RolloutStatus.SUCCESS, result
        assert result.reward == 1.0
        assert result.stage == "grader"
        messages = result.sample.messages
        assert messages[0] == request.initial_messages[0]
        assert messages[-1]["role"] == "assistant"
        assert messages[-1]["content"].rstrip().endswith(f"#### {request.label}")
        calls = policy_server.requests_for(request.rollout_id)  # attributed by the per-rollout URL
        assert len(calls) == 1
        assert calls[0].authorized
    lines = read_lines(served.service.folder.results_path)
    assert len(lines) == n
    assert Counter(line["status"] for line in lines) == {"success": n}
    assert {(line["row"], line["sample_index"]) for line in lines} == {(i // 4, i % 4) for i in range(n)}
    assert all(line["reward"] == 1.0 for line in lines)
    text = served.service.folder.results_path.read_text()
    assert "key-for-rollout-" not in text
    assert TOKEN not in text
