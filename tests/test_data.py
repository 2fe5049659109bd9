"""Tests for batchinfer.data: dataset walking, labels, preprocessing and bad inputs."""

from __future__ import annotations

import os
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from dataset_files import touch
from PIL import Image

from batchinfer.data import load_into, open_dataset, preprocess_for
from batchinfer.data.preprocess import Preprocess
from batchinfer.errors import DatasetError, InputError, UsageError


def ids(ds) -> list[str]:
    return [item.id for item in ds]


# --------------------------------------------------------------------------- dataset


def test_order_is_sorted_recursive_and_interleaves_files_and_folders(tmp_path: Path) -> None:
    touch(tmp_path, "b.jpg", "a/z.png", "a/m/k.jpeg", "a/b.JPG", "c.png", "B.png", "ab.png")
    ds = open_dataset(tmp_path)
    # Code-point order by name within each folder; folder "a" sorts before "ab.png".
    assert ids(ds) == ["B.png", "a/b.JPG", "a/m/k.jpeg", "a/z.png", "ab.png", "b.jpg", "c.png"]
    assert ids(ds) == ids(open_dataset(tmp_path))  # stable across walks and opens


def test_len_index_path_and_id_agree_with_iteration(tmp_path: Path) -> None:
    touch(tmp_path, "x/1.png", "x/2.png", "y/3.png", "4.png")
    ds = open_dataset(tmp_path)
    items = list(ds)
    assert len(ds) == len(items) == 4
    assert [item.index for item in items] == [0, 1, 2, 3]
    for item in items:
        assert os.path.isabs(item.path)
        assert Path(item.path) == tmp_path / item.id
        assert Path(item.path).is_file()


def test_class_folders_with_integer_names_use_the_integer(tmp_path: Path) -> None:
    touch(tmp_path, "10/a.png", "2/b.png", "0/c.png", "2/d/e.png", "root.png")
    ds = open_dataset(tmp_path)
    assert ds.classes == ("0", "2", "10")  # label order
    assert ds.labels == {"0": 0, "10": 10, "2": 2}
    assert ds.class_map.source == "folder-numbers"
    got = {item.id: (item.label, item.label_name) for item in ds}
    assert got == {
        "0/c.png": (0, "0"),
        "10/a.png": (10, "10"),
        "2/b.png": (2, "2"),
        "2/d/e.png": (2, "2"),
        "root.png": (None, None),
    }


def test_class_folders_with_names_use_sorted_positions(tmp_path: Path) -> None:
    touch(tmp_path, "dog/1.png", "cat/2.png", "7/3.png", "zoo/notes.txt")
    ds = open_dataset(tmp_path)
    # "7" is not in all-integer company: positions. "zoo" holds no item but is a class.
    assert ds.classes == ("7", "cat", "dog", "zoo")
    assert ds.class_map.source == "folder-names"
    assert [(item.label, item.label_name) for item in ds] == [(0, "7"), (1, "cat"), (2, "dog")]
    assert ds.ignored == 1


def test_clashing_integer_class_names_are_refused(tmp_path: Path) -> None:
    touch(tmp_path, "7/a.png", "07/b.png")
    with pytest.raises(DatasetError, match=r"'07' and '7' in .* both mean label 7"):
        open_dataset(tmp_path)


def test_flat_folder_has_no_labels(tmp_path: Path) -> None:
    touch(tmp_path, "a.png", "b.webp", "c.GIF", "d.tiff", "e.bmp", "f.TIF")
    ds = open_dataset(tmp_path)
    assert ds.classes == ()
    assert len(ds) == 6
    assert all(item.label is None and item.label_name is None for item in ds)


def test_hidden_entries_are_skipped_and_other_files_counted(tmp_path: Path) -> None:
    touch(tmp_path, ".hidden.png", ".git/x.png", "c/.DS_Store", "a.png", "c/b.png")
    touch(tmp_path, "notes.txt", "c/labels.csv", "README")
    ds = open_dataset(tmp_path)
    assert ids(ds) == ["a.png", "c/b.png"]
    assert ds.ignored == 3


