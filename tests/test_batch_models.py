"""Batch-N models (engine/batching.py): N items per runtime call, one row per item.

Each run compares a batch-4 model with its batch-1 twin (the same weights, tests/models.py)
on the emulator: the same prediction and scores for every item, a short last batch
included (the item counts are not multiples of 4).
"""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
from models import nhwc_uint8_model
from PIL import Image
from runs import config, fast_sim

from batchinfer import run
from batchinfer.engine.batching import (
    GATHER_WAIT_S,
    Packer,
    gather,
    split_batch,
    unbatchable_outputs,
)
from batchinfer.engine.planning.plan import plan_inference
from batchinfer.results import read_predictions


def _images(root, n: int, broken: tuple[int, ...] = ()):
    """``n`` 8x8 gray PNGs in 3 class folders, names in index order; ``broken`` ones are
    not images (their rows are errors)."""
    rng = np.random.default_rng(7)
    for i in range(n):
        folder = root / str(i % 3)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{i:05d}.png"
        if i in broken:
            path.write_bytes(b"not a png")
        else:
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(path)
    return root


def _twins(tmp_path):
    return (
        nhwc_uint8_model(tmp_path / "b1", "digits.onnx"),
        nhwc_uint8_model(tmp_path / "b4", "digits.onnx", batch=4),
    )


def _rows(tmp_path, name, data, model, **options):
    result = run(
        config(
            dataset=data,
            model=model,
            backend="sim",
            sim=options.pop("sim", fast_sim()),
            cores=(0, 1),
            out=tmp_path / "runs" / name,
            **options,
        )
    )
    return result, read_predictions(result.out).sort_by("id").to_pylist()


def _same_predictions(a: list[dict], b: list[dict]) -> None:
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert [r["pred"] for r in a] == [r["pred"] for r in b]
    assert [r["topk_index"] for r in a] == [r["topk_index"] for r in b]
    np.testing.assert_allclose(
        [r["topk_score"] for r in a], [r["topk_score"] for r in b], rtol=1e-5, atol=1e-5
    )


def _compare(tmp_path, n: int) -> None:
    data = _images(tmp_path / "data", n)
    one, four = _twins(tmp_path)
    r1, rows1 = _rows(tmp_path, "b1", data, one)
    r4, rows4 = _rows(tmp_path, "b4", data, four)
    assert (r1.status, r1.errors, r4.status, r4.errors) == ("complete", 0, "complete", 0)
    assert len(rows4) == n and sorted(r["index"] for r in rows4) == list(range(n))
    _same_predictions(rows1, rows4)
    # Several items shared a call: their rows carry the same call time.
    calls = {(r["core"], r["instance"], r["latency_ms"]) for r in rows4}
    assert len(calls) < n


def test_a_batch_4_model_predicts_what_its_batch_1_twin_does(tmp_path):
    _compare(tmp_path, 11)  # two full batches and a short one, at the least


@pytest.mark.slow
def test_a_batch_4_model_predicts_what_its_batch_1_twin_does_on_1001_items(tmp_path):
    _compare(tmp_path, 1001)


def test_an_unreadable_item_fails_alone(tmp_path):
    data = _images(tmp_path / "data", 11, broken=(5,))
    _, four = _twins(tmp_path)
    result, rows4 = _rows(tmp_path, "b4", data, four)
    assert result.errors == 1
    errors = [r["id"] for r in rows4 if r["error"] is not None]
    assert errors == ["2/00005.png"]
    good = [r for r in rows4 if r["error"] is None]
    assert len(good) == 10 and all(r["attempt"] == 1 for r in good)


def test_a_call_that_fails_charges_only_the_item_that_fails_alone(tmp_path):
    data = _images(tmp_path / "data", 11)
    _, four = _twins(tmp_path)
    result, rows = _rows(tmp_path, "b4", data, four, sim=fast_sim("none:item=6"))
    assert result.errors == 1
    failed = [r for r in rows if r["error"] is not None]
    assert [r["index"] for r in failed] == [6]
    assert "returned None: E RKNN: failed to submit!" in failed[0]["error"]
    # Its neighbours in the failed call were inferred again alone, at once: no attempt lost.
    assert all(r["attempt"] == 1 for r in rows if r["error"] is None)


