"""Models with several inputs (issue 26, item 4): each input fed from a .npz item's array of
its name, a manifest column (``--input NAME=COLUMN``) or the item itself, through one slot
view per input, with one data_format per input in the runtime call.

The demo's digits-prompt (tools/build_demo_assets.py --two-input) takes ``image`` uint8
[1,8,8,1] and ``prompt`` float32 [1,10]; its scores are the digit probabilities times the
prompt. Runs are compared with onnxruntime on the same inputs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from runs import config, fast_sim
from test_cli import FAST_SIM, assert_error, invoke

from batchinfer import demo, run
from batchinfer.cli.options import flag_of
from batchinfer.data.dataset import Item
from batchinfer.data.feeds import (
    FROM_COLUMN,
    FROM_ITEM,
    Feed,
    check_first_item,
    load_feeds,
    parse_input_map,
)
from batchinfer.data.folder import open_dataset
from batchinfer.engine.loop import Engine
from batchinfer.engine.planning.plan import model_input, plan_engine, plan_input_feeds
from batchinfer.engine.sources import ItemSource
from batchinfer.errors import DatasetError, InputError, UsageError
from batchinfer.evaluate.job import job_key
from batchinfer.results import read_predictions
from batchinfer.runtime.backends import make_backend
from batchinfer.sink.rows import MemorySink

MODEL = demo.ASSETS / "digits-prompt.onnx"
ITEMS = 24


def _session(model: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])


def _reference(image: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """digits-prompt.onnx's scores (10,) for one item, computed with onnxruntime."""
    out = _session(MODEL).run(None, {"image": image.reshape(1, 8, 8, 1), "prompt": prompt})
    return out[0].reshape(-1)


@pytest.fixture
def prompt_set(tmp_path: Path) -> Path:
    return demo.write_prompt_dataset(tmp_path / "prompt", n=ITEMS)


def _outputs(out: Path) -> dict[str, np.ndarray]:
    table = read_predictions(out, ["id", "error", "out_output0"]).to_pylist()
    assert all(r["error"] is None for r in table), [r["error"] for r in table if r["error"]]
    return {r["id"]: np.asarray(r["out_output0"], np.float32).reshape(-1) for r in table}


def _npz_reference(dataset: Path) -> dict[str, np.ndarray]:
    ref = {}
    for path in sorted(dataset.rglob("*.npz")):
        with np.load(path) as z:
            ref[path.relative_to(dataset).as_posix()] = _reference(z["image"], z["prompt"])
    return ref


# --------------------------------------------------------------------------- runs


def test_sim_run_of_the_two_input_demo_equals_onnxruntime(prompt_set: Path, tmp_path: Path):
    cfg = config(
        prompt_set, MODEL, backend="sim", sim=fast_sim(), save_outputs=True, out=tmp_path / "o"
    )
    result = run(cfg)
    assert result.status == "complete" and not result.errors
    got, want = _outputs(tmp_path / "o"), _npz_reference(prompt_set)
    assert got.keys() == want.keys() and len(got) == ITEMS
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
    # The manifest says what fed each input (and a resume's fingerprint holds it).
    record = json.loads((tmp_path / "o" / "manifest.json").read_text())
    inputs = json.dumps(record)
    assert '"source": "npz"' in inputs and '"name": "prompt"' in inputs