def test_what_tools_leave_behind_is_never_an_item_or_a_class_and_is_counted(
    tmp_path: Path,
) -> None:
    # A zip made on a Mac, unpacked on Linux, browsed from Windows, a Synology and Jupyter.
    touch(tmp_path, "3/a.png", "7/b.png", "__MACOSX/3/._a.png", "__MACOSX/7/._b.png")
    touch(tmp_path, "3/._a.png", "7/._b.png", ".DS_Store", "3/Thumbs.db", "7/desktop.ini")
    touch(tmp_path, "@eaDir/3/a.png", "7/@eaDir/b.png", ".ipynb_checkpoints/x.png")
    touch(tmp_path, ".hidden/c.png", "3/.d.png", "THUMBS.DB")
    ds = open_dataset(tmp_path)
    assert ds.labels == {"3": 3, "7": 7}
    assert ds.class_map.source == "folder-numbers"
    assert ids(ds) == ["3/a.png", "7/b.png"]
    assert [item.label for item in ds] == [3, 7]
    assert list(ds.item_paths()) == ["3/a.png", "7/b.png"]
    assert ds.skipped.count == 0  # leftovers are not "files that are not items"
    # A skipped folder counts once, whatever is under it; most first, then by name.
    assert ds.leftovers == {
        ".*": 2,
        "._*": 2,
        "@eaDir": 2,
        "Thumbs.db": 2,
        ".DS_Store": 1,
        ".ipynb_checkpoints": 1,
        "__MACOSX": 1,
        "desktop.ini": 1,
    }
    manifest = ds.manifest_json()
    assert manifest["leftovers"] == ds.leftovers
    assert manifest["label_rule"] == "class folders are integers: label = folder name"
    lines, warnings = ds.notes()
    assert lines == [
        "labels: class folders are integers: label = folder name (2 classes)",
        "skipped what other tools leave behind (never items or classes): .* 2, ._* 2, "
        "@eaDir 2, Thumbs.db 2, .DS_Store 1, .ipynb_checkpoints 1, __MACOSX 1, desktop.ini 1",
    ]
    assert warnings == []


def test_class_folders_mixing_integers_and_names_are_a_warning_naming_the_odd_ones(
    tmp_path: Path,
) -> None:
    touch(tmp_path, "0/a.png", "1/a.png", "2/a.png", "backup/a.png")
    ds = open_dataset(tmp_path)
    assert ds.labels == {"0": 0, "1": 1, "2": 2, "backup": 3}
    assert ds.label_rule == "sorted class folder names -> 0..3"
    lines, (warning,) = ds.notes()
    assert lines == ["labels: sorted class folder names -> 0..3 (4 classes)"]
    assert "mix integer names with other names ('backup' stand out)" in warning
    assert ds.manifest_json()["warnings"] == [warning]
    # Mostly names, one number: the number is the odd one.
    other = tmp_path / "other"
    touch(other, "cat/a.png", "dog/a.png", "7/a.png")
    assert "('7' stand out)" in open_dataset(other).notes()[1][0]
    # All names: no warning.
    plain = tmp_path / "plain"
    touch(plain, "cat/a.png", "dog/a.png")
    assert open_dataset(plain).notes()[1] == []


def test_npy_folder_is_kind_npy(tmp_path: Path) -> None:
    touch(tmp_path, "1/a.npy", "0/b.NPY", "info.json")
    ds = open_dataset(tmp_path)
    assert ds.kind == "npy"
    assert [(item.id, item.label) for item in ds] == [("0/b.NPY", 0), ("1/a.npy", 1)]


def test_mixed_folder_is_refused_with_both_counts(tmp_path: Path) -> None:
    touch(tmp_path, "a.png", "b.png", "c/d.npy")
    with pytest.raises(DatasetError, match=r"mixes 2 images and 1 \.npy tensors"):
        open_dataset(tmp_path)


