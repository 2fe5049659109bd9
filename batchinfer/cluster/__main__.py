"""``python -m batchinfer.cluster``: the ``ray start`` resources this board declares.

Prints the ``--resources`` argument for this board's NPU cores (from its device tree; an
RK3588 when it is not a Rockchip board), e.g. for the head::

    ray start --head --resources="$(python -m batchinfer.cluster)"
"""

from __future__ import annotations

import json

from batchinfer.cluster.resources import node_resources
from batchinfer.runtime.backends import detect_chip
from batchinfer.runtime.constants import CHIP_CORES


def main() -> None:
    chip = detect_chip() or "rk3588"
    resources = {k: int(v) for k, v in node_resources(range(CHIP_CORES[chip])).items()}
    print(json.dumps(resources))


if __name__ == "__main__":
    main()