@pytest.mark.toolkit
def test_toolkit_run_of_the_two_input_rknn_matches_onnx_within_int8(tmp_path: Path):
    """rknn-toolkit2's int8 simulator on digits-prompt-rk3588.rknn against the float ONNX.

    Measured (tools/build_demo_assets.py --two-input --rknn, 100 demo items): scores differ
    by at most 0.0139 (mean 0.00035), top-1 agrees on every item. The tolerance is 0.03 (the
    scores are probabilities times a 0/1 prompt; int8 steps of the output are ~0.004).
    """
    pytest.importorskip("rknn.api")
    models = tmp_path / "models"
    models.mkdir()
    rknn = demo.write_rknn_model(models, "digits-prompt-rk3588")
    dataset = demo.write_prompt_dataset(tmp_path / "prompt", n=ITEMS)
    cfg = config(dataset, rknn, backend="toolkit", save_outputs=True, out=tmp_path / "o")
    result = run(cfg)
    assert result.status == "complete" and not result.errors
    got, want = _outputs(tmp_path / "o"), _npz_reference(dataset)
    assert got.keys() == want.keys() and len(got) == ITEMS
    worst = max(float(np.abs(got[k] - want[k]).max()) for k in want)
    assert worst <= 0.03, worst
    assert all(got[k].argmax() == want[k].argmax() for k in want)


def test_npz_faults_are_error_rows_naming_the_array(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    image = np.full((1, 8, 8, 1), 200, np.uint8)
    prompt = np.ones((1, 10), np.float32)
    np.savez(data / "a_good.npz", image=image, prompt=prompt)
    np.savez(data / "b_dtype.npz", image=image, prompt=prompt.astype(np.float64))
    np.savez(data / "c_shape.npz", image=image, prompt=np.ones(3, np.float32))
    np.savez(data / "d_missing.npz", image=image)
    (data / "e_broken.npz").write_bytes(b"not a zip file at all")
    np.savez(data / "f_nobatch.npz", image=image[0], prompt=prompt[0])  # batch axis left out
    cfg = config(data, MODEL, backend="sim", sim=fast_sim(), out=tmp_path / "o")
    result = run(cfg)
    rows = {r["id"]: r["error"] for r in read_predictions(tmp_path / "o").to_pylist()}
    assert len(rows) == 6  # nothing lost
    assert rows["a_good.npz"] is None and rows["f_nobatch.npz"] is None
    assert "array 'prompt'" in rows["b_dtype.npz"] and "float64" in rows["b_dtype.npz"]
    assert "array 'prompt'" in rows["c_shape.npz"] and "shape (3,)" in rows["c_shape.npz"]
    assert "no array 'prompt'" in rows["d_missing.npz"] and "'image'" in rows["d_missing.npz"]
    assert "not a .npz file" in rows["e_broken.npz"]
    assert result.errors == 4


# --------------------------------------------------------------------------- usage errors


def test_unknown_input_name_is_one_sentence_and_exit_2(prompt_set: Path, tmp_path: Path):
    args = ["run", prompt_set, "--model", MODEL, "--out", tmp_path / "o", *FAST_SIM]
    result = invoke(*args, "--input", "promt=mask")
    assert_error(result, 2, "'promt'", "'image', 'prompt'")
    assert not (tmp_path / "o").exists()


def test_an_input_nothing_feeds_is_exit_2(tmp_path: Path):
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(demo.load_digits()[0][0]).save(images / "a.png")
    args = ["run", images, "--model", MODEL, "--out", tmp_path / "o", *FAST_SIM]
    assert_error(invoke(*args), 2, "--input", "'prompt'", ".npz")


def test_malformed_input_pair_is_exit_2(prompt_set: Path, tmp_path: Path):
    args = ["run", prompt_set, "--model", MODEL, "--out", tmp_path / "o", *FAST_SIM]
    assert_error(invoke(*args, "--input", "prompt"), 2, "NAME=COLUMN")


def test_info_lists_the_inputs_and_what_feeds_them():
    result = invoke("info", MODEL, "--backend", "sim", "--input", "prompt=mask")
    assert result.exit_code == 0, result.output
    assert "the array 'image' of .npz items" in result.output
    assert "prompt           the manifest column 'mask'" in result.output
    assert_error(invoke("info", MODEL, "--input", "nope=x"), 2, "'nope'")


def test_parse_input_map():
    assert parse_input_map(("prompt=mask", " image = path ")) == {"prompt": "mask", "image": "path"}
    with pytest.raises(UsageError, match="twice"):
        parse_input_map(("a=b", "a=c"))


# --------------------------------------------------------------------------- columns


def _item(index: int, path: Path, **columns: object) -> Item:
    return Item(index, str(path), path.name, None, None, columns=columns)


def _prompt_feed() -> Feed:
    return Feed("prompt", (1, 10), "float32", FROM_COLUMN, "mask")


def test_first_item_without_the_column_or_with_a_wrong_type_is_a_usage_error(tmp_path: Path):
    feeds = [_prompt_feed()]
    with pytest.raises(UsageError, match=r"no column 'mask'.*'other'"):
        check_first_item(feeds, _item(0, tmp_path / "a.png", other=1), "list.csv")
    with pytest.raises(UsageError, match="holds dict values"):
        check_first_item(feeds, _item(0, tmp_path / "a.png", mask={"a": 1}), "list.csv")
    with pytest.raises(UsageError, match="have no columns"):
        check_first_item(feeds, Item(0, "a.png", "a.png", None, None), "folder")
    check_first_item(feeds, _item(0, tmp_path / "a.png", mask=[0.0] * 10), "list.csv")


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ([1, 2, 3], "holds 3|shape (3,)"),
        (None, "is empty"),
        ("[1, 2", "not a JSON list"),
        ("nothere.npy", "No such file"),
        ("notes.txt", "not a .npy file"),
        (["a"] * 10, "not a list of numbers"),
    ],
)
def test_a_bad_column_value_is_that_items_input_error(tmp_path: Path, value, needle):
    out = np.zeros((1, 10), np.float32)
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_feeds([_prompt_feed()], "", (value,), [out], "images", name="x", base=str(tmp_path))