@pytest.mark.parametrize("setup", ["missing", "file", "empty", "only_other_files"])
def test_unusable_roots_are_refused(tmp_path: Path, setup: str) -> None:
    root = tmp_path / "data"
    if setup == "file":
        root.write_text("x")
    elif setup == "empty":
        root.mkdir()
    elif setup == "only_other_files":
        touch(root, "a.txt", "b/c.csv", ".d.png")
    with pytest.raises(DatasetError) as info:
        open_dataset(root)
    message = str(info.value)
    assert str(root) in message
    assert "images" in message and ".npy" in message  # says what a dataset must hold
    if setup == "only_other_files":
        assert "only 2 other files" in message


def test_symlink_loops_are_not_followed_but_links_are(tmp_path: Path) -> None:
    root = tmp_path / "data"
    touch(root, "a/1.png")
    touch(tmp_path, "elsewhere/2.png")
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)
    (root / "b").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "c.png").symlink_to(root / "a" / "1.png")
    ds = open_dataset(root)
    assert ids(ds) == ["a/1.png", "b/2.png", "c.png"]
    assert ds.classes == ("a", "b")
    assert ds.leftovers == {"link back to an enclosing folder": 1}


def test_a_link_back_to_the_root_is_no_class_and_is_said(tmp_path: Path) -> None:
    # "all -> ." beside cat/ and dog/ was class 0: cat became 1 and dog 2, without a word.
    root = tmp_path / "data"
    touch(root, "cat/1.png", "dog/2.png")
    (root / "all").symlink_to(".", target_is_directory=True)
    ds = open_dataset(root)
    assert ds.classes == ("cat", "dog") and ids(ds) == ["cat/1.png", "dog/2.png"]
    lines, warnings = ds.notes()
    assert warnings == [
        f"1 folder link(s) in {root} lead back to a folder holding them (a loop); they are "
        "neither read nor classes: remove them."
    ]
    assert not any("leave behind" in line for line in lines)


def test_unreadable_subfolder_is_a_dataset_error(tmp_path: Path, monkeypatch) -> None:
    touch(tmp_path, "a/1.png", "b/2.png")
    real_scandir = os.scandir

    def scandir(path):  # chmod 0 does not stop root, so refuse the way the kernel would
        if os.path.basename(path) == "b":
            raise PermissionError(13, "Permission denied", path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(DatasetError, match=r"b \(Permission denied\); fix its permissions"):
        open_dataset(tmp_path)


def test_iter_from_skips_by_name_and_keeps_indexes(tmp_path: Path) -> None:
    touch(tmp_path, *(f"{i}.png" for i in range(6)))
    ds = open_dataset(tmp_path)
    kept = list(ds.iter_from(lambda key: int(key.split(b".")[0]) % 2 == 0))
    assert [(item.index, item.id) for item in kept] == [(1, "1.png"), (3, "3.png"), (5, "5.png")]


def test_dataset_pickles_for_spawned_processes(tmp_path: Path) -> None:
    touch(tmp_path, "x/1.png", "y/2.png")
    ds = pickle.loads(pickle.dumps(open_dataset(tmp_path)))
    assert len(ds) == 2 and ids(ds) == ["x/1.png", "y/2.png"] and ds.labels == {"x": 0, "y": 1}


# --------------------------------------------------------------------------- preprocess_for


def test_defaults_follow_the_model_input() -> None:
    spec = preprocess_for((1, 224, 224, 3), "uint8")
    assert (spec.layout, spec.color, spec.size, spec.channels) == ("nhwc", "rgb", (224, 224), 3)
    assert spec.nbytes == 224 * 224 * 3
    gray = preprocess_for((1, 8, 8, 1), np.dtype("uint8"))
    assert (gray.color, gray.shape) == ("gray", (1, 8, 8, 1))
    onnx = preprocess_for((None, 3, 32, 48), "float32")  # NCHW, dynamic batch
    assert (onnx.layout, onnx.shape, onnx.size, onnx.nbytes) == (
        "nchw",
        (1, 3, 32, 48),
        (32, 48),
        3 * 32 * 48 * 4,
    )
    assert preprocess_for((1, 28, 28), "float32").color == "gray"


def test_overrides_change_size_layout_dtype_and_color() -> None:
    spec = preprocess_for(
        (1, 224, 224, 3),
        "float16",
        size=(100, 120),
        layout="nchw",
        dtype_override="float32",
        color="bgr",
        mean=(1, 2, 3),
        std=[4],
    )
    assert spec.shape == (1, 3, 100, 120)
    assert (spec.dtype, spec.color, spec.size) == ("float32", "bgr", (100, 120))
    assert spec.mean == (1.0, 2.0, 3.0) and spec.std == (4.0, 4.0, 4.0)
    dynamic = preprocess_for(("batch", "h", "w", 3), "uint8", size=(10, 20))
    assert dynamic.shape == (1, 10, 20, 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"shape": (1, 8, 8, 3), "color": "gray"}, "does not fit"),
        ({"shape": (1, 8, 8, 1), "color": "rgb"}, "does not fit"),
        ({"shape": (1, 8, 8, 3), "dtype": "float32", "mean": (1, 2)}, "has 2 values"),
        ({"shape": (1, 8, 8, 3), "dtype": "float32", "std": (1, 0, 1)}, "zero"),
        ({"shape": (1, 8, 8, 3), "mean": (1, 2, 3)}, "takes raw 0..255 pixels"),
        ({"shape": (1, 8, 8, 3), "dtype": "float64"}, "not one RKNNLite takes"),
        ({"shape": (1, 8, 8, 3), "dtype": "bogus"}, "Unknown dtype"),
        ({"shape": (1, 8, 8, 3), "layout": "hwc"}, "Unknown layout"),
        ({"shape": (1, 8, 8, 5)}, "channel axis"),
        ({"shape": (1, None, None, 3)}, "pass preprocess.size"),
        ({"shape": (1, 64), "size": (8, 8)}, "preprocess.size applies to image inputs"),
        ({"shape": (1, 64), "dtype": "float32", "mean": (1,)}, "mean/std apply"),
    ],
)
def test_impossible_specs_are_usage_errors(kwargs: dict, match: str) -> None:
    kwargs = {"dtype": "uint8", **kwargs}
    with pytest.raises(UsageError, match=match):
        preprocess_for(kwargs.pop("shape"), kwargs.pop("dtype"), **kwargs)


