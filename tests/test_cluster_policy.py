"""Scale-out on Ray without a cluster: addresses, node discovery, scheduling keys that share
a core, the node column in every output, and what happens when Ray is not installed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_cli import assert_error, invoke, run_args

from batchinfer.cli.console import format_summary
from batchinfer.cluster.connect import NodeInfo, import_ray, npu_nodes, parse_address
from batchinfer.cluster.nodes import usable_nodes
from batchinfer.cluster.resources import node_resources
from batchinfer.data.dataset import Item
from batchinfer.engine.scheduler import Scheduler
from batchinfer.errors import NoCoreError, RuntimeUnavailableError, UsageError
from batchinfer.results import read_predictions
from batchinfer.sink.predictions import PredictionWriter
from batchinfer.sink.rows import Row
from batchinfer.sink.stats import CORE_STATS_FILE, CoreStatsRecorder, write_core_stats


def test_nodes_without_the_cores_asked_for_are_left_out_and_none_at_all_is_one_sentence():
    # One text whether the session or the pool's node set-up finds it (they differed).
    nodes = [NodeInfo("a", "id-a", "10.0.0.1", (0,)), NodeInfo("b", "id-b", "10.0.0.2", (1, 2))]
    assert usable_nodes(nodes, (1, 2)) == [nodes[1]]
    with pytest.raises(NoCoreError, match=r"\(npu_core_3, npu_core_4\); start each board with ray"):
        usable_nodes(nodes, (3, 4))


def test_addresses():
    assert parse_address("local") == ("local", 1)
    assert parse_address("local:3") == ("local", 3)
    assert parse_address("auto") == ("remote", 0)
    assert parse_address("10.0.0.2:6379") == ("remote", 0)
    for bad in ("local:0", "local:x", " "):
        with pytest.raises(UsageError):
            parse_address(bad)


def _node(node_id: str, name: str, resources: dict, alive: bool = True) -> dict:
    return {
        "NodeID": node_id,
        "NodeName": name,
        "NodeManagerAddress": name,
        "Alive": alive,
        "Resources": {"CPU": 8.0, **resources},
    }


def test_nodes_are_those_alive_that_declare_npu_cores_named_uniquely():
    nodes = npu_nodes(
        [
            _node("bbbbbb1", "10.0.0.2", node_resources([0, 1, 2])),
            _node("aaaaaa1", "10.0.0.2", {"npu_core_1": 1.0}),  # same address: simulated
            _node("cccccc1", "rock-3", node_resources([0, 1, 2]), alive=False),
            _node("dddddd1", "laptop", {}),  # a head without an NPU
            _node("eeeeee1", "rock-1", {**node_resources([2, 0]), "npu_core_x": 1.0}),
        ]
    )
    assert [(n.name, n.cores) for n in nodes] == [
        ("10.0.0.2-aaaaaa", (1,)),
        ("10.0.0.2-bbbbbb", (0, 1, 2)),
        ("rock-1", (0, 2)),
    ]
    assert node_resources([0, 2]) == {"npu_core_0": 1.0, "npu_core_2": 1.0}


def test_a_retry_goes_to_another_physical_core_not_another_instance_of_the_same():
    # Keys 0 and 1 are two instances of core 0 of node a; key 2 is core 0 of node b.
    where = {0: ("a", 0), 1: ("a", 0), 2: ("b", 0)}
    s = Scheduler(
        8, [0, 1, 2], 1, 0, max_attempts=2, physical=where.__getitem__,
        name=lambda k: "core {1} of node {0}".format(*where[k]),
    )  # fmt: skip
    for key in (0, 1, 2):
        s.life.core_ready(key)
    slot = s.admit(Item(0, "", "x", None, None), 0.0, needs_reader=False)
    s.cores[1].state = s.cores[2].state = "starting"  # only key 0 is open at first
    assert s.dispatch(0.0) == {0: [slot]}
    assert s.done(0, slot, "inference() returned None") is None
    s.cores[1].state = "ready"
    assert s.dispatch(0.0) == {}  # key 1 is the same core: the retry waits for another core
    s.cores[2].state = "ready"
    assert s.dispatch(0.0) == {2: [slot]}
    finished = s.done(2, slot, "inference() returned None")
    assert finished.error == (
        "core 0 of node a: inference() returned None; core 0 of node b: inference() returned None"
    )


def test_core_stats_and_timeline_name_the_node(tmp_path):
    rec = CoreStatsRecorder([("b", 0), ("a", 1), ("a", 0)], 2, invocation=1)
    rec.mark_dispatch(10.0)
    for node, core, t in [("a", 0, 10.2), ("a", 1, 10.4), ("b", 0, 11.5), ("a", 0, 11.7)]:
        rec.record((node, core), t, 2.0, True)
    rec.record(None, 11.9, None, False)
    rows = rec.table().to_pylist()
    assert [(r["node"], r["core"], r["items"]) for r in rows] == [
        ("a", 0, 2), ("a", 1, 1), ("b", 0, 1), (None, None, 5)
    ]  # fmt: skip
    timeline = rec.timeline_table().to_pylist()
    assert [(r["node"], r["core"], r["second"]) for r in timeline] == [
        ("a", 0, 0), ("a", 1, 0), (None, None, 1), ("a", 0, 1), ("b", 0, 1)
    ]  # fmt: skip
    # A run written before the node column existed is continued: its rows get node null.
    old = CoreStatsRecorder([0], 1, invocation=0)
    old.record(0, 1.0, 1.0, True)
    pq.write_table(old.table().drop_columns(["node"]), tmp_path / CORE_STATS_FILE)
    write_core_stats(tmp_path, rec)
    both = pq.read_table(tmp_path / CORE_STATS_FILE).to_pylist()
    assert [(r["invocation"], r["node"], r["core"]) for r in both][:2] == [
        (0, None, 0),
        (0, None, None),
    ]
    assert len(both) == 2 + len(rows)
    text = format_summary(rec.table())
    assert [line.split()[0] for line in text.splitlines()[1:]] == ["a/0", "a/1", "b/0", "all"]


def _row(index: int, node: str | None) -> Row:
    return Row(index, f"{index}.png", None, 1, "1", 0, 0, 1, 1.0, 0.1, 0.2, None,
               pred=3, outputs=[np.arange(10, dtype=np.float32)], node=node)  # fmt: skip


def test_predictions_have_a_node_column_null_on_one_board(tmp_path):
    with PredictionWriter(tmp_path, topk=2, rows_per_part=2) as writer:
        writer.write([_row(0, None), _row(1, "rock-1"), _row(2, "rock-2")])
    # A part written before the column existed still reads, its rows with node null.
    old = pq.read_table(tmp_path / "predictions" / "part-00000.parquet").drop_columns(["node"])
    pq.write_table(old, tmp_path / "predictions" / "part-00000.parquet")
    table = read_predictions(tmp_path)
    assert table["node"].to_pylist() == [None, None, "rock-2"]
    assert table.schema.field("node").type == pa.string()


def test_without_ray_the_library_and_the_cli_say_how_to_install_it(demo_kit, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(RuntimeUnavailableError, match=r"pip install 'batchinfer\[ray\]'"):
        import_ray()
    out = tmp_path / "o"
    result = invoke(*run_args(demo_kit.dataset, demo_kit.models["digits"], out, "--ray", "auto"))
    assert_error(result, 2, "Ray is not installed", "--ray", "batchinfer[ray]")
    assert not Path(out).exists()


def test_a_node_without_the_model_gets_a_private_copy_for_the_run(demo_kit, tmp_path):
    from batchinfer.cluster.actors import NodeHost, model_files
    from batchinfer.options import RuntimeOptions, SimOptions
    from batchinfer.runtime.backends import make_backend

    model = demo_kit.models["digits"]
    backend = make_backend(model, RuntimeOptions(backend="sim", sim=SimOptions(npu_ms=0.1)))
    files = model_files(model)
    assert list(files) == [model.name]
    # A node that has the same file at the same path uses it.
    host = NodeHost(backend)
    here = host.begin(files)
    assert here.model == model and host.model_copy is None
    host.end()
    # A node where the path does not exist (another machine) gets a copy, gone at the end.
    elsewhere = NodeHost(backend.__class__(tmp_path / "not-here" / model.name, backend.options))
    there = elsewhere.begin(files)
    assert there.model != model and there.model.read_bytes() == model.read_bytes()
    adapter = there.instance(0)  # the copy is what the node's actors load
    adapter.release()
    copy, state = there.model.parent, there.state_dir
    elsewhere.end()
    assert not copy.exists() and not Path(state).exists()


def test_a_cores_busy_time_is_the_union_of_its_instances_intervals():
    from batchinfer.cluster.busy import BusyUnion

    union = BusyUnion(2)
    union.add(0, [(0.0, 1.0), (2.0, 3.0)])
    # Instance 1 has a call in flight: it may still report an earlier interval.
    assert union.seconds(idle=set()) == 0.0
    union.add(1, [(0.5, 1.5)])
    assert union.seconds(idle=set()) == 1.5  # [0, 1.5] merged; [2, 3] waits for instance 1
    assert union.seconds(idle={1}) == 2.5  # instance 1 is idle: nothing earlier can come
    union.add(1, [(2.5, 4.0)])
    assert union.seconds(idle=set(), final=True) == 3.5


def test_a_core_actor_keeps_its_runtimes_start_up_lines_out_of_the_console(
    demo_kit, monkeypatch, capfd
):
    # Ray forwards every actor's stderr to the driver's console: without this, each of the
    # cluster's instances printed the emulated runtime's I and W start-up lines.
    from batchinfer.cluster.actors import CoreActor, NodeHost, model_files
    from batchinfer.options import RuntimeOptions, SimOptions
    from batchinfer.runtime.backends import make_backend

    monkeypatch.delenv("BATCHINFER_RKNN_LOG_LEVEL", raising=False)  # a value set: restored
    model = demo_kit.models["digits"]
    backend = make_backend(model, RuntimeOptions(backend="sim", sim=SimOptions(npu_ms=0.1)))
    host = NodeHost(backend)
    actor = CoreActor(host.begin(model_files(model)), 0, "nhwc")
    try:
        capfd.readouterr()
        assert "init_failed" not in actor.start((1, 8, 8, 1), "uint8")
        assert "RKNN" not in capfd.readouterr().err
    finally:
        actor.adapter.release()
        host.end()
        os.environ.pop("BATCHINFER_RKNN_LOG_LEVEL", None)  # the actor set it in this process