@pytest.mark.slow
def test_a_crash_in_a_batch_call_ends_with_the_poison_item_alone_charged(tmp_path):
    data = _images(tmp_path / "data", 23)
    one, four = _twins(tmp_path)
    _, rows1 = _rows(tmp_path, "b1", data, one)
    result, rows = _rows(tmp_path, "b4", data, four, sim=fast_sim("crash:item=9"))
    assert result.errors == 1
    assert sorted(r["index"] for r in rows) == list(range(23))  # every item exactly once
    assert [r["index"] for r in rows if r["error"] is not None] == [9]
    good = [r for r in rows if r["error"] is None]
    _same_predictions([r for r in rows1 if r["index"] != 9], good)


def test_planning_splits_the_batch_off_the_item_shape(tmp_path):
    data = _images(tmp_path / "data", 3)
    _, four = _twins(tmp_path)
    planned = plan_inference(config(dataset=data, model=four, backend="sim"))
    engine = planned.engine
    assert engine.batch == 4 and engine.preprocess.shape == (1, 8, 8, 1)
    assert engine.item_lanes == 4 * engine.instances_per_core


def test_split_batch_reads_a_static_batch_only():
    assert split_batch((4, 8, 8, 3)) == (4, (1, 8, 8, 3))
    assert split_batch((1, 8, 8, 3)) == (1, (1, 8, 8, 3))
    assert split_batch((16,)) == (1, (16,))  # no batch axis to split


def test_outputs_without_the_batch_axis_cannot_be_split():
    assert unbatchable_outputs([np.zeros((4, 10)), np.zeros((4, 2, 3))], 4) is None
    why = unbatchable_outputs([np.zeros((4, 10)), np.zeros((1, 10))], 4)
    assert why is not None and "[1, 10]" in why


def test_gather_takes_what_is_queued_up_to_n():
    work: queue.SimpleQueue = queue.SimpleQueue()
    for i in range(6):
        work.put((i, i))
    group, stop = gather(work, 4)
    assert [t[0] for t in group] == [0, 1, 2, 3] and not stop
    group, stop = gather(work, 4)  # a short batch, after waiting GATHER_WAIT_S for more
    assert [t[0] for t in group] == [4, 5] and not stop


class _ArrivesWhileWaited(queue.SimpleQueue):
    """A work queue whose ``item`` is sent while gather waits for one (in its timed get):
    the item on its way arrives within the wait however slow the host is."""

    def __init__(self, item: tuple) -> None:
        super().__init__()
        self.item: tuple | None = item
        self.waits: list[float] = []

    def get(self, block: bool = True, timeout: float | None = None):
        if timeout is not None and self.item is not None:
            self.waits.append(timeout)
            self.put(self.item)
            self.item = None
        return super().get(block, timeout)


def test_gather_waits_briefly_for_an_item_on_its_way():
    work = _ArrivesWhileWaited((1, 1))
    work.put((0, 0))
    group, stop = gather(work, 2)
    assert [t[0] for t in group] == [0, 1] and not stop
    (waited,) = work.waits  # it waited, once, and no longer than GATHER_WAIT_S
    assert 0 < waited <= GATHER_WAIT_S <= 0.05


def test_gather_hands_over_what_it_has_at_stop():
    work: queue.SimpleQueue = queue.SimpleQueue()
    work.put((0, 0))
    work.put(None)
    assert gather(work, 4) == ([(0, 0)], True)  # not waiting GATHER_WAIT_S for more
    assert work.empty()


def test_a_short_batch_is_padded_with_zeros():
    packer = Packer([(1, 2, 2, 1)], ["uint8"], 3)
    full = [[np.full((1, 2, 2, 1), v, np.uint8)] for v in (7, 8, 9)]
    assert packer.pack(full)[0][:, 0, 0, 0].tolist() == [7, 8, 9]
    short = packer.pack([[np.full((1, 2, 2, 1), 5, np.uint8)]])
    assert short[0][:, 0, 0, 0].tolist() == [5, 0, 0]
    two = packer.pack([[np.full((1, 2, 2, 1), v, np.uint8)] for v in (1, 2)])
    assert two[0][:, 0, 0, 0].tolist() == [1, 2, 0]


