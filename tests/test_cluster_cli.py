"""``batchinfer run --ray local:3``: the whole digits demo on three simulated nodes started
and stopped by the command itself (slow: starting the cluster alone takes ~15 s here)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("ray")

from batchinfer.results import read_run

pytestmark = pytest.mark.ray  # the Ray tier: pytest -m ray, run by .ci/run


@pytest.mark.slow
def test_the_demo_on_three_local_nodes_gives_the_single_board_predictions(demo_kit, tmp_path):
    common = [sys.executable, "-m", "batchinfer", "run", str(demo_kit.dataset), "--model",
              str(demo_kit.models["digits"]), "--backend", "sim", "--no-progress"]  # fmt: skip
    one = subprocess.run([*common, "--out", str(tmp_path / "one")], capture_output=True)
    assert one.returncode == 0, one.stderr.decode()
    many = subprocess.run(
        [*common, "--out", str(tmp_path / "many"), "--ray", "local:3"], capture_output=True
    )
    assert many.returncode == 0, many.stderr.decode()
    a = read_run(tmp_path / "one").predictions()
    b = read_run(tmp_path / "many").predictions()
    assert b["index"].to_pylist() == list(range(1797))
    assert b["pred"].to_pylist() == a["pred"].to_pylist()
    assert set(b["node"].to_pylist()) == {"node0", "node1", "node2"}
    assert read_run(tmp_path / "many").manifest.status == "complete"
