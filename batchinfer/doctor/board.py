"""An emulated board for ``doctor``: the files its checks read, written under a folder.

``batchinfer doctor --board rk3588`` and the tests build one with :func:`build_board`, then
run the real checks against it (every read goes through the folder, batchinfer.doctor.
machine). :class:`BoardSpec` says what to write; a field changed plants a fault (an old
driver, an old librknnrt, no device node, a powersave governor...). The files imitate
what boards show: ``RKNPU driver: v0.9.8`` in debugfs, ``[drm] Initialized rknpu 0.9.8
... for fdab0000.npu`` in the kernel log, ``librknnrt version: 2.5.0 (...)`` inside the
library, udev's ``/dev/dri/by-path/platform-<npu>-render`` link to the render node.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from batchinfer.doctor.machine import Machine
from batchinfer.doctor.npu import DEVFREQ

#: Per chip: a device tree (compatible, model), its CPUs, memory and kernel as shipped.
BOARDS = {
    "rk3588": ("radxa,rock-5b\0rockchip,rk3588\0", "Radxa ROCK 5B", 8, 16, "6.1.84-1-rk2410"),
    "rk3576": (
        "rockchip,rk3576-evb1-v10\0rockchip,rk3576\0",
        "Rockchip RK3576 EVB1",
        8,
        8,
        "6.1.84-1-rk2410",
    ),
    "rk3566": ("radxa,zero3\0rockchip,rk3566\0", "Radxa ZERO 3", 4, 4, "5.10.160-rockchip"),
}
LITE_VERSION = "2.5.0"


@dataclass(frozen=True)
class BoardSpec:
    """What the emulated board has; the defaults are a healthy board."""

    chip: str = "rk3588"
    driver: str | None = "0.9.8"  # None: no driver at all
    debugfs: bool = True  # False: the driver's version only in the kernel log
    kernel: str | None = None  # None: the chip's (BOARDS)
    librknnrt: str | None = "2.5.0"  # None: no /usr/lib/librknnrt.so
    device_node: bool = True
    cpu_governor: str = "performance"
    npu_governor: str = "performance"
    toolkit_lite2: str | None = LITE_VERSION  # None: not installed
    wheel_python: tuple[int, int] = field(default_factory=lambda: sys.version_info[:2])
    mem_available_mib: int | None = None  # None: 7/8 of the board's memory


def _write(root: Path, name: str, data: str | bytes, mode: int = 0o644) -> Path:
    path = root / name.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)
    return path


def librknnrt_bytes(version: str) -> bytes:
    """A stand-in library: an ELF magic, padding, and the version text where a real one
    has it (past the first MiB, so a reader that stops early would miss it)."""
    text = f"librknnrt version: {version} (emulated@2025-08-01T00:00:00)".encode()
    return b"\x7fELF" + b"\0" * (1 << 20) + text + b"\0" * 4096


def build_board(root: Path, spec: BoardSpec = BoardSpec()) -> Machine:
    """Write ``spec``'s board under ``root`` and return the Machine that reads it."""
    compatible, model, cpus, mem_gib, kernel = BOARDS[spec.chip]
    _write(root, "/proc/device-tree/compatible", compatible)
    _write(root, "/proc/device-tree/model", model + "\0")
    _write(root, "/proc/sys/kernel/osrelease", (spec.kernel or kernel) + "\n")
    available = spec.mem_available_mib if spec.mem_available_mib is not None else mem_gib * 896
    _write(
        root,
        "/proc/meminfo",
        f"MemTotal: {mem_gib << 20} kB\nMemFree: {available << 10} kB\n"
        f"MemAvailable: {available << 10} kB\n",
    )
    (root / "dev/shm").mkdir(parents=True, exist_ok=True)
    npu = DEVFREQ[spec.chip]
    if spec.driver is not None:
        if spec.debugfs:
            _write(
                root, "/sys/kernel/debug/rknpu/version", f"RKNPU driver: v{spec.driver}\n", 0o600
            )
        _write(
            root,
            "/dev/kmsg",
            f"6,812,2104331,-;[drm] Initialized rknpu {spec.driver} 20240828 for {npu} "
            "on minor 1\n",
            0o600,
        )
        devfreq = f"/sys/class/devfreq/{npu}"
        _write(root, f"{devfreq}/governor", spec.npu_governor + "\n")
        _write(root, f"{devfreq}/cur_freq", "1000000000\n")
        _write(root, f"{devfreq}/max_freq", "1000000000\n")
        if spec.device_node:
            _write(root, "/dev/dri/renderD129", b"", 0o666)
            link = root / f"dev/dri/by-path/platform-{npu}-render"
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink("../renderD129", link)
    for cpu in range(cpus):
        _write(
            root,
            f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor",
            spec.cpu_governor + "\n",
        )
    if spec.librknnrt is not None:
        _write(root, "/usr/lib/librknnrt.so", librknnrt_bytes(spec.librknnrt), 0o755)
    site = root / "usr/lib/python3/dist-packages"
    site.mkdir(parents=True, exist_ok=True)
    if spec.toolkit_lite2 is not None:
        info = site / f"rknn_toolkit_lite2-{spec.toolkit_lite2}.dist-info"
        tag = "cp{0}{1}-cp{0}{1}".format(*spec.wheel_python)
        _write(
            root,
            str(info / "METADATA").removeprefix(str(root)),
            f"Metadata-Version: 2.1\nName: rknn-toolkit-lite2\nVersion: {spec.toolkit_lite2}\n",
        )
        _write(
            root,
            str(info / "WHEEL").removeprefix(str(root)),
            f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
            f"Tag: {tag}-manylinux_2_17_aarch64.manylinux2014_aarch64\n",
        )
    return Machine(
        root=root,
        arch="aarch64",
        env={},
        python_path=(str(site),),
        cpus=cpus,
        emulated=True,
    )