def test_validate_for_refuses_what_images_cannot_feed() -> None:
    preprocess_for((1, 64), "float32").validate_for("npy")
    with pytest.raises(UsageError, match="not an image shape"):
        preprocess_for((1, 64), "float32").validate_for("images")
    with pytest.raises(UsageError, match="batch of 4"):
        preprocess_for((4, 8, 8, 3), "uint8").validate_for("images")
    with pytest.raises(UsageError, match="cannot be fed as int8"):
        preprocess_for((1, 8, 8, 3), "int8").validate_for("images")
    with pytest.raises(UsageError, match="do not apply"):
        preprocess_for((1, 8, 8, 3), "float32", mean=(1,)).validate_for("npy")


# --------------------------------------------------------------------------- images

H, W = 12, 16  # not square, so a swapped height and width shows


@pytest.fixture
def rgb_png(tmp_path: Path) -> tuple[str, np.ndarray]:
    pixels = np.random.default_rng(1).integers(0, 256, (H, W, 3), dtype=np.uint8)
    path = tmp_path / "img.png"
    Image.fromarray(pixels).save(path)
    return str(path), pixels


def reference(pixels: np.ndarray, spec: Preprocess) -> np.ndarray:
    """The straightforward computation load_into must match: float64 all the way."""
    x = pixels.astype(np.float64)
    if spec.color == "gray":
        x = x[..., None]
    if spec.color == "bgr":
        x = x[..., ::-1]
    if spec.mean is not None:
        x = x - np.array(spec.mean)
    if spec.std is not None:
        x = x / np.array(spec.std)
    if spec.layout == "nchw":
        x = x.transpose(2, 0, 1)
    if len(spec.shape) == 3:
        x = x[..., 0]
    return x[None].astype(spec.dtype)


