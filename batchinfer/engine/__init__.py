"""The engine: coordinator, readers, core workers and the shared-memory slots between them."""

from batchinfer.engine.config import RunConfig, SimOptions
from batchinfer.engine.coordinator import RunResult, run

__all__ = ["RunConfig", "RunResult", "SimOptions", "run"]
