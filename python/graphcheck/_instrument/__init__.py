"""Instrumentation: every CUDA graph capture of the process recorded with no change to the
engine's code (``instrumentation``), the check before a replay (``replay_check``), the
transitions it sees without the engine (``transitions``) and what it needs of the host
process (``host``)."""

from .instrumentation import (
    ENV_DIR,
    Instrumentation,
    check,
    instrument,
    instrumented,
    register_model,
    uninstrument,
)

__all__ = [
    "ENV_DIR",
    "Instrumentation",
    "check",
    "instrument",
    "instrumented",
    "register_model",
    "uninstrument",
]
