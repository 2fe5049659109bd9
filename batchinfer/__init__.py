"""batchinfer: batch inference over the NPU cores of Rockchip RK3588-class boards."""

from __future__ import annotations

__version__ = "0.1.0"
