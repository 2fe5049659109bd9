"""The emulator's last drop-in gaps (issue 43, item 5): what breaks on a board breaks here.

Each expectation is read from the real rknn-toolkit-lite2 2.5.0 wheel
(rknn_toolkit_lite2-2.5.0-cp311-cp311-manylinux_2_17_aarch64.whl): its one Python file
``rknnlite/api/rknn_lite.py``, and the strings of its compiled modules
``rknnlite/api/rknn_runtime.cpython-311-aarch64-linux-gnu.so`` and
``rknnlite/api/rknn_platform_utils.cpython-311-aarch64-linux-gnu.so``; or from the public
issue named beside it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pytest

from batchinfer.cli import _CliLogHandler
from batchinfer.runtime import _level_names
from batchinfer.runtime import constants as C
from batchinfer.runtime.sim import RKNNLite


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return M.nhwc_uint8_model(tmp_path_factory.mktemp("gapmodel"))


def sim(tmp_path: Path, model: Path, chip: str = "rk3588") -> RKNNLite:
    r = RKNNLite(npu_ms=0, host_ms=0, faults="", state_dir=tmp_path / "state", chip=chip)
    assert r.load_rknn(str(model)) == 0
    return r


def emulate(tmp_path: Path, body: str, *flags: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    full_env = {**os.environ, "BATCHINFER_SIM_STATE": str(tmp_path / "state"), **env}
    for name in ("BATCHINFER_SIM_RENAME_LOG_LEVELS", "BATCHINFER_SIM_CHIP"):
        if name not in env:
            full_env.pop(name, None)
    cmd = [sys.executable, "-m", "batchinfer.runtime.emulate", *flags, str(script)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=full_env)


# ---------------------------------------------------------------- logging level names
def test_importing_rknnlite_renames_the_levels_by_default(tmp_path: Path) -> None:
    # Importing the real rknnlite.api renames the levels (airockchip/rknn-toolkit2#414,
    # rockchip-linux/rknn-toolkit2#270): setLevel('INFO') afterwards raises.
    proc = emulate(
        tmp_path,
        """
        import logging
        from rknnlite.api import RKNNLite
        print(sorted(logging.getLevelNamesMapping().items()))
        logging.getLogger().setLevel('INFO')
        """,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[('C', 50), ('D', 10), ('E', 40), ('I', 20), ('W', 30)]" in proc.stdout
    assert "ValueError: Unknown level: 'INFO'" in proc.stderr


@pytest.mark.parametrize(
    ("flags", "env"),
    [(("--keep-log-levels",), {}), ((), {"BATCHINFER_SIM_RENAME_LOG_LEVELS": "0"})],
)
def test_the_rename_can_be_turned_off(tmp_path: Path, flags: tuple, env: dict) -> None:
    proc = emulate(
        tmp_path,
        """
        import logging
        from rknnlite.api import RKNNLite
        logging.getLogger().setLevel('INFO')
        print("kept")
        """,
        *flags,
        **env,
    )
    assert proc.returncode == 0 and "kept" in proc.stdout, proc.stderr


def test_cli_warnings_keep_their_word_after_the_rename(capsys: pytest.CaptureFixture) -> None:
    # The CLI named its prefix from record.levelname, which the rename turns into "W".
    saved = _level_names.snapshot()
    try:
        _level_names.rename_like_rknnlite()
        for level, word in ((logging.WARNING, "warning"), (logging.ERROR, "error")):
            record = logging.LogRecord("batchinfer", level, __file__, 1, "disk low", None, None)
            _CliLogHandler().emit(record)
            assert capsys.readouterr().err == f"{word}: disk low\n"
    finally:
        _level_names.restore(saved)


# ---------------------------------------------------------------- rknn_runtime members
def test_set_core_mask_returns_zero_and_refuses_as_init_runtime_does(
    tmp_path: Path, model: Path, capfd: pytest.CaptureFixture
) -> None:
    # rknn_lite.py: ret = self.rknn_runtime.set_core_mask(core_mask) is init_runtime's
    # return value; the .so's argument check says it takes exactly one argument.
    r = sim(tmp_path, model)
    assert r.init_runtime(core_mask=C.NPU_CORE_0) == 0
    assert r.rknn_runtime.set_core_mask(C.NPU_CORE_1) == 0
    assert r.cores == (1,)
    with pytest.raises(ValueError, match=r"The core mode 6 is not supported currently\."):
        r.rknn_runtime.set_core_mask(6)
    with pytest.raises(TypeError):
        r.rknn_runtime.set_core_mask()
    r.release()


def test_check_dynamic_shape_takes_nothing_and_writes_the_static_warning(
    tmp_path: Path, model: Path, capfd: pytest.CaptureFixture
) -> None:
    # Its docstring in rknn_runtime .so: query rknn_input_range; a failure means static.
    r = sim(tmp_path, model)
    assert r.init_runtime() == 0
    capfd.readouterr()
    assert r.rknn_runtime.check_dynamic_shape() is None
    assert r.rknn_runtime.is_dynamic_shape is False
    warning = "W Query dynamic range failed. Ret code: RKNN_ERR_MODEL_INVALID."
    assert warning in capfd.readouterr().err
    r.release()


def test_get_output_shape_takes_one_argument(tmp_path: Path, model: Path) -> None:
    # rknn_runtime .so: "get_output_shape() takes exactly 2 positional arguments" (self and
    # one more); what the argument means is not readable there ([guess]: an output index).
    r = sim(tmp_path, model)
    assert r.init_runtime() == 0
    runtime = r.rknn_runtime
    assert runtime.get_output_shape(0) == [1, 10]  # the model's [1, classes] output
    with pytest.raises(TypeError):
        runtime.get_output_shape()
    with pytest.raises(Exception, match="RKNN_ERR_PARAM_INVALID"):
        runtime.get_output_shape(5)
    r.release()


# ---------------------------------------------------------------- log lines
def test_a_refused_core_mask_logs_the_boards_lines(
    tmp_path: Path, model: Path, capfd: pytest.CaptureFixture
) -> None:
    # rknn_lite.py init_runtime: except: e('Catch exception when set npu core mode.') and
    # return -1, without a traceback; the reason is the .so's string, without our hints.
    r = sim(tmp_path, model, chip="rk3566")
    capfd.readouterr()
    assert r.init_runtime(core_mask=C.NPU_CORE_0) == -1
    lines = capfd.readouterr().err.splitlines()
    refusal = (
        "E The core_mask is only supported by ['RK3588', 'RK3576']. Please do not set this "
        "parameter on other platforms."
    )
    assert lines[-2:] == [refusal, "E Catch exception when set npu core mode."]
    assert r.rknn_runtime is not None  # the runtime stays, as the wheel's does
    r.release()


def test_failed_set_inputs_logs_the_boards_lines(
    tmp_path: Path, model: Path, capfd: pytest.CaptureFixture
) -> None:
    # rknn_lite.py inference: e('Catch exception when setting inputs.') then
    # e(traceback.format_exc()); the message is the .so's "The input[{}] need {}dims
    # input, but {}dims input buffer feed." + " Please try to feed input as 4D data.".
    r = sim(tmp_path, model)
    assert r.init_runtime() == 0
    capfd.readouterr()
    assert r.inference(inputs=[np.zeros((8, 8, 1), np.uint8)]) is None
    err = capfd.readouterr().err
    assert err.startswith(
        "E Catch exception when setting inputs.\nE Traceback (most recent call last):\n"
    )
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.endswith(
        "The input[0] need 4dims input, but 3dims input buffer feed. Please try to feed "
        "input as 4D data."
    )
    r.release()


def test_list_support_target_platform_prints_the_wheels_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # rknn_platform_utils .so strings: "*" * 50, "All RKNN Toolkit supported target
    # platforms:", "chip family {}: {}"; the families from rknnlite/config/cpu_npu_mapper.yml.
    result = RKNNLite(state_dir=tmp_path).list_support_target_platform()
    out = capsys.readouterr().out.splitlines()
    assert out[0] == out[-1] == "*" * 50
    assert out[1] == "All RKNN Toolkit supported target platforms:"
    assert "chip family RKNPU2-V2: ['RK3588']" in out
    assert result["RKNPU2-LITE"] == ["RK3566", "RK3568"]


# ---------------------------------------------------------------- --board
def test_board_device_tree_file_exists_every_way(tmp_path: Path) -> None:
    proc = emulate(
        tmp_path,
        """
        import os
        from pathlib import Path
        p = "/proc/device-tree/compatible"
        print(Path(p).exists(), Path(p).is_file(), os.path.exists(p), os.path.isfile(p))
        print(os.stat(p).st_size == len(open(p, "rb").read()), Path(p).read_text())
        """,
        "--board",
        "rk3576",
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "True True True True"
    assert lines[1].startswith("True rockchip,rk3576")
