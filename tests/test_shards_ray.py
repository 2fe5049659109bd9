"""Tar shards on a local Ray cluster: read on the head or on the nodes, as on one board."""

from __future__ import annotations

from pathlib import Path

import pytest
from runs import config, fast_sim
from tar_shards import write_shards

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from test_cluster import cluster, no_leaks  # noqa: E402, F401 - the module's cluster and guard
from test_shards import _same_predictions  # noqa: E402

from batchinfer import run  # noqa: E402
from batchinfer.cluster import run_on_cluster  # noqa: E402


@pytest.mark.parametrize("data", ["head", "shared"])
def test_shards_on_a_cluster_give_the_predictions_of_one_board(
    cluster,  # noqa: F811
    demo_kit,
    tmp_path: Path,
    data: str,
) -> None:
    shards = write_shards(demo_kit.dataset, tmp_path / "shards", 3)
    raw = bytearray(shards[1].read_bytes())
    raw[512 * 4 : 512 * 4 + 10] = b"#" * 10  # a corrupt header: one error row
    shards[1].write_bytes(bytes(raw))

    def cfg(out: str):
        return config(
            dataset=tmp_path / "shards" / "part-{000..002}.tar",
            model=demo_kit.models["digits"],
            backend="sim",
            sim=fast_sim(),
            out=tmp_path / out,
        )

    on_cluster = run_on_cluster(cfg("c"), cluster.address, data=data)
    alone = run(cfg("a"))
    assert on_cluster.errors == alone.errors == 1
    _same_predictions(on_cluster.out, alone.out, same_ids=True)
