"""The library API for data in memory: batchinfer.infer and infer_iter (batchinfer/api.py).

Every test runs under the leak guard (conftest.no_leaks): no child process and no shared
memory segment may outlive it, which is what closing a stream early must guarantee.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from runs import config, fast_sim

import batchinfer
from batchinfer import run
from batchinfer.array_items import ArrayItems
from batchinfer.demo import load_digits
from batchinfer.errors import ConfigError, ModelError, RunInterrupted, UsageError
from batchinfer.options import OutputOptions, PreprocessOptions, RuntimeOptions
from batchinfer.results import read_predictions

N = 48
RUNTIME = RuntimeOptions(backend="sim", cores=(0, 1), sim=fast_sim(npu_ms=0.2))


def digits(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    images, labels = load_digits()
    return images[:n], labels[:n]


def test_infer_on_arrays_equals_run_on_the_same_tensors_as_files(demo_kit, tmp_path):
    images, _ = digits()
    folder = tmp_path / "tensors"
    folder.mkdir()
    for i, image in enumerate(images):  # the model's input shape: (1, 8, 8, 1) uint8
        np.save(folder / f"{i:03d}.npy", image.reshape(1, 8, 8, 1))
    model = demo_kit.models["digits"]
    result = run(config(folder, model, backend="sim", cores=(0, 1), out=tmp_path / "out"))
    ran = read_predictions(result.out).sort_by("index")

    table = batchinfer.infer(model, list(images), runtime=RUNTIME)

    assert table["index"].to_pylist() == list(range(N))
    assert table["id"].to_pylist() == [f"array/{i}" for i in range(N)]
    assert table["error"].null_count == N
    for column in ("pred", "topk_index", "topk_score"):
        assert table[column].to_pylist() == ran[column].to_pylist(), column
    # The same columns as a run's predictions, in the same order.
    assert table.schema.names == ran.schema.names


def test_one_stacked_array_is_its_items_and_outputs_can_be_kept(demo_kit):
    images, labels = digits()
    table = batchinfer.infer(
        demo_kit.models["digits"],
        images,  # (N, 8, 8): the model's axes of size 1 left out
        cores=(0, 1),
        runtime=RuntimeOptions(backend="sim", sim=fast_sim()),
        output=OutputOptions(topk=2, save_outputs=True),
    )
    assert table.num_rows == N
    assert len(table["topk_index"][0]) == 2
    outputs = np.array(table["out_output0"].to_pylist())
    assert outputs.shape == (N, 10)
    assert (outputs.argmax(axis=1) == table["pred"].to_numpy()).all()
    assert (table["pred"].to_numpy() == labels).mean() > 0.9


def test_infer_on_paths_decodes_them_like_a_dataset(demo_kit, tmp_path):
    paths = sorted(demo_kit.dataset.glob("*/*.png"))[::40]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    given = [*paths[:5], broken, *paths[5:]]

    table = batchinfer.infer(demo_kit.models["digits"], given, runtime=RUNTIME)

    assert table.num_rows == len(given)
    assert table["id"].to_pylist() == [str(p) for p in given]  # outside the current folder
    errors = table["error"].to_pylist()
    assert errors[5] is not None and "broken.png" in errors[5]  # its row, not an exception
    assert table["pred"][5].as_py() is None
    good = [i for i in range(len(given)) if i != 5]
    assert all(errors[i] is None for i in good)
    labels = np.array([int(given[i].parent.name) for i in good])
    preds = table["pred"].to_numpy(zero_copy_only=False)[good]
    assert (preds == labels).mean() > 0.9


def test_the_stream_yields_batches_as_items_finish_until_every_item_has_its_row(demo_kit):
    images, _ = digits()
    seen: list[int] = []
    with batchinfer.infer_iter(demo_kit.models["digits"], iter(images), runtime=RUNTIME) as s:
        for batch in s:
            seen += batch.column("index").to_pylist()
    assert sorted(seen) == list(range(N))
    assert s.result is not None and s.result.status == "complete"


def _endless_digits():
    images, _ = digits()
    return itertools.cycle(images)  # a stream that never ends on its own


def test_a_stream_left_early_stops_the_engine_and_leaks_nothing(demo_kit):
    with batchinfer.infer_iter(
        demo_kit.models["digits"], _endless_digits(), runtime=RUNTIME
    ) as stream:
        first = next(stream)
    assert first.num_rows >= 1
    assert stream.result is None  # closed, not finished
    with pytest.raises(StopIteration):
        next(stream)
    # conftest.no_leaks: no reader, worker or fork server, no segment left


def _consume_then_fail(model: Path) -> None:
    for batch in batchinfer.infer_iter(model, _endless_digits(), runtime=RUNTIME):
        if batch.num_rows:
            raise RuntimeError("the caller's own error")


def test_an_exception_in_the_caller_closes_an_abandoned_stream(demo_kit):
    with pytest.raises(RuntimeError, match="the caller's own error"):
        _consume_then_fail(demo_kit.models["digits"])
    # The stream was garbage once the loop's frame unwound: closed, nothing left
    # (conftest.no_leaks checks after the test).


def test_a_bad_array_in_a_stream_raises_after_the_rows_before_it(demo_kit):
    images, _ = digits(8)
    stream = [*images, np.zeros((3, 3), np.uint8)]
    rows = 0
    with pytest.raises(UsageError, match="item 8 of data has shape"):
        for batch in batchinfer.infer_iter(
            demo_kit.models["digits"], iter(stream), runtime=RUNTIME
        ):
            rows += batch.num_rows
    assert rows <= 8


@pytest.mark.parametrize(
    ("data", "kwargs", "match"),
    [
        ("one/path.png", {}, "one path"),
        ([], {}, "no items"),
        (iter([]), {}, "no items"),
        (42, {}, "pass a list"),
        ([np.zeros((8, 8), np.uint8), "a.png"], {}, "item 1 of data is a str"),
        (["a.png", np.zeros((8, 8), np.uint8)], {}, "among file paths"),
        ([np.zeros((5, 5), np.uint8)], {}, r"shape \(5, 5\) but the model takes \(1, 8, 8, 1\)"),
        ([np.zeros((8, 8), np.float32)], {}, "is float32 but the model takes uint8"),
        ([{"image": np.zeros((8, 8), np.uint8)}], {}, "models with one input"),
        ([np.zeros((8, 8), np.uint8)], {"cores": (0,)}, "disagree"),
        ([np.zeros((8, 8), np.uint8)], {"output": OutputOptions(out=Path("x"))}, "no run folder"),
        (
            [np.zeros((8, 8), np.uint8)],
            {"preprocess": PreprocessOptions(mean=(1.0,), std=(2.0,))},
            "mean",
        ),
    ],
)
def test_bad_arguments_raise_one_clear_sentence_before_anything_starts(
    demo_kit, data, kwargs, match
):
    with pytest.raises(UsageError, match=match):
        batchinfer.infer(demo_kit.models["digits"], data, runtime=RUNTIME, **kwargs)


def test_a_missing_model_is_a_model_error(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        batchinfer.infer(tmp_path / "none.onnx", [np.zeros((8, 8), np.uint8)])


def test_an_interrupted_run_is_not_a_silent_end(demo_kit):
    with batchinfer.infer_iter(
        demo_kit.models["digits"], _endless_digits(), runtime=RUNTIME
    ) as stream:
        next(stream)
        stream._engine.request_stop("a test")  # as a signal to the engine would
        with pytest.raises(RunInterrupted):
            for _ in stream:
                pass


def test_importing_batchinfer_stays_cheap():
    code = (
        "import sys, batchinfer; batchinfer.__all__; "
        "assert 'pyarrow' not in sys.modules and 'batchinfer.api' not in sys.modules; "
        "assert callable(batchinfer.infer) and 'batchinfer.api' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.slow  # a detector's start-up and decoding, twice: several seconds
def test_a_detector_on_image_paths_gives_the_boxes_a_run_gives(demo_kit, tmp_path):
    model = demo_kit.models["digits-det"]
    paths = sorted(demo_kit.detection.images.glob("*.png"))[:6]
    folder = tmp_path / "images"
    folder.mkdir()
    for path in paths:
        (folder / path.name).write_bytes(path.read_bytes())
    result = run(config(folder, model, backend="sim", cores=(0, 1), out=tmp_path / "out"))
    ran = read_predictions(result.out).sort_by("index")

    table = batchinfer.infer(model, paths, runtime=RUNTIME)

    assert table.schema.names == ran.schema.names
    for column in ("boxes", "n_boxes", "width", "height"):
        assert table[column].to_pylist() == ran[column].to_pylist(), column
    assert sum(table["n_boxes"].to_pylist()) > 0


def test_arrays_through_a_detector_are_refused_for_want_of_an_image(demo_kit):
    with pytest.raises(UsageError, match="original image"):
        batchinfer.infer(
            demo_kit.models["digits-det"], [np.zeros((64, 64, 3), np.uint8)], runtime=RUNTIME
        )


def test_a_stream_of_arrays_waits_while_rows_wait_for_the_caller():
    arrays = (np.zeros((8, 8), np.uint8) for _ in range(10))
    source = ArrayItems(arrays, None, (1, 8, 8, 1), np.dtype("uint8"), waiting=2)
    items = iter(source)
    next(items)
    source.rows_queued(2)  # two rows wait in the caller's queue: no more items for now
    taken = threading.Event()

    def take() -> None:
        next(items)
        taken.set()

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive() and not taken.is_set()  # it waits (a loaded machine too)
    source.rows_taken(1)  # the caller took one: the source goes on
    assert taken.wait(10)
    thread.join()
    source.rows_queued(5)
    source.close()  # the caller went away: no more items, no wait
    assert next(items, None) is None


def test_run_takes_a_dataset_and_the_clis_option_names(demo_kit, tmp_path):
    """`batchinfer.run("demo/dataset", model=...)` was a TypeError: run took a RunConfig only."""
    result = run(
        demo_kit.dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        cores="0,1",  # the CLI's text, parsed as --cores parses it
        instances_per_core=2,
        sim_npu_ms=0.2,
        sim_host_ms=0,
        limit=12,
        out=tmp_path / "o",
    )
    assert (result.status, result.succeeded, result.errors) == ("complete", 12, 0)
    given = json.loads((result.out / "manifest.json").read_text())["config"]
    assert given["runtime"]["cores"] == [0, 1] and given["runtime"]["instances_per_core"] == 2
    assert given["runtime"]["sim"]["npu_ms"] == 0.2 and given["limit"] == 12


def test_run_options_are_checked_as_a_job_files_are():
    cfg = batchinfer.RunConfig.of(
        "d", "m.onnx", runtime=RuntimeOptions(backend="sim", readers=2), cores=[0], conf=0.5
    )
    # A group given whole keeps what the single names do not change.
    assert (cfg.runtime.backend, cfg.runtime.readers, cfg.runtime.cores) == ("sim", 2, (0,))
    assert cfg.detect.conf == 0.5
    with pytest.raises(UsageError, match=r"'coress' is not an option of run.*did you mean cores"):
        batchinfer.RunConfig.of("d", "m.onnx", coress=(0,))
    # A near miss that neither name holds whole is suggested too, as a job file's key is.
    with pytest.raises(UsageError, match=r"did you mean instances_per_core\?"):
        batchinfer.RunConfig.of("d", "m.onnx", instance_per_core=2)
    with pytest.raises(ConfigError, match=r"detect\.conf must be at most 1"):
        batchinfer.RunConfig.of("d", "m.onnx", conf=2)
    with pytest.raises(ConfigError, match=r"runtime\.backend must be one of"):
        batchinfer.RunConfig.of("d", "m.onnx", backend="npu")
    with pytest.raises(UsageError, match="needs the model"):
        run("d")
    with pytest.raises(UsageError, match="not both"):
        run(batchinfer.RunConfig(dataset=Path("d"), model=Path("m.onnx")), cores=(0,))
