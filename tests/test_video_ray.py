"""Videos on a local Ray cluster (``--ray-data shared``: the nodes decode): each frame
exactly once, the predictions of one board."""

from __future__ import annotations

from pathlib import Path

import pytest
from models import nhwc_uint8_model
from runs import config, fast_sim
from video_files import write_clip

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from test_cluster import cluster, no_leaks  # noqa: E402, F401 - the module's cluster and guard

from batchinfer import run  # noqa: E402
from batchinfer.cluster import run_on_cluster  # noqa: E402
from batchinfer.results import read_predictions  # noqa: E402


@pytest.mark.parametrize("data", ["head", "shared"])
def test_a_video_on_a_cluster_gives_each_frame_once_as_one_board(
    cluster,  # noqa: F811
    tmp_path: Path,
    data: str,
) -> None:
    clip = write_clip(tmp_path / "clip.mp4", "h264", 90, 64, 48, gop=10)
    model = nhwc_uint8_model(tmp_path)

    def cfg(out: str):
        return config(clip, model, backend="sim", sim=fast_sim(), out=tmp_path / out, every=2)

    on_cluster = run_on_cluster(cfg("c"), cluster.address, data=data)
    alone = run(cfg("a"))
    assert on_cluster.errors == alone.errors == 0
    a = read_predictions(on_cluster.out).sort_by("index").to_pylist()
    b = read_predictions(alone.out).sort_by("index").to_pylist()
    assert [r["frame"] for r in a] == list(range(0, 90, 2))
    assert [(r["id"], r["frame"], r["time_s"], r["pred"]) for r in a] == [
        (r["id"], r["frame"], r["time_s"], r["pred"]) for r in b
    ]
