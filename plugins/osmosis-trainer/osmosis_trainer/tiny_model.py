"""A tiny causal LM and its tokenizer, built offline in a few seconds: what a training setup is
smoke-tested with on a laptop (and what osmosis's CPU training test learns with).

Nothing is downloaded from a model hub. :func:`char_tokenizer` is a character-level tokenizer (one
token per printable ASCII character, plus six special tokens) with a chat template that has
assistant, tool-call and tool turns; :func:`tiny_model` is a randomly initialised Qwen2 (hidden
128, 4 layers: about 1.05M parameters) over it.

Character-level on purpose: a trainer trains on the token ids the inference server generated, and
a multi-turn rollout's next prompt holds the earlier answer *re-encoded from its text*. A byte-level
BPE re-encodes a random model's output to other ids (measured: every 2-turn rollout broke its token
prefix, 48 of 48); one token per character re-encodes to the same ids (0 breaks in 1,280 calls), as
long as the text stays ASCII (any other character becomes ``<|unk|>``).

The chat template (ChatML-like, append-only: each turn is rendered the same way whatever follows)::

    <|im_start|>system\\ntools: lookup<|im_end|>\\n          (only when tools are given: their names)
    <|im_start|>user\\nWhich letter?<|im_end|>\\n
    <|im_start|>assistant\\nok<tool_call>box 3<|im_end|>\\n   (content, then each call's arguments)
    <|im_start|>tool\\nz<|im_end|>\\n
    <|im_start|>assistant\\n                                  (the generation prompt)

A tool call is the special token ``<tool_call>`` followed by its arguments, up to the end of the
turn (one call a turn): one token for a random model to learn to emit, and any text the model
generates parses into content and a call that render back to the same tokens
(:func:`osmosis_trainer.live_policy.parse_tiny_tool_calls`; a call names no function: it goes to the
request's first tool).

Needs ``torch``, ``transformers`` and ``tokenizers`` (``pip install osmosis-trainer[live-policy]``),
imported when a function is called, not by importing this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "CHARACTERS",
    "END_TOKEN",
    "SPECIAL_TOKENS",
    "TINY_CHAT_TEMPLATE",
    "TOOL_CALL_TOKEN",
    "char_tokenizer",
    "tiny_model",
]

END_TOKEN: Final = "<|im_end|>"
"""Ends every turn: the tokenizer's end-of-sequence token, where generation stops."""
TOOL_CALL_TOKEN: Final = "<tool_call>"
"""Starts a tool call's arguments in an assistant turn."""
SPECIAL_TOKENS: Final = ("<|pad|>", "<|unk|>", "<|im_start|>", END_TOKEN, TOOL_CALL_TOKEN, "<|endoftext|>")
"""Ids 0 to 5, each one token however it is written in a text."""
CHARACTERS: Final = "".join(chr(c) for c in range(32, 127)) + "\n\t"
"""The characters with a token of their own (printable ASCII, newline and tab): ids 6 on."""

TINY_CHAT_TEMPLATE: Final = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\ntools:' -}}"
    "{%- for tool in tools -%}{{- ' ' + (tool.function.name if tool.function is defined else tool.name) -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' -}}"
    "{%- if message.content is string -%}{{- message.content -}}"
    "{%- elif message.content -%}"
    "{%- for part in message.content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set arguments = call.function.arguments if call.function is defined else call.arguments -%}"
    "{{- '<tool_call>' + (arguments if arguments is string else arguments | tojson) -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""The Jinja chat template of :func:`char_tokenizer` (see the module docstring). Every literal is
written inside ``{{ }}``: transformers compiles templates with ``trim_blocks``, which would eat a
newline written after a block tag."""


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer with :data:`TINY_CHAT_TEMPLATE` (built in about a millisecond).

    >>> tokenizer = char_tokenizer()  # doctest: +SKIP
    >>> tokenizer.decode(tokenizer.encode("hi<tool_call>x"))  # doctest: +SKIP
    'hi<tool_call>x'
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one piece per character
    backend.decoder = decoders.Fuse()  # pieces joined with nothing between them
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|pad|>",
        unk_token="<|unk|>",
        eos_token=END_TOKEN,
        bos_token="<|endoftext|>",
        model_max_length=1024,
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.add_bos_token = False
    return tokenizer


def tiny_model(
    tokenizer: Any,
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int = 512,
    max_positions: int = 1024,
    seed: int | None = 0,
) -> PreTrainedModel:
    """A randomly initialised ``Qwen2ForCausalLM`` for ``tokenizer`` (float32, no dropout, on the CPU).

    The defaults give 1.05M parameters (embeddings tied to the output layer), built in a second or
    two; ``seed`` makes the initial weights the same on every run (None: torch's current state).
    """
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    if seed is None:
        model = Qwen2ForCausalLM(config)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
