"""Train a model with TRL's GRPOTrainer on osmosis rollouts, and watch the reward rise (a line per step).

On a laptop (the default): a tiny model built here (about 1M parameters, random weights, a tokenizer
with one token per character; nothing is downloaded), served to the rollouts by a live policy
server that samples the very model object TRL trains, and the tiny-tools rollout
(``rollouts/tiny-tools``: call the ``lookup`` tool, then answer with the letters it returned) run by
``osmosis serve --traces``. The reward goes from about 0.02 to above 0.5 in 15 to 40 steps (one to
two seconds a step on a laptop CPU)::

    pip install "./plugins/osmosis-trainer[trl,live-policy]"           # the trainer's side: Python 3.10+
    pip install -e . ./plugins/osmosis-server ./plugins/osmosis-gateway  # osmosis serve: Python 3.12+
    python examples/train_trl.py                     # starts `osmosis serve` itself (--osmosis names it)

With a real model, TRL's vLLM server mode: vLLM samples the rollouts, TRL pushes the new weights to it
before each step, and the rollouts call its OpenAI endpoint through osmosis serve's gateway::

    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen3-0.6B --enable-auto-tool-choice --tool-call-parser hermes
    osmosis serve configs/training/multiply-plain.toml --traces --port 8100      # OSMOSIS_SERVER_TOKEN set
    CUDA_VISIBLE_DEVICES=1 python examples/train_trl.py --model Qwen/Qwen3-0.6B --vllm-server http://127.0.0.1:8000 \\
        --server http://127.0.0.1:8100 --dataset rollouts/multiply-plain/data/multiply.jsonl \\
        --max-tokens 1024 --max-completion-length 4096 --prompts 8 --generations 8

(``trl vllm-serve`` runs vLLM's own server, with the OpenAI routes, TRL's weight transfer and
``--logprobs-mode processed_logprobs``; the trailing flags go to ``vllm serve``: its tool-call parser
for the model's format.) The trainer and the rollout server may be on different machines: the
rollout server must reach the vLLM server's address (``--vllm-server``).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "training" / "tiny-tools.toml"
DATASET = ROOT / "rollouts" / "tiny-tools" / "data" / "letters.jsonl"


def start_osmosis_serve(osmosis: str, config: Path, folder: Path, token: str) -> tuple[subprocess.Popen[str], str]:
    """``osmosis serve CONFIG --traces`` on a free port (its log in ``folder/serve.log``); its URL."""
    log = (folder / "serve.log").open("w")
    # --watch-stdin: the server drains and stops when this script ends, however it ends (kill -9 too)
    args = ["serve", str(config), "--traces", "--port", "0", "--grace", "5", "--watch-stdin"]
    proc = subprocess.Popen(
        [osmosis, *args, "--output", str(folder / "run")],
        env={**os.environ, "OSMOSIS_SERVER_TOKEN": token},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its pipe drained
            return proc, match.group(1)
    raise SystemExit(f"osmosis serve did not start (exit {proc.wait()}); see {folder / 'serve.log'}")


def build_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The model TRL trains and its tokenizer: the tiny one built here, or ``--model`` from the Hub."""
    if args.model is None:
        from osmosis_trainer.tiny_model import char_tokenizer, tiny_model

        tokenizer = char_tokenizer()
        return tiny_model(tokenizer, seed=args.seed), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(args.model), AutoTokenizer.from_pretrained(args.model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a Hugging Face model to train (default: the tiny model, built here)")
    parser.add_argument("--vllm-server", help="TRL's vLLM server (trl vllm-serve) sampling --model's rollouts")
    parser.add_argument("--server", help="a running osmosis serve (default: start one here; OSMOSIS_SERVER_TOKEN)")
    parser.add_argument("--osmosis", default=shutil.which("osmosis"), help="the osmosis command that serves")
    parser.add_argument("--config", default=str(CONFIG), help="the run config the started server serves")
    parser.add_argument("--dataset", default=str(DATASET), help="the prompts (osmosis JSONL)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--lr", type=float, help="the learning rate (default 1e-2 for the tiny model, 1e-6 for --model)"
    )
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="rollouts per prompt (the GRPO group)")
    parser.add_argument("--max-completion-length", type=int, default=64, help="the whole rollout's tokens")
    parser.add_argument("--max-tokens", type=int, default=16, help="each model call's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="TRL's output folder (default: a temporary one)")
    args = parser.parse_args()
    if args.model and not args.vllm_server:
        parser.error("--model needs --vllm-server: a real model samples through TRL's vLLM server mode")

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from osmosis_trainer.live_policy import LivePolicyServer
    from osmosis_trainer.trl import OsmosisRollout, osmosis_reward, trl_rows

    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # masked rows are warned about
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL: known
    folder = Path(args.output or tempfile.mkdtemp(prefix="train-trl-"))
    folder.mkdir(parents=True, exist_ok=True)
    dataset = Dataset.from_list(trl_rows(args.dataset))
    model, tokenizer = build_model(args)
    if args.model is None:
        torch.set_num_threads(1)  # a tiny model: one thread is faster than two fighting osmosis serve for the CPU

    served = policy = None
    try:
        token = os.environ.get("OSMOSIS_SERVER_TOKEN")
        server_url = args.server
        if server_url is None:
            if not args.osmosis:
                parser.error("no `osmosis` command found: install osmosis-server, or pass --osmosis or --server")
            token = secrets.token_urlsafe(24)
            served, server_url = start_osmosis_serve(args.osmosis, Path(args.config), folder, token)
            print(f"rollouts: osmosis serve {args.config} --traces at {server_url} (run folder {folder / 'run'})")
        if args.vllm_server:
            policy_url = None  # TRL's vLLM server: OsmosisRollout reads it from the trainer's arguments
        else:
            policy = LivePolicyServer(model, tokenizer, tool_parser="tiny").start()
            policy_url = policy.url
            print(f"policy: the model TRL trains, served live at {policy_url}")
        rollout = OsmosisRollout(
            server_url, token=token, policy_url=policy_url, dataset=dataset, max_tokens=args.max_tokens
        )
        config = GRPOConfig(
            output_dir=str(folder / "trl"),
            max_steps=args.steps,
            learning_rate=args.lr or (1e-6 if args.model else 1e-2),
            lr_scheduler_type="constant",
            per_device_train_batch_size=args.prompts * args.generations,
            num_generations=args.generations,
            max_completion_length=args.max_completion_length,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
            use_cpu=not torch.cuda.is_available(),
            bf16=torch.cuda.is_available(),
            use_vllm=bool(args.vllm_server),
            vllm_mode="server",
            vllm_server_base_url=args.vllm_server,
        )
        started = time.monotonic()

        class EachStep(TrainerCallback):
            def on_log(
                self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **_: Any
            ) -> None:
                if logs and "reward" in logs:
                    masked = logs.get("osmosis/masked", 0.0)
                    print(
                        f"step {state.global_step:3d}  reward {logs['reward']:.3f}  masked {masked:.0%}  "
                        f"{time.monotonic() - started:5.1f}s",
                        flush=True,
                    )

        trainer = GRPOTrainer(
            model=model,
            processing_class=tokenizer,
            args=config,
            train_dataset=dataset,
            reward_funcs=[osmosis_reward],
            rollout_func=rollout,
            callbacks=[EachStep()],
        )
        trainer.train()
        stats = rollout.stats
        print(
            f"{stats.rollouts} rollouts, {stats.masked_rows} masked ({dict(stats.masked) or 'none'}), "
            f"{stats.incomplete_traces} incomplete traces, {stats.prefix_breaks} prefix breaks"
        )
    finally:
        if policy is not None:
            policy.stop()
        if served is not None:
            served.send_signal(signal.SIGTERM)
            served.wait(60)


if __name__ == "__main__":
    sys.exit(main())