NORMALISATIONS = [
    ("uint8", None, None),
    ("int16", None, None),
    ("float32", None, None),
    ("float32", (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)),
    ("float32", (127.5, 120.0, 100.0), None),
    ("float32", None, (255.0, 128.0, 64.0)),
    ("float16", (123.7, 116.3, 103.5), (58.4, 57.1, 57.4)),
]


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("color", ["rgb", "bgr", "gray"])
@pytest.mark.parametrize(("dtype", "mean", "std"), NORMALISATIONS)
def test_images_are_written_as_the_reference_computes(
    rgb_png, layout: str, color: str, dtype: str, mean, std
) -> None:
    path, pixels = rgb_png
    if color == "gray":
        pixels = np.asarray(Image.open(path).convert("L"))
        mean = None if mean is None else mean[:1]
        std = None if std is None else std[:1]
    channels = 1 if color == "gray" else 3
    model_shape = (1, H, W, channels)
    spec = preprocess_for(model_shape, dtype, layout=layout, color=color, mean=mean, std=std)
    out = np.full(spec.shape, 77, dtype=spec.dtype)
    load_into(path, spec, out, "images")
    expected = reference(pixels, spec)
    if dtype == "float16":
        np.testing.assert_allclose(out, expected, rtol=2e-3, atol=2e-3)
    elif dtype == "float32":
        np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-5)
    else:
        np.testing.assert_array_equal(out, expected)


def test_three_dimensional_gray_input(rgb_png) -> None:
    path, _ = rgb_png
    spec = preprocess_for((1, H, W), "float32", mean=(100,), std=(50,))
    out = np.empty(spec.shape, np.float32)
    load_into(path, spec, out, "images")
    gray = np.asarray(Image.open(path).convert("L"), dtype=np.float64)
    np.testing.assert_allclose(out[0], (gray - 100) / 50, rtol=1e-6)


def test_uint8_image_is_written_into_the_callers_buffer(rgb_png) -> None:
    path, pixels = rgb_png
    spec = preprocess_for((1, H, W, 3), "uint8")
    slot = bytearray(spec.nbytes)  # stands in for a shared-memory slot
    out = np.frombuffer(slot, dtype=np.uint8).reshape(spec.shape)
    load_into(path, spec, out, "images")
    assert bytes(slot) == pixels.tobytes()


def test_resize_stretches_with_bilinear(tmp_path: Path) -> None:
    pixels = np.random.default_rng(2).integers(0, 256, (30, 41, 3), dtype=np.uint8)
    path = tmp_path / "big.png"
    Image.fromarray(pixels).save(path)
    spec = preprocess_for((1, 224, 224, 3), "uint8", size=(H, W))
    out = np.zeros(spec.shape, np.uint8)
    load_into(str(path), spec, out, "images")
    expected = Image.fromarray(pixels).resize((W, H), Image.Resampling.BILINEAR)
    np.testing.assert_array_equal(out[0], np.asarray(expected))