@pytest.mark.slow  # two detection runs, ~3.5 s; the classifier twins above are its fast sibling
def test_a_batch_4_detector_finds_the_boxes_its_batch_1_twin_does(demo_kit, tmp_path):
    # The demo detector and its batch-4 twin (tools/bench_batch.py's batch_twin: the same
    # weights, the batch axis kept through each Reshape) on 9 scenes: two full calls and a
    # short one. Each item's boxes come from row j of its call's outputs, decoded alone.
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from bench_batch import batch_twin

    one = demo_kit.models["digits-det"]
    four = tmp_path / "digits-det-b4.onnx"
    four.write_bytes(batch_twin(one.read_bytes(), 4))
    data = tmp_path / "scenes"
    data.mkdir()
    for source in sorted(demo_kit.detection.images.glob("*.png"))[:9]:
        (data / source.name).write_bytes(source.read_bytes())
    r1, rows1 = _rows(tmp_path, "b1", data, one)
    r4, rows4 = _rows(tmp_path, "b4", data, four)
    assert (r1.status, r1.errors, r4.status, r4.errors) == ("complete", 0, "complete", 0)
    assert [r["id"] for r in rows1] == [r["id"] for r in rows4]
    assert sum(r["n_boxes"] for r in rows1) > 9  # the scenes hold digits to find
    for a, b in zip(rows1, rows4, strict=True):
        assert [x["class_id"] for x in a["boxes"]] == [x["class_id"] for x in b["boxes"]]
        for key in ("score", "x1", "y1", "x2", "y2"):
            np.testing.assert_allclose(
                [x[key] for x in a["boxes"]], [x[key] for x in b["boxes"]], atol=1e-3
            )
    assert len({(r["core"], r["instance"], r["latency_ms"]) for r in rows4}) < 9


def test_a_ray_core_actor_packs_a_calls_items_and_splits_a_failed_batch(tmp_path, monkeypatch):
    # cluster/actors.py without Ray: a call of 6 items to a batch-4 model is two runtime
    # calls (4, then 2 padded); the first fails (the emulator's None on item 3), so its
    # items are inferred again alone and item 3 alone fails. Each item's outputs are its
    # batch-1 twin's, in the call's order.
    # An actor quiets its process's runtime logs (rknn_log.quiet_instance_logs sets
    # BATCHINFER_RKNN_LOG_LEVEL to ERROR, in a Ray worker its own process): set here as the
    # actor sets it, so that it is undone after this test, or a later test of this xdist
    # worker misses the runtime's start-up lines (test_emulator_timing failed so).
    monkeypatch.setenv("BATCHINFER_RKNN_LOG_LEVEL", "ERROR")
    from batchinfer.cluster.actors import CoreActor, NodeHost, model_files
    from batchinfer.options import RuntimeOptions
    from batchinfer.runtime.backends import make_backend

    one, four = _twins(tmp_path)
    hosts, actors = [], []
    for model, faults, n in ((one, (), 1), (four, ("none:item=3",), 4)):
        options = RuntimeOptions(backend="sim", sim=fast_sim(*faults))
        hosts.append(NodeHost(make_backend(model, options)))  # the emulator's board, undone
        actors.append(CoreActor(hosts[-1].begin(model_files(model)), 0, "nhwc", batch=n))
    rng = np.random.default_rng(3)
    items = [rng.integers(0, 256, (1, 8, 8, 1), dtype=np.uint8) for _ in range(6)]
    try:
        infos = [a.start((1, 8, 8, 1), "uint8") for a in actors]
        assert [i["outputs"] for i in infos] == [[((1, 10), "float32")]] * 2  # a batch-1 row
        np.testing.assert_allclose(infos[1]["canary"][0], infos[0]["canary"][0], rtol=1e-5)
        alone, packed = (a.infer(list(range(6)), *items) for a in actors)
    finally:
        for actor, host in zip(actors, hosts, strict=True):
            actor.stop()
            host.end()
    assert [r.error is None for r in packed] == [True, True, True, False, True, True]
    assert "returned None" in str(packed[3].error)
    for j in (0, 1, 2, 4, 5):
        np.testing.assert_allclose(packed[j].outputs[0], alone[j].outputs[0], rtol=1e-5)
    assert (packed[4].t0, packed[4].t1) == (packed[5].t0, packed[5].t1)  # one (short) call
    assert packed[0].t0 != packed[1].t0  # the failed call's items, inferred again alone
