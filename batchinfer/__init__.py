"""batchinfer: batch inference over the NPU cores of Rockchip RK3588-class boards.

The library is the product; the ``batchinfer`` command is a thin shell over it::

    from batchinfer import RunConfig, run
    result = run(RunConfig(dataset="demo/dataset", model="demo/models/digits.onnx"))
"""

from __future__ import annotations

__version__ = "0.1.0"

_ENGINE = (
    "Engine",
    "OutputOptions",
    "PreprocessOptions",
    "ReliabilityOptions",
    "RunConfig",
    "RunResult",
    "RuntimeOptions",
    "SimOptions",
    "run",
)
__all__ = [*_ENGINE, "__version__"]


def __getattr__(name: str):
    # Imported on first use, so `import batchinfer` stays cheap for reader/worker processes.
    if name in _ENGINE:
        from batchinfer import engine

        return getattr(engine, name)
    raise AttributeError(name)
