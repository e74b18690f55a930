"""Token-in upstreams: the gateway speaks OpenAI chat to the rollout and token ids to the engine.

It renders each call with the policy's own tokenizer and chat template (:mod:`.render`), each later
call of a rollout as the earlier call's ids plus its answer plus only the new messages
(:mod:`.conversation`), sends the ids to the engine's token route (:mod:`.engines`), and reads the
tool calls out of the generated text (:mod:`.parse`). Imported only when a token-in adapter is
configured (``tokenizers`` and ``jinja2`` stay off ``osmosis run``'s start-up otherwise).
"""

from osmosis_gateway.token_in.conversation import Conversation, Rendered
from osmosis_gateway.token_in.engines import ENGINES, EngineAnswer, EngineName
from osmosis_gateway.token_in.exchange import ContextFull, Reply, TokenIn
from osmosis_gateway.token_in.parse import (
    TOOL_PARSERS,
    ParsedReply,
    ToolParser,
    ToolParserName,
    load_tool_parser,
    parse_reply,
)
from osmosis_gateway.token_in.render import ChatRenderer, CloseMismatch, TemplateError, TokenizerFolderError

__all__ = [
    "ENGINES",
    "TOOL_PARSERS",
    "ChatRenderer",
    "CloseMismatch",
    "ContextFull",
    "Conversation",
    "EngineAnswer",
    "EngineName",
    "ParsedReply",
    "Rendered",
    "Reply",
    "TemplateError",
    "TokenIn",
    "TokenizerFolderError",
    "ToolParser",
    "ToolParserName",
    "load_tool_parser",
    "parse_reply",
]
