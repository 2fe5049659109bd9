"""``batchinfer doctor``: whether a run can go on this machine, one line per check.

Checks by group: the NPU (batchinfer.doctor.npu: SoC, driver, kernel and core masks, device
node, governors), the software (.runtime: librknnrt against the model's toolkit,
rknn-toolkit-lite2 for this Python, and without an NPU the backends that run instead), the
resources (.resources: memory, /dev/shm, open files). Every file is read through one root
(.machine), so an emulated board (.board) exercises the same code.
"""

from batchinfer.doctor.board import BoardSpec, build_board
from batchinfer.doctor.checks import run_doctor
from batchinfer.doctor.machine import Machine
from batchinfer.doctor.report import FAIL, OK, WARN, Check, Report

__all__ = [
    "FAIL",
    "OK",
    "WARN",
    "BoardSpec",
    "Check",
    "Machine",
    "Report",
    "build_board",
    "run_doctor",
]
