"""What redacting secrets costs per ``results.jsonl`` line (``ResultWriter.write``).

Every line is checked for each secret and for every run of 8 of its characters (issue 16.5): one
``str.find`` per 4-character block of a secret taken every 5 characters, over the encoded line.
Lines that hold nothing (the usual case) are written as encoded; a line that holds something has
every string redacted.

    python bench/results_redaction.py [--lines 2000]

Prints microseconds per line for lines of about 2 KB, 20 KB and 200 KB of sample messages: written
with no secrets configured, with an OpenAI-length key (164 characters) and a header value (28),
and the same with a masked key echoed in the line's error message.
"""

from __future__ import annotations

import argparse
import random
import string
import tempfile
import time
from pathlib import Path

from osmosis_core._engine.results import ResultWriter
from osmosis_core.errors import holds_secret

WORDS = [
    "the",
    "product",
    "of",
    "six",
    "and",
    "seven",
    "is",
    "forty",
    "two",
    "use",
    "the",
    "multiply",
    "tool",
    "then",
    "answer",
    "on",
    "the",
    "last",
    "line",
]


def line(rng: random.Random, size: int, error: str | None = None) -> dict:
    messages = []
    total = 0
    while total < size:
        content = " ".join(rng.choice(WORDS) for _ in range(40))
        messages.append({"role": "user", "content": content})
        total += len(content)
    doc: dict = {"row": 1, "sample_index": 0, "status": "success", "sample": {"messages": messages}}
    if error is not None:
        doc["error"] = {"category": "policy_error", "message": error}
    return doc


def per_line(path: Path, secrets: tuple[str, ...], docs: list[dict]) -> float:
    writer = ResultWriter(path, secrets)
    started = time.process_time()
    for doc in docs:
        writer.write(doc)
    spent = time.process_time() - started
    writer.close()
    path.unlink()
    return spent / len(docs) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(1)
    key = "sk-proj-" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(156))
    header = "org-" + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(24))
    echo = f"Incorrect API key provided: {key[:16]}{'*' * 20}{key[-4:]}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "results.jsonl"
        for size in (2_000, 20_000, 200_000):
            n = max(20, args.lines * 2_000 // size)
            plain = [line(rng, size) for _ in range(n)]
            echoed = [line(rng, size, echo) for _ in range(n)]
            none = per_line(path, (), plain)
            clean = per_line(path, (key, header), plain)
            dirty = per_line(path, (key, header), echoed)
            assert holds_secret(echo, (key,))
            print(
                f"  ~{size // 1000:>3} KB line: {none:7.1f} us with no secrets, {clean:7.1f} us with a key and a "
                f"header (+{clean - none:.1f}), {dirty:7.1f} us when the line holds a masked key"
            )


if __name__ == "__main__":
    main()
