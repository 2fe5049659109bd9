"""A tiny soak of every mode of tools/soak.py (slow: ``pytest -m slow``).

The soak checks what the engine promises under each fault (exactly once, error rows
explained, restarts matching the faults, no core retired, nothing left behind); here it
runs small, with wide fault gaps and short timeouts, so that each mode takes well under a
minute on an idle machine. The full-size soak is ``python tools/soak.py --mode ...``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[1] / "tools" / "soak.py"
SMALL = ["--items", "2000", "--gap", "150,300", "--part-rows", "100"]
CASES = {
    "plain-poison": ["--poison", "2", "--max-attempts", "3"],
    "interrupt": ["--mode", "interrupt"],
    # More than 10 hanging files: more than the reader-death limit allows without blame.
    "kill-fifos": ["--mode", "kill", "--fifos", "11", "--decode-timeout-s", "2"],
    # Slower, frozen early: a worker is frozen only while no fault is open, and at 0.3 ms
    # the run (about 2 s) was often over before a window came.
    "freeze": ["--mode", "freeze", "--freezes", "1", "--npu-ms", "2", "--at", "0.2"],
    "ctrl-z": ["--mode", "ctrl-z", "--stops", "1"],
    "second-run": ["--mode", "second-run", "--npu-ms", "2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_tiny_soak_holds_every_check(case, tmp_path):
    argv = [sys.executable, str(SOAK), *SMALL, *CASES[case], "--workdir", str(tmp_path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "OK: every check held" in proc.stdout