class _ManifestItems(ItemSource):
    """Items as a manifest source gives them: an image path and the row's other columns."""

    needs_reader = True
    kind = "images"

    def __init__(self, items: list[Item], base: Path) -> None:
        self.items = items
        self.column_base = str(base)
        self.root = base / "list.csv"

    @property
    def total(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)


def test_manifest_columns_feed_the_other_input(tmp_path: Path):
    """The item's image feeds ``image``, the column ``mask`` feeds ``prompt``: a path to a
    .npy relative to the manifest's folder, a list, a JSON list in a string; one bad row."""
    images, _ = demo.load_digits()
    rng = np.random.default_rng(3)
    items, want = [], {}
    (tmp_path / "prompts").mkdir()
    for i in range(8):
        path = tmp_path / f"{i}.png"
        Image.fromarray(images[i]).save(path)
        prompt = (rng.random((1, 10)) < 0.5).astype(np.float32)
        if i % 3 == 0:
            np.save(tmp_path / "prompts" / f"{i}.npy", prompt)
            value: object = f"prompts/{i}.npy"
        elif i % 3 == 1:
            value = prompt.reshape(-1).tolist()
        else:
            value = json.dumps(prompt.reshape(-1).tolist())
        items.append(_item(i, path, mask=value, other="x"))
        want[path.name] = _reference(images[i], prompt)
    items.append(_item(8, tmp_path / "0.png", mask=[1.0, 2.0]))  # wrong count: error row

    cfg = config(tmp_path, MODEL, backend="sim", sim=fast_sim(), inputs=("prompt=mask",))
    model = Path(MODEL)
    backend = make_backend(model, cfg.runtime)
    shape, dtype = model_input(model, cfg, several=True)
    engine = plan_engine(cfg, backend, shape, dtype, "")
    source = _ManifestItems(items, tmp_path)
    engine = plan_input_feeds(cfg, model, engine, source)  # type: ignore[arg-type]
    assert [(f.name, f.source) for f in engine.feeds] == [
        ("image", FROM_ITEM),
        ("prompt", FROM_COLUMN),
    ]
    sink = MemorySink(keep_outputs=True)
    result = Engine(engine, source, sink).run()
    assert result.status == "complete"
    rows = {r.index: r for r in sink.rows}
    assert len(rows) == 9
    assert "holds 2" in rows[8].error or "shape (2,)" in rows[8].error
    for index in range(8):
        got = np.asarray(rows[index].outputs[0]).reshape(-1)
        np.testing.assert_array_equal(got, want[f"{index}.png"])


