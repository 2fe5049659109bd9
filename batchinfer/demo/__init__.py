"""The bundled demo: 1,797 real handwritten digits, three small ONNX models, a first-run kit.

The assets (``assets/``) are made by ``tools/build_demo_assets.py``; see
``assets/MODELS.md`` for the models and their measured accuracies and
``assets/ATTRIBUTION.md`` for the data's source and licence.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchinfer.errors import OutputExistsError, UsageError

ASSETS = Path(__file__).resolve().parent / "assets"
MODEL_NAMES = ("digits.onnx", "digits-int8.onnx", "pool224.onnx")
DIGIT_COUNT = 1797

__all__ = [
    "ASSETS",
    "MODEL_NAMES",
    "DemoKit",
    "load_digits",
    "make_npy_dataset",
    "model_path",
    "test_split",
    "to_pixels",
    "write_demo",
]


@dataclass(frozen=True)
class DemoKit:
    """Where write_demo put things."""

    root: Path
    dataset: Path  # dataset/<label>/<nnnn>.png
    models: dict[str, Path]  # "digits", "digits-int8", "pool224" -> .onnx path
    readme: Path
    count: int  # images written


def to_pixels(values: np.ndarray) -> np.ndarray:
    """Return the dataset's 0..16 values as uint8 pixels 0..255, round(v * 255 / 16)."""
    v = np.asarray(values, dtype=np.int64)
    # Integer arithmetic: exact, and rounds 127.5 (v = 8) up, the same on every platform.
    return ((v * 255 + 8) // 16).astype(np.uint8)


def _npz() -> dict[str, np.ndarray]:
    path = ASSETS / "digits.npz"
    if not path.is_file():
        raise UsageError(
            f"The demo data {path} is missing; reinstall batchinfer or run "
            "python tools/build_demo_assets.py."
        )
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def load_digits(*, raw: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Return (images uint8 (1797, 8, 8), labels uint8 (1797,)); pixels 0..255, or 0..16 if raw."""
    data = _npz()
    images = data["images"] if raw else to_pixels(data["images"])
    return images, data["labels"]


def test_split() -> np.ndarray:
    """Return the sorted indices of the held-out digits the demo models were not trained on."""
    return _npz()["test_index"].astype(np.int64)


# pytest would otherwise collect test_split as a test when a test module imports it.
test_split.__test__ = False  # type: ignore[attr-defined]


def model_path(name: str) -> Path:
    """Return the path of a bundled model, by file name ("digits.onnx") or stem ("digits")."""
    file_name = name if name.endswith(".onnx") else f"{name}.onnx"
    if file_name not in MODEL_NAMES:
        raise UsageError(
            f"There is no demo model {name!r}; choose one of {', '.join(MODEL_NAMES)}."
        )
    return ASSETS / file_name


def _claim(target: Path, overwrite: bool, owned: tuple[str, ...]) -> None:
    """Make ``target`` an empty-enough directory, or refuse (see write_demo)."""
    if target.exists() and not target.is_dir():
        raise OutputExistsError(f"{target} exists and is not a folder; choose another path.")
    if target.is_dir() and any(target.iterdir()):
        if not overwrite:
            raise OutputExistsError(
                f"The folder {target} is not empty; choose another folder or pass --overwrite."
            )
        # Remove only what a demo kit consists of: the target may be a folder with other
        # things in it, and overwrite must never delete what we did not write.
        for name in owned:
            path = target / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()
    target.mkdir(parents=True, exist_ok=True)


def write_demo(target: Path, *, overwrite: bool = False) -> DemoKit:
    """Return the DemoKit written to ``target``: the digits as PNGs, the models, a README.

    Layout: ``dataset/<label>/<nnnn>.png`` (8x8 grayscale, ``nnnn`` the index in the
    original order), ``models/*.onnx``, ``README.txt``. A non-empty ``target`` is refused
    unless ``overwrite``, which replaces only those three entries.
    """
    from PIL import Image  # only the kit needs Pillow

    target = Path(target)
    _claim(target, overwrite, owned=("dataset", "models", "README.txt"))
    images, labels = load_digits()
    dataset = target / "dataset"
    for label in range(10):
        (dataset / str(label)).mkdir(parents=True)
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        Image.fromarray(image).save(dataset / str(label) / f"{index:04d}.png")

    models_dir = target / "models"
    models_dir.mkdir()
    models = {}
    for name in MODEL_NAMES:
        shutil.copyfile(ASSETS / name, models_dir / name)
        models[name.removesuffix(".onnx")] = models_dir / name
    readme = target / "README.txt"
    readme.write_text(_README.format(dir=target))
    return DemoKit(root=target, dataset=dataset, models=models, readme=readme, count=len(images))


_README = """\
batchinfer demo kit
===================

dataset/            the 1,797 handwritten digits of the UCI "Optical Recognition of
                    Handwritten Digits" set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0),
                    as 8x8 grayscale PNGs: dataset/<label>/<index>.png
models/digits.onnx        a small float classifier (uint8 [1,8,8,1] NHWC in, probs [1,10] out)
models/digits-int8.onnx   the same model quantised to int8 (stands in for an NPU model)
models/pool224.onnx       a near-free [1,224,224,3] model for throughput tests

Try:

  batchinfer info {dir}/models/digits.onnx
  batchinfer run {dir}/dataset --model {dir}/models/digits.onnx --cores 0,1,2
  batchinfer run {dir}/dataset --model {dir}/models/digits.onnx --cores 0,1,2 --backend sim

The models' accuracies and how they were made: MODELS.md in the batchinfer package
(batchinfer/demo/assets/), rebuilt by `python tools/build_demo_assets.py`.
"""


def make_npy_dataset(
    target: Path,
    n: int,
    shape: tuple[int, ...] = (1, 224, 224, 3),
    dtype: str = "uint8",
    seed: int = 0,
    *,
    overwrite: bool = False,
) -> list[Path]:
    """Return the paths of ``n`` random tensors written as ``target/00000.npy``, ... .

    Integer dtypes cover their whole range (uint8: 0..255); float dtypes are standard
    normal. Meant for throughput benchmarks of pool224.onnx.
    """
    if n < 1:
        raise UsageError(f"Asked for {n} tensors; ask for at least 1.")
    try:
        kind = np.dtype(dtype)
    except TypeError as exc:
        raise UsageError(f"{dtype!r} is not a numpy dtype; use e.g. 'uint8' or 'float32'.") from exc
    if kind.kind not in "iuf":
        raise UsageError(f"Cannot make random {kind.name} tensors; use an integer or float dtype.")
    target = Path(target)
    _claim(target, overwrite, owned=tuple(p.name for p in _npy_files(target)))
    rng = np.random.default_rng(seed)
    width = max(5, len(str(n - 1)))
    paths = []
    for i in range(n):
        if kind.kind == "f":
            array = rng.standard_normal(shape).astype(kind)
        else:
            info = np.iinfo(kind)
            array = rng.integers(info.min, info.max, size=shape, dtype=kind, endpoint=True)
        path = target / f"{i:0{width}d}.npy"
        np.save(path, array)
        paths.append(path)
    return paths


def _npy_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.npy")) if folder.is_dir() else []
