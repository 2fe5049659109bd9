"""RKNNLite's constants, with the values of rknn-toolkit-lite2 2.5.0 (see the contract)."""

from __future__ import annotations

NPU_CORE_AUTO = 0
NPU_CORE_0 = 1
NPU_CORE_1 = 2
NPU_CORE_2 = 4
NPU_CORE_0_1 = 3
NPU_CORE_0_1_2 = 7
NPU_CORE_ALL = 0xFFFF

#: Every core_mask value init_runtime accepts on some chip.
VALID_CORE_MASKS = frozenset(
    {NPU_CORE_AUTO, NPU_CORE_0, NPU_CORE_1, NPU_CORE_2, NPU_CORE_0_1, NPU_CORE_0_1_2, NPU_CORE_ALL}
)

#: NPU cores per chip. Only RK3588 and RK3576 accept a non-zero core_mask.
CHIP_CORES = {
    "rk3588": 3,
    "rk3576": 2,
    "rk3562": 1,
    "rk3566": 1,
    "rk3568": 1,
    "rv1126b": 1,
}
MULTI_CORE_CHIPS = ("rk3588", "rk3576")

#: Data types inference() accepts (names as numpy spells them). float64 is not one.
SUPPORTED_DTYPES = (
    "float32",
    "float16",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "bool",
)


def core_mask(core: int) -> int:
    """The NPU_CORE_* mask that pins a runtime to core ``core`` (0 -> NPU_CORE_0 = 1)."""
    return 1 << core
