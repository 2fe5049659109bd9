"""A detection run on a local Ray cluster: the actors letterbox-read, infer and decode, and the
run folder holds the boxes a single board writes (test_cluster.py has the cluster set-up)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from test_cluster import cluster, no_leaks  # noqa: F401  (fixtures)
from test_detect_run import _config, _rows, kit  # noqa: F401  (fixture)

from batchinfer import run
from batchinfer.cluster import run_on_cluster

pytestmark = pytest.mark.ray  # the Ray tier: pytest -m ray, run by .ci/run


@pytest.mark.parametrize("data", ["head", "shared"])
def test_boxes_on_two_nodes_are_the_single_boards(cluster, kit, tmp_path, data):  # noqa: F811
    one = run(_config(kit, tmp_path / "one"))
    many = run_on_cluster(_config(kit, tmp_path / "many"), cluster.address, data=data)
    assert (many.succeeded, many.errors) == (one.succeeded, one.errors) == (4, 1)
    a, b = _rows(one.out), _rows(many.out)
    assert a.keys() == b.keys()
    for key in a:
        for col in ("boxes", "n_boxes", "width", "height"):
            assert a[key][col] == b[key][col], (key, col)
        assert (a[key]["error"] is None) == (b[key]["error"] is None)
    assert {r["node"] for r in b.values() if r["error"] is None} <= {"node0", "node1"}


def test_save_outputs_keeps_the_raw_outputs_on_the_nodes_too(cluster, kit, tmp_path):  # noqa: F811
    # Before, a node's actor dropped the outputs once it had decoded them: every out_*
    # column of a Ray detection run was null, while a board's rows had them.
    one = run(_config(kit, tmp_path / "one", save_outputs=True))
    many = run_on_cluster(_config(kit, tmp_path / "many", save_outputs=True), cluster.address)
    a, b = _rows(one.out), _rows(many.out)
    outputs = [c for c in next(iter(a.values())) if c.startswith("out_")]
    assert outputs and a.keys() == b.keys()
    for key in a:
        assert b[key]["boxes"] == a[key]["boxes"], key
        for col in outputs:
            assert b[key][col] == a[key][col], (key, col)
    assert b["a_upright.png"]["out_output1"] is not None
    assert b["d_corrupt.png"]["out_output1"] is None