@pytest.mark.slow
def test_eval_job_runs_a_two_input_model_on_npz_items(prompt_set: Path, tmp_path: Path):
    """An eval job's sides feed the inputs as runs do (.npz arrays by input name)."""
    job = tmp_path / "prompt.toml"
    job.write_text(
        f"""name = "prompt"
[device]
model = "{MODEL}"
[device.runtime]
backend = "sim"
[device.runtime.sim]
npu_ms = 0.2
host_ms = 0
[reference]
model = "{MODEL}"
[reference.runtime]
backend = "onnx"
[dataset]
path = "{prompt_set}"
[gates.top1_agreement]
min = 1.0
[gates.errors]
max = 0
[output]
dir = "{tmp_path / "eval"}"
"""
    )
    result = invoke("eval", job)
    assert result.exit_code == 0, result.output
    assert "verdict: pass" in result.output


def test_a_single_input_model_takes_the_npz_array_named_after_its_input(tmp_path: Path):
    images, _ = demo.load_digits()
    data = tmp_path / "data"
    data.mkdir()
    for i in range(4):
        np.savez(data / f"{i}.npz", image=images[i].reshape(8, 8, 1))
    model = demo.model_path("digits")
    cfg = config(data, model, backend="sim", sim=fast_sim(), save_outputs=True, out=tmp_path / "o")
    assert run(cfg).errors == 0
    got = _outputs(tmp_path / "o")
    session = _session(model)
    for i in range(4):
        want = session.run(None, {"image": images[i].reshape(1, 8, 8, 1)})[0].reshape(-1)
        np.testing.assert_array_equal(got[f"{i}.npz"], want)


