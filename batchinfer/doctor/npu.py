"""Checks of the NPU itself: the SoC, its driver and kernel, its device node, the governors.

Thresholds and where they come from (no Rockchip document states a driver/runtime matrix;
these are users' reports, cited so a reader can weigh them):

- The rknpu driver says its version in debugfs (``RKNPU driver: v0.9.6``, root only) and
  in the kernel log at boot (``[drm] Initialized rknpu 0.9.6 20240322 for fdab0000.npu``).
- Below 0.9.2: a blocker, as a judgement, not a documented minimum. RK3588 boards on
  rknpu 0.9.2 run librknnrt 2.x (airockchip/rknn-toolkit2#295); 0.8.2 is reported much
  slower (airockchip/rknn-toolkit2#468) and came with old 5.10 images (5.10.110 with 0.8.2:
  Pelochus/ezrknn-llm#19); on RV1106 (another driver line) 2.3.2 needed more than 0.9.2
  (LuckfoxTECH/luckfox-pico#328).
- Core masks (one worker per core) on RK3588: with drivers below 0.9.6 users saw one core
  do all the work (airockchip/rknn-toolkit2#138, solved by a >= 0.9.6 image). A warning,
  since runs still work.
- Kernel 6.1 with drivers below 0.9.5 froze the board on NPU use
  (armbian/linux-rockchip#158). A blocker.
- Mainline kernels have no rknpu driver (their NPU driver, "rocket", is not what librknnrt
  talks to): no NPU device node is found, a blocker.
Anything not covered (a driver version that cannot be read) is said to be unknown.
"""

from __future__ import annotations

import os
import re

from batchinfer.doctor.machine import Machine, dotted, read_text, version_tuple
from batchinfer.doctor.report import Check, fail, ok, warn
from batchinfer.runtime.backends import detect_chip
from batchinfer.runtime.constants import CHIP_CORES, MULTI_CORE_CHIPS

MIN_DRIVER = (0, 9, 2)
CORE_MASK_DRIVER = (0, 9, 6)
KERNEL_61_DRIVER = (0, 9, 5)
DRIVER_FILE = "/sys/kernel/debug/rknpu/version"
KERNEL_LOG = "/dev/kmsg"
_DRIVER_IN_LOG = re.compile(r"(?:Initialized rknpu|RKNPU driver:?)\s+v?(\d+\.\d+\.\d+)")
#: The NPU's devfreq node per chip (its register address); others are found by "*npu*".
DEVFREQ = {"rk3588": "fdab0000.npu", "rk3576": "27700000.npu", "rk3566": "fde40000.npu"}
_KERNEL_UPGRADE = "install the board vendor's newer kernel image (the driver is part of it)"


def soc(m: Machine) -> tuple[Check, str | None]:
    compatible = m.read("/proc/device-tree/compatible")
    chip = detect_chip(m.root)
    model = m.read("/proc/device-tree/model")
    if chip is None:
        found = compatible.replace("\n", ", ") if compatible else "no /proc/device-tree"
        return (
            fail(
                "soc",
                "SoC",
                f"not a Rockchip NPU SoC ({found})",
                "run on an RK3588, RK3576 or RK356x board, or use --backend onnx or sim here.",
            ),
            None,
        )
    cores = CHIP_CORES[chip]
    board = f" on {model}" if model else ""
    text = f"{chip.upper()}{board}, {cores} NPU core{'s' if cores > 1 else ''}"
    return ok("soc", "SoC", text, chip=chip, cores=cores, model=model), chip


