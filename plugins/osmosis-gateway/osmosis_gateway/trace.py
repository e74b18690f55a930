"""The trace records and the trainer's view of them, which live in osmosis-trainer (a trainer's
image has no osmosis-core): :mod:`osmosis_trainer.trace`. The gateway records them; these names are
the same objects, kept here so ``from osmosis_gateway import trainer_view`` reads as it did."""

from osmosis_trainer.trace import (
    CallStatus,
    RolloutTrace,
    TraceCall,
    TrainerView,
    TrainingSequence,
    comparable_trace,
    read_traces,
    trace_from_json,
    trainer_view,
)

__all__ = [
    "CallStatus",
    "RolloutTrace",
    "TraceCall",
    "TrainerView",
    "TrainingSequence",
    "comparable_trace",
    "read_traces",
    "trace_from_json",
    "trainer_view",
]
