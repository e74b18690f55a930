"""Test tools for rollout and plugin authors: a scripted OpenAI-compatible policy server that speaks
real HTTP on 127.0.0.1, a scripted token-in engine (SGLang's ``/generate``, vLLM's token routes),
rule-based scripts for them, helpers that run one rollout end to end, the backend contract suite,
and :func:`check_lazy_exports` for a package that loads its names lazily.

The server is a stand-in for a model (these machines have none), never a fake of osmosis itself.
"""

from typing import TYPE_CHECKING

import lazy_loader

if TYPE_CHECKING:
    from osmosis_core.testing.contract import BackendContract as BackendContract
    from osmosis_core.testing.contract import ContractGrader as ContractGrader
    from osmosis_core.testing.contract import ContractWorkflow as ContractWorkflow
    from osmosis_core.testing.exports import check_lazy_exports as check_lazy_exports
    from osmosis_core.testing.guides import guide_commands as guide_commands
    from osmosis_core.testing.guides import run_guide_commands as run_guide_commands
    from osmosis_core.testing.policy_server import Fault as Fault
    from osmosis_core.testing.policy_server import LoggedRequest as LoggedRequest
    from osmosis_core.testing.policy_server import Reply as Reply
    from osmosis_core.testing.policy_server import ScriptedPolicyServer as ScriptedPolicyServer
    from osmosis_core.testing.policy_server import ToolCall as ToolCall
    from osmosis_core.testing.rollout import RolloutOutcome as RolloutOutcome
    from osmosis_core.testing.rollout import run_rollout as run_rollout
    from osmosis_core.testing.rollout import run_rollout_sync as run_rollout_sync
    from osmosis_core.testing.scripts import calculator as calculator
    from osmosis_core.testing.scripts import echo as echo
    from osmosis_core.testing.stub_process import StubPolicyProcess as StubPolicyProcess
    from osmosis_core.testing.token_engine import ScriptedTokenEngine as ScriptedTokenEngine
    from osmosis_core.testing.token_engine import write_test_tokenizer as write_test_tokenizer

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "contract": ["BackendContract", "ContractGrader", "ContractWorkflow"],
        "exports": ["check_lazy_exports"],
        "guides": ["guide_commands", "run_guide_commands"],
        "policy_server": ["Fault", "LoggedRequest", "Reply", "ScriptedPolicyServer", "ToolCall"],
        "rollout": ["RolloutOutcome", "run_rollout", "run_rollout_sync"],
        "scripts": ["calculator", "echo"],
        "stub_process": ["StubPolicyProcess"],
        "token_engine": ["ScriptedTokenEngine", "write_test_tokenizer"],
    },
)
