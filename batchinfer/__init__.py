"""batchinfer: batch inference over the NPU cores of Rockchip RK3588-class boards.

The library is the product; the ``batchinfer`` command is a thin shell over it::

    from batchinfer import RunConfig, run
    result = run(RunConfig(dataset="demo/dataset", model="demo/models/digits.onnx"))

    table = batchinfer.infer("demo/models/digits.onnx", arrays)  # data in memory (api.py)
"""

from __future__ import annotations

from batchinfer.lazy_exports import attribute

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
_API = ("InferStream", "infer", "infer_iter")
__all__ = [*_ENGINE, *_API, "__version__"]
_WHERE = {
    **dict.fromkeys(_ENGINE, "batchinfer.engine"),
    **dict.fromkeys(_API, "batchinfer.api"),
}


def __getattr__(name: str):
    # Imported on first use, so `import batchinfer` stays cheap for reader/worker processes.
    return attribute(_WHERE, name)