def test_large_jpeg_decodes_close_to_a_full_decode(tmp_path: Path) -> None:
    # A smooth picture, so JPEG's reduced-size decoding and a full decode can agree.
    yy, xx = np.mgrid[0:480, 0:640]
    pixels = np.stack([xx * 255 // 639, yy * 255 // 479, (xx + yy) * 255 // 1118], axis=-1)
    path = tmp_path / "photo.jpg"
    Image.fromarray(pixels.astype(np.uint8)).save(path, quality=95)
    spec = preprocess_for((1, 48, 64, 3), "uint8")
    out = np.zeros(spec.shape, np.uint8)
    load_into(str(path), spec, out, "images")
    full = Image.open(path).convert("RGB").resize((64, 48), Image.Resampling.BILINEAR)
    difference = np.abs(out[0].astype(int) - np.asarray(full, dtype=int))
    assert difference.mean() < 2.0 and difference.max() < 16


def test_gray_and_palette_sources_convert_without_warnings(tmp_path: Path) -> None:
    gray = np.arange(H * W, dtype=np.uint8).reshape(H, W)
    Image.fromarray(gray).save(tmp_path / "gray.png")
    palette = Image.fromarray(gray).convert("P")
    palette.info["transparency"] = 0
    palette.save(tmp_path / "pal.png", transparency=0)
    spec = preprocess_for((1, H, W, 3), "uint8")
    out = np.zeros(spec.shape, np.uint8)
    load_into(str(tmp_path / "gray.png"), spec, out, "images")
    assert np.array_equal(out[0], np.repeat(gray[..., None], 3, axis=-1))
    load_into(str(tmp_path / "pal.png"), spec, out, "images")  # warnings are errors here
    assert out.shape == (1, H, W, 3)


# --------------------------------------------------------------------------- npy


@pytest.fixture
def tensor() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((1, 6, 5, 3)).astype(np.float32)


def test_npy_is_read_into_the_callers_buffer(tmp_path: Path, tensor: np.ndarray) -> None:
    np.save(tmp_path / "t.npy", tensor)
    spec = preprocess_for(tensor.shape, "float32")
    slot = bytearray(spec.nbytes)
    out = np.frombuffer(slot, dtype=np.float32).reshape(spec.shape)
    load_into(str(tmp_path / "t.npy"), spec, out, "npy")
    assert bytes(slot) == tensor.tobytes()


def test_npy_read_makes_no_temporary_array(tmp_path: Path) -> None:
    big = np.random.default_rng(4).integers(0, 256, (1, 224, 224, 3), dtype=np.uint8)
    np.save(tmp_path / "big.npy", big)
    spec = preprocess_for(big.shape, "uint8")
    out = np.empty(spec.shape, np.uint8)
    tracemalloc.start()
    try:
        load_into(str(tmp_path / "big.npy"), spec, out, "npy")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert np.array_equal(out, big)
    # A temporary copy would allocate all 150 kB; parsing the header takes ~20 kB.
    assert peak < big.nbytes // 2, peak


@pytest.mark.parametrize("variant", ["no_batch_axis", "big_endian", "fortran", "version_2"])
def test_npy_variants_are_accepted(tmp_path: Path, tensor: np.ndarray, variant: str) -> None:
    path = tmp_path / "t.npy"
    if variant == "no_batch_axis":
        np.save(path, tensor[0])
    elif variant == "big_endian":
        np.save(path, tensor.astype(">f4"))
    elif variant == "fortran":
        np.save(path, np.asfortranarray(tensor))
    else:
        with open(path, "wb") as f:
            np.lib.format.write_array(f, tensor, version=(2, 0))
    spec = preprocess_for(tensor.shape, "float32")
    out = np.zeros(spec.shape, np.float32)
    load_into(str(path), spec, out, "npy")
    np.testing.assert_array_equal(out, tensor)


# --------------------------------------------------------------------------- bad inputs

IMAGE_SPEC = dict(shape=(1, 8, 8, 3), dtype="uint8")
NPY_SPEC = dict(shape=(1, 6, 5, 3), dtype="float32")


def write_bad(tmp_path: Path, case: str) -> Path:
    good = np.random.default_rng(5).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    tensor = np.zeros(NPY_SPEC["shape"], np.float32)
    if case == "empty_png":
        path = tmp_path / "empty.png"
        path.touch()
    elif case in ("truncated_png", "truncated_jpeg"):
        fmt = "png" if case == "truncated_png" else "jpg"
        full = tmp_path / f"full.{fmt}"
        Image.fromarray(good).save(full)
        path = tmp_path / f"cut.{fmt}"
        data = full.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif case == "text_named_png":
        path = tmp_path / "notes.png"
        path.write_text("this is not a picture\n")
    elif case == "missing":
        path = tmp_path / "gone.png"
    elif case == "empty_npy":
        path = tmp_path / "empty.npy"
        path.touch()
    elif case == "not_npy":
        path = tmp_path / "fake.npy"
        path.write_bytes(b"PK\x03\x04 a zip, say")
    elif case == "wrong_dtype":
        path = tmp_path / "f64.npy"
        np.save(path, tensor.astype(np.float64))
    elif case == "wrong_rank":
        path = tmp_path / "rank2.npy"
        np.save(path, tensor.reshape(6, 15))
    elif case == "wrong_shape":
        path = tmp_path / "chw.npy"
        np.save(path, tensor[0].transpose(2, 0, 1))
    elif case == "pickled":
        path = tmp_path / "objects.npy"
        np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    elif case == "truncated_npy":
        full = tmp_path / "full.npy"
        np.save(full, tensor)
        path = tmp_path / "short.npy"
        path.write_bytes(full.read_bytes()[:-10])
    else:
        raise AssertionError(case)
    return path


@pytest.mark.parametrize(
    ("case", "kind", "message"),
    [
        ("empty_png", "images", "the file is empty"),
        ("truncated_png", "images", "truncated"),
        ("truncated_jpeg", "images", "truncated"),
        ("text_named_png", "images", "not an image"),
        ("missing", "images", "No such file"),
        ("empty_npy", "npy", "the file is empty"),
        ("not_npy", "npy", "not a .npy file"),
        ("wrong_dtype", "npy", "has dtype float64, which RKNNLite does not take"),
        ("wrong_rank", "npy", r"has shape \(6, 15\) but the model takes \(1, 6, 5, 3\)"),
        ("wrong_shape", "npy", r"has shape \(3, 6, 5\) but the model takes \(1, 6, 5, 3\)"),
        ("pickled", "npy", "never unpickles"),
        ("truncated_npy", "npy", "truncated"),
    ],
)
def test_bad_items_raise_input_error_naming_the_file(
    tmp_path: Path, case: str, kind: str, message: str
) -> None:
    path = write_bad(tmp_path, case)
    shape, dtype = (IMAGE_SPEC if kind == "images" else NPY_SPEC).values()
    spec = preprocess_for(shape, dtype)
    out = np.zeros(spec.shape, spec.dtype)
    with pytest.raises(InputError, match=message) as info:
        load_into(str(path), spec, out, kind)
    assert str(path) in str(info.value)
    with pytest.raises(InputError) as info:
        load_into(str(path), spec, out, kind, name=f"class/{path.name}")
    assert f"class/{path.name}" in str(info.value)
    assert str(tmp_path) not in str(info.value)


def _npy_with_long_header(tensor: np.ndarray, header_bytes: int) -> bytes:
    """A valid .npy (version 1.0) whose header is padded to ``header_bytes``."""
    header = repr({"descr": tensor.dtype.str, "fortran_order": False, "shape": tensor.shape})
    padded = header.encode().ljust(header_bytes - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(padded).to_bytes(2, "little") + padded + tensor.tobytes()


def test_a_npy_header_longer_than_the_first_read_is_read_whole(tmp_path: Path) -> None:
    # The reader takes a .npy's first 4096 bytes in one read: a longer header continues.
    tensor = np.random.default_rng(2).random(NPY_SPEC["shape"]).astype(np.float32)
    path = tmp_path / "long.npy"
    path.write_bytes(_npy_with_long_header(tensor, 6000))
    assert np.array_equal(np.load(path), tensor)  # numpy reads it: a valid file
    spec = preprocess_for(**NPY_SPEC)
    out = np.zeros(spec.shape, spec.dtype)
    load_into(str(path), spec, out, "npy")
    assert np.array_equal(out, tensor)
    cut = tmp_path / "cut.npy"
    cut.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(InputError, match=f"{cut}: its .npy header is truncated"):
        load_into(str(cut), spec, out, "npy")


def test_a_wrong_buffer_is_a_programming_error(rgb_png) -> None:
    path, _ = rgb_png
    spec = preprocess_for((1, H, W, 3), "uint8")
    with pytest.raises(ValueError, match="expected C-contiguous"):
        load_into(path, spec, np.zeros((1, H, W, 3), np.float32), "images")
    with pytest.raises(ValueError, match="expected C-contiguous"):
        load_into(path, spec, np.zeros((1, W, H, 3), np.uint8).transpose(0, 2, 1, 3), "images")


def test_preprocess_pickles_for_spawned_processes() -> None:
    spec = preprocess_for((1, 3, 8, 8), "float32", mean=(1, 2, 3), std=(4, 5, 6))
    assert pickle.loads(pickle.dumps(spec)) == spec
