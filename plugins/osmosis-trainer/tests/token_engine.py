"""The scripted token-in engine of ``osmosis_core.testing``, as a process: a stand-in SGLang router.

Run by the Python that runs ``osmosis serve`` (the trainer side has no osmosis-core)::

    python token_engine.py --tokenizer FOLDER [--finish stop|length]

Writes a test tokenizer folder to ``FOLDER`` (``write_test_tokenizer``: a byte-level BPE with a
ChatML template and Hermes tool calls, the policy's tokenizer for ``[traces] tokenizer``), then
serves SGLang's ``/generate`` (and vLLM's token-id routes) answering with the calculator's text as
ids, each ended with ``<|im_end|>``. Prints ``listening on URL`` and serves until its standard input
ends (the test closes it, or died).
"""

from __future__ import annotations

import argparse
import sys

from osmosis_core.testing.token_engine import ScriptedTokenEngine, write_test_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True, help="the folder the tokenizer is written to")
    parser.add_argument("--finish", default="stop", choices=("stop", "length"))
    args = parser.parse_args()
    folder = write_test_tokenizer(args.tokenizer)
    engine = ScriptedTokenEngine(folder, finish=args.finish).start()
    print(f"listening on {engine.url}", flush=True)
    try:
        sys.stdin.read()
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
