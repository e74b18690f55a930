"""`osmosis report` on a large run: render time, file size, and how soon the page is usable.

Writes a synthetic run folder of 20,000 rollouts (5,000 rows x 4 samples; multi-turn tool-calling
samples of 4 to 12 messages; errors of every category; grader metrics; a stall in the middle),
renders its report, and opens it in headless Chromium (when installed) to time the page until its
script has drawn the row table.

    python bench/report.py [--rows 5000] [--samples 4] [--keep DIR]

Targets (issue 19): render under 10 s, file under 25 MB, page usable within 3 s.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

CATEGORIES = ["policy_error", "timeout", "agent_error", "validation_error", "infra_error"]
WORDS = "the model considers the request then calls the tool with both operands and checks the product".split(" ")  # noqa: SIM905


def sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_run(folder: Path, rows: int, samples: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    dataset = folder / "dataset.jsonl"
    system = "You are a careful calculator. Use the multiply tool, then answer on the last line as: #### <number>"
    prompts = []
    with dataset.open("w") as handle:
        for _ in range(rows):
            a, b = rng.randint(10, 9999), rng.randint(10, 9999)
            prompts.append((a, b))
            handle.write(
                json.dumps(
                    {"system_prompt": system, "user_prompt": f"val1 = {a}\nval2 = {b}", "ground_truth": str(a * b)}
                )
                + "\n"
            )
    import hashlib

    digest = hashlib.sha256(dataset.read_bytes()).hexdigest()
    meta = {
        "osmosis_core": "0.1.0",
        "config": "configs/eval/bench.toml",
        "dataset": str(dataset),
        "dataset_sha256": digest,
        "rows": rows,
        "n_samples": samples,
        "stub_policy": False,
        "started": "2026-12-01T10:00:00+00:00",
    }
    (folder / "run.json").write_text(json.dumps(meta, indent=2))
    (folder / "config.toml").write_text(
        '[policy]\nmodel = "Qwen/Qwen3-8B"\n\n[run]\nbackend = "local"\npass_threshold = 1.0\n'
    )
    t0 = 1_764_000_000.0
    clock = t0
    lines = 0
    with (folder / "results.jsonl").open("w") as out, (folder / "traces.jsonl").open("w") as traces:
        for i, (a, b) in enumerate(prompts):
            hard = rng.random() < 0.15
            for s in range(samples):
                clock += rng.expovariate(40.0) + (90.0 if lines == rows * samples // 2 else 0.0)  # a 90 s stall
                rollout_id = f"bench-{i}-{s}"
                messages = [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"val1 = {a}\nval2 = {b}"},
                ]
                for turn in range(rng.randint(1, 5)):
                    call = f"call_{i}_{s}_{turn}"
                    messages.append(
                        {
                            "role": "assistant",
                            "content": sentence(rng, rng.randint(10, 60)),
                            "tool_calls": [
                                {
                                    "id": call,
                                    "type": "function",
                                    "function": {"name": "multiply", "arguments": json.dumps({"a": a, "b": b})},
                                }
                            ],
                        }
                    )
                    messages.append({"role": "tool", "tool_call_id": call, "content": str(a * b)})
                right = rng.random() > (0.7 if hard else 0.1)
                answer = a * b if right else a * b + rng.randint(1, 99)
                messages.append({"role": "assistant", "content": f"{sentence(rng, 20)}\n#### {answer}"})
                failed = rng.random() < 0.04
                category = rng.choice(CATEGORIES) if failed else None
                line = {
                    "row": i,
                    "sample_index": s,
                    "rollout_id": rollout_id,
                    "status": "failure" if failed else "success",
                    "stage": "workflow" if failed else "grader",
                    "error": {"category": category, "message": f"{category}: answered 503 (at main.py:81 in run)"}
                    if failed
                    else None,
                    "reward": None if failed else float(right),
                    "metrics": {}
                    if failed
                    else {
                        "extracted": str(answer),
                        "reason": "match" if right else "wrong",
                        "turns": len(messages) // 2,
                    },
                    "timings": {"queued": rng.random() * 0.1, "workflow": rng.lognormvariate(0.5, 0.6), "grader": 0.01},
                    "finished_at": round(clock, 3),
                    "sample": None if failed else {"messages": messages, "system_prompt": None, "chat_messages": None},
                }
                out.write(json.dumps(line) + "\n")
                calls = [
                    {
                        "prompt_token_ids": list(range(rng.randint(60, 200))),
                        "completion_token_ids": list(range(rng.randint(10, 60))),
                    }
                    for _ in range((len(messages) - 2) // 2)
                ]
                traces.write(json.dumps({"rollout_id": rollout_id, "complete": True, "calls": calls}) + "\n")
                lines += 1
    return lines


def page_ready_seconds(page: Path, tries: int = 3) -> list[float] | None:
    """Seconds from navigation to the row table drawn, in headless Chromium, per try (None: not installed)."""
    chromium = shutil.which("chromium") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        return None
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.binary_location = chromium
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        times = []
        for _ in range(tries):
            driver.get(page.resolve().as_uri())  # returns once the load event has fired
            while driver.execute_script("return document.body.dataset.ready") != "1":
                time.sleep(0.02)
            times.append(driver.execute_script("return performance.now()") / 1000)
        # and a trajectory opens (its chunk unpacked) promptly
        start = time.perf_counter()
        driver.execute_script("document.querySelector('#row-table a.chip').click()")
        while not driver.execute_script("return document.querySelector('#viewer-body .msg')"):
            time.sleep(0.02)
        print(f"open a trajectory (unpack its chunk, draw it): {time.perf_counter() - start:.2f} s")
        return times
    finally:
        driver.quit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--keep", type=Path, help="write the run folder here and keep it")
    args = parser.parse_args()
    from osmosis_report.render import build_report

    root = args.keep or Path(tempfile.mkdtemp(prefix="osmosis-report-bench-"))
    folder = root / "bench-run"
    shutil.rmtree(folder, ignore_errors=True)
    started = time.perf_counter()
    n = write_run(folder, args.rows, args.samples)
    size = (folder / "results.jsonl").stat().st_size
    took = time.perf_counter() - started
    print(f"synthetic run: {n:,} rollouts, results.jsonl {size / 2**20:.0f} MB ({took:.0f} s to write)")
    cpu = time.process_time()
    built = build_report([folder], folder / "report.html")
    cpu = time.process_time() - cpu
    print(f"render: {built.seconds:.2f} s wall, {cpu:.2f} s CPU (target < 10 s)")
    mb = built.bytes / 2**20
    print(f"file: {mb:.1f} MB (target < 25 MB); trajectories in it: {built.embedded:,} of {built.rollouts:,}")
    ready = page_ready_seconds(built.path)
    if ready is None:
        print("page ready: not measured (no chromium and chromedriver)")
    else:
        shown = ", ".join(f"{t:.2f}" for t in ready)
        print(f"page ready (navigation to the row table drawn): best {min(ready):.2f} s of {shown} (target < 3 s)")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