def _kernel_log_driver(m: Machine) -> str | None:
    """The driver version from the kernel log (/dev/kmsg: one record per read, EAGAIN at
    the end; a plain file in an emulated root), None when unreadable or not there."""
    try:
        fd = os.open(m.path(KERNEL_LOG), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = None
    try:
        for _ in range(100_000):  # a kernel ring buffer holds far fewer records
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record overwritten while reading; go on
                continue
            if not chunk:
                break
            match = _DRIVER_IN_LOG.search(chunk.decode("utf-8", "replace"))
            if match:
                found = match.group(1)
    finally:
        os.close(fd)
    return found


def driver_version(m: Machine) -> tuple[tuple[int, ...] | None, str]:
    """The rknpu driver's version and where it was read ("" when nowhere)."""
    text = m.read(DRIVER_FILE)
    if text:
        return version_tuple(text), DRIVER_FILE
    text = _kernel_log_driver(m)
    return (version_tuple(text), "the kernel log") if text else (None, "")


def driver(m: Machine, version: tuple[int, ...] | None, where: str) -> Check:
    title = "NPU driver"
    if version is None:
        return warn(
            "driver",
            title,
            f"version unknown: {DRIVER_FILE} and the kernel log are not readable",
            f"run doctor as root (sudo), or check with: sudo cat {DRIVER_FILE}.",
        )
    if version < MIN_DRIVER:
        return fail(
            "driver",
            title,
            f"rknpu {dotted(version)} (from {where}) is too old to run librknnrt 2.x "
            f"(asked for: >= {dotted(MIN_DRIVER)})",
            f"{_KERNEL_UPGRADE}, with rknpu >= {dotted(CORE_MASK_DRIVER)}.",
            version=dotted(version),
            source=where,
        )
    return ok("driver", title, f"rknpu {dotted(version)} (from {where})", version=dotted(version))


def kernel(m: Machine, chip: str | None, version: tuple[int, ...] | None) -> Check:
    """The kernel, and whether its driver honours core masks (one worker per core)."""
    release = m.read("/proc/sys/kernel/osrelease") or "unknown"
    title = "Kernel"
    kv = version_tuple(release)
    details = {"release": release}
    if version is not None and version < MIN_DRIVER:  # a blocker already, on its own line
        return ok(
            "kernel",
            title,
            f"{release} (the driver is too old: see the NPU driver line)",
            **details,
        )
    if version is not None and kv is not None and kv[:2] >= (6, 1) and version < KERNEL_61_DRIVER:
        return fail(
            "kernel",
            title,
            f"{release} with rknpu {dotted(version)}: NPU use froze 6.1 boards before "
            f"rknpu {dotted(KERNEL_61_DRIVER)}",
            f"{_KERNEL_UPGRADE}, with rknpu >= {dotted(CORE_MASK_DRIVER)}.",
            **details,
        )
    if chip is None or chip not in MULTI_CORE_CHIPS:
        return ok("kernel", title, f"{release} (one NPU core: core masks not used)", **details)
    if version is None:
        return warn(
            "kernel",
            title,
            f"{release}; whether its driver honours core masks is unknown (driver version "
            "not readable)",
            f"run doctor as root (sudo) to read the driver version; rknpu >= "
            f"{dotted(CORE_MASK_DRIVER)} is reported to spread work over every core.",
            **details,
        )
    if version < CORE_MASK_DRIVER:
        return warn(
            "kernel",
            title,
            f"{release}: rknpu {dotted(version)} may ignore core masks (one core did all the "
            f"work below {dotted(CORE_MASK_DRIVER)})",
            f"{_KERNEL_UPGRADE}, with rknpu >= {dotted(CORE_MASK_DRIVER)}; runs work "
            "meanwhile, maybe on one core.",
            **details,
        )
    return ok("kernel", title, f"{release}: rknpu {dotted(version)} honours core masks", **details)


def device_nodes(m: Machine) -> list[str]:
    """The NPU's device nodes: the DRM render node the rknpu driver registers (found by
    its platform path, else renderD129, the NPU's on RK3588 vendor kernels) and
    /dev/rknpu (drivers built without DRM)."""
    nodes = []
    by_path = m.path("/dev/dri/by-path")
    if by_path.is_dir():
        for link in sorted(by_path.glob("*npu*-render")):
            if link.is_symlink():  # udev's platform-fdab0000.npu-render -> ../renderD129
                nodes.append(os.path.normpath(os.path.join("/dev/dri/by-path", os.readlink(link))))
    if not nodes and m.exists("/dev/dri/renderD129"):
        nodes.append("/dev/dri/renderD129")
    if m.exists("/dev/rknpu"):
        nodes.append("/dev/rknpu")
    return nodes


def permissions(m: Machine) -> Check:
    title = "NPU device"
    nodes = device_nodes(m)
    if not nodes:
        return fail(
            "device",
            title,
            "no NPU device node (/dev/dri/renderD129 or /dev/rknpu): the rknpu driver is not "
            "loaded",
            "boot the board vendor's kernel, which has the rknpu driver (check: dmesg | grep "
            "-i rknpu).",
        )
    denied = [n for n in nodes if not m.readable_writable(n)]
    if denied:
        return fail(
            "device",
            title,
            f"{', '.join(denied)} not readable and writable by this user",
            f"add yourself to its group (ls -l {denied[0]}; sudo usermod -aG render $USER, "
            "then log in again), or run as root.",
            nodes=nodes,
        )
    return ok("device", title, f"{', '.join(nodes)} readable and writable", nodes=nodes)


def governors(m: Machine, chip: str | None) -> Check:
    """The CPU governors (readers decode on the CPU) and whether the NPU clock is pinned."""
    title = "Governors"
    cpu: dict[str, str] = {}
    for path in sorted(
        m.path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")
    ):
        governor = read_text(path)
        if governor:
            cpu[path.parent.parent.name] = governor
    nodes = sorted(m.path("/sys/class/devfreq").glob("*npu*"))
    preferred = DEVFREQ.get(chip or "")
    nodes.sort(key=lambda p: p.name != preferred)
    npu = read_text(nodes[0] / "governor") if nodes else None
    # userspace at the top frequency is pinned too (a board's own tuning script may do it)
    pinned = npu == "performance" or (
        npu == "userspace"
        and bool(nodes)
        and read_text(nodes[0] / "cur_freq") == read_text(nodes[0] / "max_freq")
    )
    slow = sorted({g for g in cpu.values() if g != "performance"})
    problems, fixes = [], []
    if slow:
        problems.append(f"CPU governor {', '.join(slow)}")
        fixes.append(
            "echo performance | sudo tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"
        )
    if nodes and not pinned:
        problems.append(f"NPU clock not pinned (devfreq {nodes[0].name}: {npu or 'unreadable'})")
        fixes.append(f"echo performance | sudo tee /sys/class/devfreq/{nodes[0].name}/governor")
    details = {"cpu": cpu, "npu_devfreq": nodes[0].name if nodes else None, "npu": npu}
    if problems:
        return warn(
            "governors",
            title,
            "; ".join(problems) + ": throughput varies and is lower",
            "; ".join(fixes) + " (for benchmarks and long runs).",
            **details,
        )
    cpu_text = "CPU performance" if cpu else "CPU governor not readable"
    npu_text = f"NPU pinned ({nodes[0].name}: {npu})" if nodes else "no NPU devfreq node"
    return ok("governors", title, f"{cpu_text}; {npu_text}", **details)