def test_resume_of_a_two_input_run_does_the_rest_once(prompt_set: Path, tmp_path: Path):
    cfg = config(prompt_set, MODEL, backend="sim", sim=fast_sim(), out=tmp_path / "o")
    assert run(dataclasses.replace(cfg, limit=10)).succeeded == 10
    again = dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, resume=True))
    result = run(again)
    assert (result.skipped, result.succeeded, result.errors) == (10, ITEMS - 10, 0)
    ids = read_predictions(tmp_path / "o", ["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted(set(ids)) and len(ids) == ITEMS  # nothing written twice


def test_ray_refuses_a_plan_that_feeds_inputs_separately(prompt_set: Path):
    from batchinfer.cluster.run import check_one_input

    cfg = config(prompt_set, MODEL, backend="sim", sim=fast_sim())
    backend = make_backend(MODEL, cfg.runtime)
    shape, dtype = model_input(MODEL, cfg, several=True)
    engine = plan_engine(cfg, backend, shape, dtype, "")
    check_one_input(engine)  # the image input alone: fine
    engine = plan_input_feeds(cfg, MODEL, engine, open_dataset(prompt_set))
    with pytest.raises(UsageError) as caught:
        check_one_input(engine)
    # An eval job sets it as [device.ray] address, the CLI as --ray.
    assert caught.value.render(flag_of).startswith("--ray feeds one tensor per item")
    said = caught.value.render(lambda field: job_key("device", field))
    assert said.startswith("device.ray.address feeds one tensor per item")
    assert said.endswith("run it without device.ray.address.")


def _tensor_model(path: Path) -> Path:
    """Three tensor inputs, none an image: ``feat`` float32 NCHW [1,4,2,2] (a feature map,
    the runtime's view NHWC), ``coords`` float32 [1,3], ``count`` int32 [2]; output [1,9] =
    feat summed over H,W, then coords, then count as floats."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 4, 2, 2]),
        helper.make_tensor_value_info("coords", TensorProto.FLOAT, [1, 3]),
        helper.make_tensor_value_info("count", TensorProto.INT32, [2]),
    ]
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 9])
    nodes = [
        helper.make_node("ReduceSum", ["feat", "axes"], ["sums"], keepdims=0),
        helper.make_node("Cast", ["count"], ["count_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["count_f", "zero"], ["count_row"]),
        helper.make_node("Concat", ["sums", "coords", "count_row"], ["out"], axis=1),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
        onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
    ]
    graph = helper.make_graph(nodes, "tensors", inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.save(model, path)
    return path


def test_a_model_without_image_inputs_takes_tensors_in_its_graphs_layout(tmp_path: Path):
    """A 4-D feature-map input is fed NCHW as the graph computes it (the runtime is told
    data_format nchw and transposes), the other tensors as they are."""
    model = _tensor_model(tmp_path / "tensors.onnx")
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(5)
    want = {}
    for i in range(3):
        feeds = {
            "feat": rng.standard_normal((1, 4, 2, 2)).astype(np.float32),
            "coords": rng.standard_normal((1, 3)).astype(np.float32),
            "count": np.array([i, 7], np.int32),
        }
        np.savez(data / f"{i}.npz", **feeds)
        want[f"{i}.npz"] = _session(model).run(None, feeds)[0].reshape(-1)
    cfg = config(data, model, backend="sim", sim=fast_sim(), save_outputs=True, out=tmp_path / "o")
    assert run(cfg).errors == 0
    got = _outputs(tmp_path / "o")
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value)
    record = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert '"layout": "nchw"' in json.dumps(record)
    info = invoke("info", model, "--backend", "sim")
    assert "(tensors [1, 4, 2, 2], NCHW)" in info.output, info.output


def test_a_folder_of_npz_files_is_a_dataset_kind_of_its_own(tmp_path: Path):
    np.savez(tmp_path / "a.npz", x=np.zeros(2))
    (tmp_path / "notes.txt").write_text("skipped")
    dataset = open_dataset(tmp_path)
    assert dataset.kind == "npz" and [i.id for i in dataset] == ["a.npz"]
    Image.fromarray(np.zeros((2, 2), np.uint8)).save(tmp_path / "b.png")
    with pytest.raises(DatasetError, match=r"mixes 1 images and 1 \.npz files"):
        open_dataset(tmp_path)


def test_a_rknn_prompt_input_with_mean_0_std_1_takes_its_graphs_float(tmp_path: Path):
    """rknn.config wants mean/std lists for every input once one has them; the prompt's
    (0 and 1) normalise nothing, so it is fed float32, while the image takes raw uint8."""
    from batchinfer.runtime import describe_model

    rknn = demo.write_rknn_model(tmp_path, "digits-prompt-rk3588")
    image, prompt = describe_model(rknn).inputs
    assert (image.dtype, image.normalised_inside, image.shape) == ("uint8", True, (1, 8, 8, 1))
    assert (prompt.dtype, prompt.normalised_inside, prompt.shape) == ("float32", False, (1, 10))


def test_sim_run_of_the_two_input_rknn_takes_image_arrays_nhwc(tmp_path: Path):
    """A .rknn's image input takes NHWC (1, 8, 8, 1) arrays from .npz items, as .npy items;
    the sim runs the float model it was converted from, normalising as the settings say."""
    rknn = demo.write_rknn_model(tmp_path, "digits-prompt-rk3588")
    dataset = demo.write_prompt_dataset(tmp_path / "prompt", n=8)
    out = tmp_path / "o"
    cfg = config(dataset, rknn, backend="sim", sim=fast_sim(), save_outputs=True, out=out)
    assert run(cfg).errors == 0
    got, want = _outputs(out), _npz_reference(dataset)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-5)


def test_a_job_files_preprocess_takes_inputs():
    from batchinfer.options import PreprocessOptions, from_mapping

    got = from_mapping(PreprocessOptions, {"inputs": ["prompt=mask"]}, "device.preprocess")
    assert got.inputs == ("prompt=mask",)
