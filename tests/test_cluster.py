"""Runs on a local Ray cluster: several simulated nodes on this machine (ray.cluster_utils),
each with three emulated NPU cores and its own emulated board.

One cluster serves the whole module (starting one costs ~10 s here). Its processes (the
raylets, GCS, and the worker processes Ray keeps for actors and tasks) are children of
this test process that outlive each test by design, so this module's leak guard leaves
the cluster's descendants alone and checks everything else as conftest's guard does; the
fixture then checks, once the cluster is stopped, that not one process of it is left.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import guard_leaks, local_ray_cluster
from runs import config, fast_sim
from test_cli import invoke, run_args
from test_eval_end_to_end import Workspace

ray = pytest.importorskip("ray")

# A local Ray cluster costs ~1 minute of this module: its own tier (pytest -m ray), run by .ci/run.
pytestmark = pytest.mark.ray

from batchinfer import run  # noqa: E402
from batchinfer.cluster import ClusterEngine, run_on_cluster  # noqa: E402
from batchinfer.cluster.connect import npu_nodes  # noqa: E402
from batchinfer.cluster.local import (  # noqa: E402
    LOCAL_NODE_CPUS,
)
from batchinfer.cluster.resources import node_resources  # noqa: E402
from batchinfer.engine import events as ev  # noqa: E402
from batchinfer.engine.planning.plan import model_input, plan_engine  # noqa: E402
from batchinfer.engine.sources import ArraySource, SyntheticSource  # noqa: E402
from batchinfer.evaluate import evaluate, load_job  # noqa: E402
from batchinfer.results import read_run  # noqa: E402
from batchinfer.runtime.backends import make_backend  # noqa: E402
from batchinfer.sink.rows import MemorySink  # noqa: E402

CORES = (0, 1, 2)


@pytest.fixture(scope="module")
def cluster():
    """Two simulated nodes, node0 (the head) and node1, each declaring cores 0-2."""
    yield from local_ray_cluster(CORES)


@pytest.fixture(autouse=True)
def no_leaks():
    """conftest's guard, except for the module cluster's processes (see the docstring)."""
    yield from guard_leaks(spare_descendants=True)


def _digits(demo_kit, tmp_path, *faults: str, **settings):
    settings.setdefault("out", tmp_path / "o")
    return config(
        dataset=demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(*faults),
        **settings,
    )


def _exactly_once(out: Path, n: int):
    table = read_run(out).predictions()
    assert sorted(table["index"].to_pylist()) == list(range(n))
    return table


class _Watch:
    """Keeps the events; calls ``act(self)`` after each batch of rows."""

    def __init__(self, act=None) -> None:
        self.events: list = []
        self.rows: list = []
        self.act = act

    def notify(self, event: object) -> None:
        self.events.append(event)
        if isinstance(event, ev.RowsDone):
            self.rows += event.rows
            if self.act is not None:
                self.act(self)

    def of(self, kind: type) -> list:
        return [e for e in self.events if isinstance(e, kind)]


def test_digits_on_two_nodes_give_the_single_board_predictions(cluster, demo_kit, tmp_path):
    one = run(_digits(demo_kit, tmp_path / "one", limit=400))
    out = tmp_path / "many"
    args = run_args(demo_kit.dataset, demo_kit.models["digits"], out, "--limit", "400")
    result = invoke(*args, "--ray", cluster.address)
    assert result.exit_code == 0, result.output
    assert "started: 400 items on cores 0,1,2 of 2 nodes (node0, node1)" in result.stderr
    assert f"complete: 400 succeeded, 0 errors; results in {out}" in result.stdout
    assert {"node0/0", "node1/2", "all"} <= {ln.split()[0] for ln in result.stdout.splitlines()}
    a = read_run(one.out).predictions()
    b = _exactly_once(out, 400)
    assert b["pred"].to_pylist() == a["pred"].to_pylist()
    assert set(a["node"].to_pylist()) == {None}
    # Items flow while the actors start, so which of them serve 400 quick items depends on
    # when each came up; each row names one of the run's (node, core)s.
    assert {(r["node"], r["core"]) for r in b.to_pylist()} <= {
        (n, c) for n in ("node0", "node1") for c in CORES
    }
    stats = read_run(out).core_stats().to_pylist()
    per_core = {(r["node"], r["core"]): r["items"] for r in stats if r["core"] is not None}
    assert sum(per_core.values()) == 400 and len(per_core) == 6
    assert stats[-1]["node"] is None and stats[-1]["items"] == 400
    manifest = read_run(out).manifest
    assert manifest.status == "complete"
    assert [n["name"] for n in manifest.raw["cluster"]["nodes"]] == ["node0", "node1"]

    # The cluster's run folder is an ordinary one: one board resumes it with 50 more items.
    again = run(_digits(demo_kit, tmp_path / "many", limit=450, resume=True, out=out))
    assert (again.skipped, again.succeeded, again.errors) == (400, 50, 0)
    rows = _exactly_once(out, 450).to_pylist()
    assert {r["node"] for r in rows[400:]} == {None} and rows[0]["node"] is not None
    stats = read_run(out).core_stats(invocation=None).to_pylist()
    assert {r["invocation"] for r in stats if r["node"] is not None} == {0}
    assert {r["invocation"] for r in stats if r["core"] is not None and r["node"] is None} == {1}


def test_an_actor_killed_mid_run_is_restarted_and_loses_no_item(cluster, demo_kit):
    """Through the engine hook (bench's way): synthetic items until the victim is back. Two
    instances per core: only the killed one is restarted, and it takes items again."""
    plan, nodes = _plan(demo_kit, cores=(0, 1), instances_per_core=2)
    source, sink = SyntheticSource(), MemorySink()
    state: dict = {}

    def act(watch: _Watch) -> None:
        if "victim" not in state:
            # Items flow while actors start: the victim is chosen once every one is up.
            if len(watch.rows) >= 60 and watch.of(ev.CoresReady):
                state["victim"] = victim = watch.of(ev.ChildReady)[-1]
                state["ready"] = len(watch.of(ev.ChildReady))
                os.kill(victim.pid, signal.SIGKILL)
            return
        if "back" not in state and len(watch.of(ev.ChildReady)) > state["ready"]:
            state["back"] = len(watch.rows)
        if watch.of(ev.CoreRetired) or len(watch.rows) >= state.get("back", 1e9) + 100:
            source.finish()

    watch = _Watch(act)
    result = ClusterEngine(plan, source, sink, nodes, [watch]).run()
    victim = state["victim"]
    assert (result.status, result.counts["errors"]) == ("complete", 0)
    assert sorted(r.index for r in sink.rows) == list(range(len(sink.rows)))  # exactly once
    assert not watch.of(ev.CoreRetired)
    assert [(e.node, e.core) for e in watch.of(ev.Restarted)] == [(victim.node, victim.key)]
    (again,) = watch.of(ev.ChildReady)[state["ready"] :]  # Ray restarted that actor only
    assert (again.node, again.key) == (victim.node, victim.key) and again.pid != victim.pid
    after = {(r.node, r.core, r.instance) for r in watch.rows[state["back"] :]}
    assert {(victim.node, victim.key, i) for i in (0, 1)} <= after  # both instances serve
    stats = {(r["node"], r["core"]): r for r in result.stats.table().to_pylist()}
    assert stats[(victim.node, victim.key)]["restarts"] == 1


def test_a_node_that_leaves_mid_run_takes_no_item_with_it(cluster, demo_kit, tmp_path):
    extra = cluster.add_node(
        node_name="extra", num_cpus=LOCAL_NODE_CPUS, resources=node_resources(CORES)
    )
    removed = []

    def remove(watch: _Watch) -> None:
        if not removed and sum(r.node == "extra" for r in watch.rows) >= 20:
            cluster.remove_node(extra)
            removed.append(len(watch.rows))

    watch = _Watch(remove)
    result = run_on_cluster(_digits(demo_kit, tmp_path, limit=900), cluster.address, [watch])
    assert removed and removed[0] < 900, "the node left before the run ended"
    assert (result.status, result.errors) == ("complete", 0)
    table = _exactly_once(result.out, 900)
    assert {"node0", "node1", "extra"} <= set(table["node"].to_pylist())
    assert any("node extra left the cluster" in w for w in result.warnings)
    assert {e.core for e in watch.of(ev.CoreRetired) if e.node == "extra"} == set(CORES)


def test_sim_faults_and_broken_files_behave_as_on_one_board(cluster, demo_kit, tmp_path):
    """init, crash, hang, None and a poison item on every node (each node is a board), and
    broken files, with the dataset on shared storage (read on the nodes)."""
    data = tmp_path / "data"
    for path in sorted(demo_kit.dataset.glob("*/*.png"))[:200]:
        (data / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, data / path.parent.name / path.name)
    (data / "0" / "empty.png").write_bytes(b"")
    (data / "0" / "text.png").write_text("not an image")
    # Early calls, so that every board's cores 0 and 1 reach them (call 1 is the canary).
    faults = ["init:core=2", "crash:core=1:call=8", "hang:core=0:call=6",
              "none:core=0:call=3", "crash:item=100"]  # fmt: skip
    cfg = config(
        dataset=data, model=demo_kit.models["digits"], backend="sim", sim=fast_sim(*faults),
        out=tmp_path / "o", timeout_s=3.0,  # a crash is noticed within it on a loaded machine
    )  # fmt: skip
    watch = _Watch()
    result = run_on_cluster(cfg, cluster.address, [watch], data="shared")
    assert result.status == "complete"
    table = _exactly_once(result.out, 202)
    errors = {r["id"]: r for r in table.to_pylist() if r["error"] is not None}
    bad = errors.pop(table["id"][100].as_py())
    inputs = {i: errors.pop(i) for i in ("0/empty.png", "0/text.png")}
    assert all(r["attempt"] == 0 and r["core"] is None for r in inputs.values())
    # Each board fires each fault once, so an item may be unlucky twice (hung on one board,
    # then hung or None on the other): then it is an error row, as on one board.
    injected = ("hung for more than", "returned None", "crashed")
    for row in errors.values():
        parts = row["error"].replace("; actor killed", "").split("; ")
        assert row["attempt"] == 2 and all(any(f in p for f in injected) for p in parts), row
    assert result.errors == 3 + len(errors)
    assert bad["attempt"] == 2 and bad["pred"] is None
    failures = bad["error"].split("; ")
    assert len(failures) == 2 and all("crashed" in f for f in failures), bad["error"]
    assert len({f.split(":")[0] for f in failures}) == 2  # two different cores
    assert {r["core"] for r in table.to_pylist() if r["error"] is None} == {0, 1}
    assert sum("core 2 of node" in w and "retired" in w for w in result.warnings) == 2
    # On the console, core 2 of both boards is said once (they failed alike at start-up).
    (said,) = [str(e.message) for e in watch.of(ev.Warned) if "retired" in str(e.message)]
    assert said.startswith("core 2 of nodes node0, node1 retired: NPU core 2 could not"), said
    hung = [w for w in result.warnings if "hung for more than" in w]
    assert len(hung) == 2, result.warnings  # once per board
    stats = {(r["node"], r["core"]): r for r in read_run(result.out).core_stats().to_pylist()}
    for node in ("node0", "node1"):
        assert stats[(node, 1)]["restarts"] >= 1  # the crash at call 8 of its board
        assert stats[(node, 0)]["restarts"] >= 1  # the hang
    assert read_run(result.out).manifest.raw["cluster"]["data"] == "shared"


def test_eval_on_the_cluster_gives_the_single_board_results(cluster, demo_kit, tmp_path):
    """jobs/digits.toml on 30 digits of each class: once on this board, once with --ray; the
    same predictions and top-1, per-core metrics for every (node, core), and the nodes in
    the record and history."""
    kit = tmp_path / "kit"
    (kit / "dataset").mkdir(parents=True)
    (kit / "models").symlink_to(demo_kit.root / "models")
    for folder in sorted(demo_kit.dataset.iterdir()):
        (kit / "dataset" / folder.name).mkdir()
        for png in sorted(folder.glob("*.png"))[:30]:
            shutil.copy(png, kit / "dataset" / folder.name / png.name)
    ws = Workspace(tmp_path / "ws", kit)
    # The emulator's short NPU time in the job: the nodes do not see BATCHINFER_SIM_* here.
    # The worst core's mean cosine depends on which items each core got: over six cores and
    # 300 items it varies from run to run around the job's floor, so that gate is loosened.
    gate = r"(\[gates\.core_cosine_min\][^\[]*?min = )0\.\d+"
    text = re.sub(gate, r"\g<1>0.5", ws.job.read_text())
    text = text.replace("instances_per_core = 2", "instances_per_core = 1")  # 6 actors start
    ws.job.write_text(text + "\n[device.runtime.sim]\nnpu_ms = 0.2\nhost_ms = 0\n")
    one = evaluate(load_job(ws.job))
    result = invoke("eval", ws.job, "--ray", cluster.address, "--no-progress")
    assert result.exit_code == 0, result.output
    assert "of 2 Ray nodes (node0, node1)" in result.stdout
    records = sorted((ws.out / "evals").glob("*/result.json"))
    assert len(records) == 2
    many = next(json.loads(r.read_text()) for r in records if r.parent.name != one.eval_id)
    assert one.exit_code == 0 and many["verdict"] == "pass"
    assert {g["metric"]: g.get("min") for g in many["gate_limits"]}["core_cosine_min"] == 0.5
    assert many["metrics"]["top1"] == one.metrics["top1"] < 1.0
    a = pq.read_table(one.record_dir / "items.parquet").to_pylist()
    b = pq.read_table(Path(many["items_file"])).to_pylist()
    assert [r["pred"] for r in b] == [r["pred"] for r in a]
    assert {r["node"] for r in a} == {None} and {r["node"] for r in b} == {"node0", "node1"}
    assert [c["place"] for c in many["per_core"]] == [f"node{n}/{c}" for n in (0, 1) for c in CORES]
    assert sum(c["items"] for c in many["per_core"]) == len(a) == 300
    assert all(c["items_per_s"] for c in many["per_core"])  # stats matched by (node, core)
    assert [n["name"] for n in many["device"]["cluster"]["nodes"]] == ["node0", "node1"]
    history = pq.read_table(ws.out / "history.parquet").to_pylist()
    assert [h["nodes"] for h in history] == [None, ["node0", "node1"]]


def test_a_skewed_core_of_one_node_fails_its_gate_and_is_named(cluster, demo_kit, tmp_path):
    """A third board whose core 2 computes differently (its emulator's faults come from its
    own environment, as a real board's settings are its own): core_cosine_min names
    odd/2, while core 2 of the other boards matches the float model."""
    odd = cluster.add_node(
        node_name="odd",
        num_cpus=LOCAL_NODE_CPUS,
        resources=node_resources(CORES),
        env_vars={"BATCHINFER_SIM_FAULTS": "skew:core=2"},
    )
    try:
        job = tmp_path / "skew.toml"
        job.write_text(
            f"""
[device]
model = "{demo_kit.models["digits"]}"
[device.runtime]
backend = "sim"
cores = [0, 2]
[device.runtime.sim]
npu_ms = 0.2
host_ms = 0.0
[device.ray]
address = "{cluster.address}"
[reference]
model = "{demo_kit.models["digits"]}"
[reference.runtime]
backend = "onnx"
cores = [0]
[dataset]
path = "{demo_kit.dataset}"
limit = 120
[gates.core_cosine_min]
min = 0.9999
"""
        )
        result = invoke("eval", job, "--no-progress")
    finally:
        cluster.remove_node(odd)
    assert result.exit_code == 1, result.output
    assert "FAIL        core_cosine_min >= 0.9999 (floor)" in result.stdout
    assert "worst core odd/2" in result.stdout
    (path,) = (tmp_path / "eval" / "skew" / "evals").glob("*/result.json")
    record = json.loads(path.read_text())
    cores = {c["place"]: c for c in record["per_core"]}
    assert set(cores) == {f"{n}/{c}" for n in ("node0", "node1", "odd") for c in (0, 2)}
    assert cores["odd/2"]["cosine_mean"] < 0.9999
    for place in ("node0/2", "node1/2", "odd/0"):
        assert cores[place]["cosine_mean"] == pytest.approx(1.0)


@pytest.mark.slow
def test_cluster_engine_runs_arrays_into_a_memory_sink(cluster, demo_kit):
    """The hook for eval: tensors in memory, a memory sink; each node its own board, two
    instances (actors) on its core 0, every one of which gets items (they start together)."""
    plan, nodes = _plan(demo_kit, cores=(0,), instances_per_core=2)
    plan = dataclasses.replace(plan, cores_start_together=True)
    rng = np.random.default_rng(0)
    shape, dtype = plan.preprocess.shape, plan.preprocess.dtype
    arrays = [rng.integers(0, 255, shape).astype(dtype) for _ in range(50)]
    sink = MemorySink(keep_outputs=True)
    engine = ClusterEngine(plan, ArraySource(arrays), sink, nodes)
    result = engine.run()
    assert result.status == "complete" and result.counts["succeeded"] == 50
    rows = sink.sorted_rows()
    assert [r.index for r in rows] == list(range(50))
    assert {(r.node, r.core, r.instance) for r in rows} == {
        (n, 0, i) for n in ("node0", "node1") for i in (0, 1)
    }
    for r in result.stats.table().to_pylist()[:2]:  # one core's busy time is a union
        assert 0 < r["utilization"] <= 1 and r["instances"] == 2
    reference = plan.backend.instance(None)
    try:
        for r in rows[:5]:
            expected = reference.infer([arrays[r.index]], data_format=plan.preprocess.layout)
            np.testing.assert_allclose(r.outputs[0], expected[0], rtol=1e-5)
    finally:
        reference.release()
    boards = {b.state_dir for b in engine.ray_pool.cluster_nodes.backends.values()}
    assert len(boards) == 2 and not any(os.path.exists(b) for b in boards)


def _batch_4_twin(demo_kit, tmp_path) -> Path:
    """The demo classifier's batch-4 twin (tools/bench_batch.py's batch_twin: the same
    weights), beside the batch-1 model it is compared with."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from bench_batch import batch_twin

    four = tmp_path / "digits-b4.onnx"
    four.write_bytes(batch_twin(demo_kit.models["digits"].read_bytes(), 4))
    return four


def test_a_batch_4_model_on_ray_predicts_what_its_batch_1_twin_does(cluster, demo_kit, tmp_path):
    """engine/batching.py's packing in the actors: calls of whole batches, a short last
    one (103 items), every item once, each its own row."""
    one = run(_digits(demo_kit, tmp_path / "one", limit=103))
    four = _batch_4_twin(demo_kit, tmp_path)
    cfg = dataclasses.replace(_digits(demo_kit, tmp_path, limit=103), model=four)
    result = run_on_cluster(cfg, cluster.address)
    assert (result.status, result.errors) == ("complete", 0)
    rows = _exactly_once(result.out, 103).to_pylist()
    expected = read_run(one.out).predictions().to_pylist()
    assert [r["pred"] for r in rows] == [r["pred"] for r in expected]
    np.testing.assert_allclose(
        [r["topk_score"] for r in rows], [r["topk_score"] for r in expected], atol=1e-5
    )
    # Items shared runtime calls: a call's items carry its latency (one per call).
    calls = {(r["node"], r["core"], r["instance"], r["latency_ms"]) for r in rows}
    assert len(calls) <= 103 // 2


def test_a_failing_item_in_a_batch_on_ray_is_the_only_error_row(cluster, demo_kit, tmp_path):
    """An item whose inference fails (the emulator's None on item 6) fails its batch's call:
    the actor infers that call's items again alone, and only item 6, failing alone on each
    core it is tried on, is an error row; its neighbours lose no attempt."""
    four = _batch_4_twin(demo_kit, tmp_path)
    cfg = dataclasses.replace(_digits(demo_kit, tmp_path, "none:item=6", limit=23), model=four)
    result = run_on_cluster(cfg, cluster.address)
    assert (result.status, result.errors) == ("complete", 1)
    rows = _exactly_once(result.out, 23).to_pylist()
    (failed,) = [r for r in rows if r["error"] is not None]
    assert failed["index"] == 6 and "returned None" in failed["error"], failed
    assert all(r["attempt"] == 1 for r in rows if r["error"] is None)


def _plan(demo_kit, cores=CORES, instances_per_core=1):
    cfg = config(dataset=demo_kit.dataset, model=demo_kit.models["digits"], backend="sim",
                 sim=fast_sim(npu_ms=2), cores=cores, startup_timeout_s=60.0,
                 instances_per_core=instances_per_core)  # fmt: skip
    backend = make_backend(cfg.model, cfg.runtime)
    shape, dtype = model_input(cfg.model, cfg)
    return plan_engine(cfg, backend, shape, dtype, kind=""), npu_nodes(ray.nodes())


@pytest.mark.parametrize("data", ["head", "shared"])
def test_a_csv_list_and_a_coco_json_run_on_the_cluster_as_on_one_board(
    cluster, demo_kit, tmp_path, data
):
    """Listed datasets are the engine's DatasetSource on Ray too: the same predictions, the
    list's columns carried, and a malformed line an error row."""
    from batchinfer.data.sources import open_source

    items = list(open_source(demo_kit.dataset))[:300]
    lst = tmp_path / "digits.csv"
    rows = [f"{demo_kit.dataset / i.id},{i.label},n{i.index}" for i in items]
    rows.insert(5, "too,many,fields,here")
    lst.write_text("path,label,note\n" + "\n".join(rows) + "\n")
    coco = tmp_path / "coco.json"
    coco.write_text(
        json.dumps({"images": [{"id": n, "file_name": i.id} for n, i in enumerate(items)]})
    )
    one = run(_digits(demo_kit, tmp_path / "one", limit=300))
    expected = read_run(one.out).predictions()["pred"].to_pylist()
    model = demo_kit.models["digits"]
    out = tmp_path / "csv"
    result = invoke(*run_args(lst, model, out), "--ray", cluster.address, "--ray-data", data)
    assert result.exit_code == 1, result.output  # the malformed line is an error row
    table = _exactly_once(out, 301).to_pylist()
    bad = table.pop(5)
    assert "line 7 of" in bad["error"] and bad["meta"] == {"note": None}
    assert [r["pred"] for r in table] == expected
    assert [r["meta"]["note"] for r in table] == [f"n{i.index}" for i in items]
    # Items flow while the actors start: the first nodes up may infer all 300.
    assert {r["node"] for r in table} <= {"node0", "node1"}
    out = tmp_path / "coco"
    args = run_args(coco, model, out, "--image-root", demo_kit.dataset)
    result = invoke(*args, "--ray", cluster.address, "--ray-data", data)
    assert result.exit_code == 0, result.output
    coco_rows = _exactly_once(out, 300).to_pylist()
    assert [r["pred"] for r in coco_rows] == expected
    assert [r["meta"]["image_id"] for r in coco_rows] == list(range(300))
