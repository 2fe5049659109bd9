"""The bundled demo: 1,797 real handwritten digits, small models, a first-run kit.

The assets (``assets/``) are made by ``tools/build_demo_assets.py``: four ONNX models and
real ``.rknn`` files converted by rknn-toolkit2 for three chips, each with the conversion
settings it was made with. See ``assets/MODELS.md`` for the models and their measured
accuracies and ``assets/ATTRIBUTION.md`` for the data's source and licence.
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchinfer.demo.clip import DemoClip, write_demo_clip_if_possible
from batchinfer.demo.detection import DetectionSet, write_detection
from batchinfer.demo.digits import ASSETS, DIGIT_COUNT, load_digits, test_split, to_pixels
from batchinfer.errors import OutputExistsError, UsageError

MODEL_NAMES = (
    "digits.onnx",
    "digits-int8.onnx",
    "digits-lowcal.onnx",
    "pool224.onnx",
    "digits-det.onnx",
    "digits-prompt.onnx",
    "digits-seg.onnx",
    "digits-pose.onnx",
)

#: Chips the demo's .rknn files are converted for.
RKNN_PLATFORMS = ("rk3588", "rk3576", "rk3566")


@dataclass(frozen=True)
class RknnRecipe:
    """How one demo model becomes .rknn files: its float-input ONNX and calibration set.

    ``source`` takes normalised float NCHW input, as models exported for conversion do;
    the normalisation is in the conversion settings (``<stem>.config.json``) instead.
    """

    name: str
    source: str  # file in assets/
    calibration: str  # a name known to calibration_images()


RKNN_RECIPES = (
    RknnRecipe("digits", "digits-convert.onnx", "digits"),
    # The same float model, calibrated on the raw 0..16 values instead of 0..255 pixels.
    RknnRecipe("digits-lowcal", "digits-convert.onnx", "digits-raw"),
    RknnRecipe("pool224", "pool224-convert.onnx", "pool224"),
)
# The detector (tools/build_demo_detector.py) takes float NCHW pixels / 255 as YOLO models
# do, so its float model is the one converted (mean 0, std 255 in its settings).
DETECTOR_RECIPE = RknnRecipe("digits-det", "digits-det.onnx", "digits-det")
# The segmenter (tools/build_demo_segmenter.py): the detector plus a mask head, same input,
# so the same calibration scenes.
SEGMENTER_RECIPE = RknnRecipe("digits-seg", "digits-seg.onnx", "digits-det")
# The pose model (tools/build_demo_pose.py): the detector plus a keypoint head, likewise.
POSE_RECIPE = RknnRecipe("digits-pose", "digits-pose.onnx", "digits-det")
# The two-input model (image + class prompt): its image's normalisation in the settings, the
# prompt as it is; calibrated on the digits calibration set, each with a prompt.
PROMPT_RECIPE = RknnRecipe("digits-prompt", "digits-prompt-convert.onnx", "digits-prompt")
PROMPT_ITEMS = 100  # the two-input demo set: the first held-out digits, each with a prompt
PROMPT_SEED = 0
PROMPT_CLASSES = 5  # classes asked about per prompt: the digit's own and four others
CALIBRATION_PER_CLASS = 10  # digits calibration: the first 10 train images of each class
POOL224_CALIBRATION = 8
DETECTOR_CALIBRATION = 64  # the first 64 train scenes of the detection set, letterboxed

__all__ = [
    "ASSETS",
    "DETECTOR_RECIPE",
    "DIGIT_COUNT",
    "MODEL_NAMES",
    "POSE_RECIPE",
    "PROMPT_RECIPE",
    "RKNN_PLATFORMS",
    "RKNN_RECIPES",
    "SEGMENTER_RECIPE",
    "DemoKit",
    "RknnRecipe",
    "calibration_images",
    "calibration_indices",
    "load_digits",
    "make_npy_dataset",
    "model_path",
    "prompt_items",
    "rknn_recipe",
    "rknn_stems",
    "test_split",
    "to_pixels",
    "write_calibration_list",
    "write_demo",
    "write_prompt_dataset",
    "write_rknn_model",
]


@dataclass(frozen=True)
class DemoKit:
    """Where write_demo put things."""

    root: Path
    dataset: Path  # dataset/<label>/<nnnn>.png
    models: dict[str, Path]  # "digits", "digits-int8", "digits-lowcal", "pool224" -> .onnx
    rknn: dict[str, Path]  # "digits-rk3588", "digits-det-rk3588", ... -> .rknn (with
    # .onnx, .config.json beside)
    readme: Path
    count: int  # images written
    # detection/images/*.png + detection/instances.json (+ instances-seg.json, with masks)
    detection: DetectionSet | None = None
    prompt: Path | None = None  # prompt/<label>/<nnnn>.npz: digits-prompt's two inputs each
    # video/digits.mp4 + its ground truth (batchinfer.demo.clip); None without PyAV
    video: DemoClip | None = None


def model_path(name: str) -> Path:
    """Return the path of a bundled model, by file name ("digits.onnx") or stem ("digits")."""
    file_name = name if name.endswith(".onnx") else f"{name}.onnx"
    if file_name not in MODEL_NAMES:
        raise UsageError(
            f"There is no demo model {name!r}; choose one of {', '.join(MODEL_NAMES)}."
        )
    return ASSETS / file_name


def rknn_stems(
    *,
    detector: bool = False,
    prompt: bool = False,
    segmenter: bool = False,
    pose: bool = False,
) -> dict[str, tuple[RknnRecipe, str]]:
    """The classifiers' demo .rknn by file stem ("digits-rk3588") -> (recipe, platform).

    With ``detector``, the detector's instead ("digits-det-rk3588", ...); with ``prompt``,
    the two-input model's ("digits-prompt-rk3588", ...); with ``segmenter``, the
    segmenter's ("digits-seg-rk3588", ...); with ``pose``, the pose model's
    ("digits-pose-rk3588", ...).
    """
    chosen = [
        recipe
        for flag, recipe in (
            (detector, DETECTOR_RECIPE),
            (prompt, PROMPT_RECIPE),
            (segmenter, SEGMENTER_RECIPE),
            (pose, POSE_RECIPE),
        )
        if flag
    ]
    recipes = tuple(chosen[:1]) or RKNN_RECIPES
    return {f"{r.name}-{p}": (r, p) for r in recipes for p in RKNN_PLATFORMS}


def _all_rknn_stems() -> dict[str, tuple[RknnRecipe, str]]:
    return {
        **rknn_stems(),
        **rknn_stems(detector=True),
        **rknn_stems(prompt=True),
        **rknn_stems(segmenter=True),
        **rknn_stems(pose=True),
    }


def rknn_recipe(stem: str) -> tuple[RknnRecipe, str]:
    """(recipe, platform) of any demo .rknn stem: classifier, detector or segmenter."""
    stems = _all_rknn_stems()
    if stem not in stems:
        raise UsageError(f"There is no demo .rknn {stem!r}; choose one of {', '.join(stems)}.")
    return stems[stem]


def calibration_indices(labels: np.ndarray, test_index: np.ndarray) -> np.ndarray:
    """The digits calibrated on: the first CALIBRATION_PER_CLASS train indices of each class."""
    train = np.setdiff1d(np.arange(len(labels)), test_index)
    return np.concatenate([train[labels[train] == c][:CALIBRATION_PER_CLASS] for c in range(10)])


def calibration_images(name: str) -> list[tuple[str, np.ndarray]]:
    """The calibration set ``name`` as (file name, uint8 image) pairs, always the same.

    Made once per process (a kit's 15 .rknn models share four sets); the arrays are
    read-only, since every caller gets the same ones.

    ``digits``: the first CALIBRATION_PER_CLASS train images of each class, as 0..255
    pixels (8x8). ``digits-raw``: the same images as their raw 0..16 values, the mistake
    behind digits-lowcal. ``pool224``: POOL224_CALIBRATION seeded colour ramps (224x224x3).
    ``digits-det``: the first DETECTOR_CALIBRATION train scenes of the detection set,
    letterboxed to the detector's input (DETECTOR_INPUT square, grey 114 padding).
    """
    return list(_calibration_set(name))


@functools.cache
def _calibration_set(name: str) -> tuple[tuple[str, np.ndarray], ...]:
    pairs = _make_calibration_set(name)
    for _, image in pairs:
        image.setflags(write=False)
    return tuple(pairs)


def _make_calibration_set(name: str) -> list[tuple[str, np.ndarray]]:
    if name in ("digits", "digits-raw"):
        raw, labels = load_digits(raw=True)
        images = raw if name == "digits-raw" else to_pixels(raw)
        return [(f"{i:04d}.png", images[i]) for i in calibration_indices(labels, test_split())]
    if name == "pool224":
        rng = np.random.default_rng(1)
        ramp = np.add.outer(np.arange(224), np.arange(224))[..., None]
        out = []
        for i in range(POOL224_CALIBRATION):
            base, slope = rng.integers(0, 256, 3), rng.uniform(-0.5, 0.5, 3)
            image = np.clip(base + ramp * slope, 0, 255).astype(np.uint8)
            out.append((f"{i:04d}.png", image))
        return out
    if name == "digits-prompt":
        return calibration_images("digits")
    if name == "digits-det":
        from batchinfer.demo import detection

        return [
            (f"{i:04d}.png", detection.letterbox(scene.image, detection.DETECTOR_INPUT)[0])
            for i, scene in enumerate(detection.scenes("train", DETECTOR_CALIBRATION))
        ]
    raise UsageError(
        f"There is no calibration set {name!r}; use digits, digits-raw, pool224 or digits-det."
    )


def write_rknn_model(models_dir: Path, stem: str) -> Path:
    """Write the demo .rknn ``stem`` into ``models_dir`` with what converts and runs it.

    Beside ``<stem>.rknn``: ``<stem>.onnx`` (the float model it was converted from, which
    the sim and toolkit backends run), ``<stem>.config.json`` (the keyword arguments given
    to ``rknn.config()``) and ``<stem>.dataset.txt`` (the calibration list given to
    ``rknn.build()``, paths relative to the list), whose images go to
    ``calibration/<set>/``. Returns the .rknn path.
    """
    recipe, _ = rknn_recipe(stem)
    models_dir = Path(models_dir)
    shutil.copyfile(ASSETS / f"{stem}.rknn", models_dir / f"{stem}.rknn")
    shutil.copyfile(ASSETS / recipe.source, models_dir / f"{stem}.onnx")
    shutil.copyfile(ASSETS / f"{stem}.config.json", models_dir / f"{stem}.config.json")
    write_calibration_list(models_dir, stem)
    return models_dir / f"{stem}.rknn"


def write_calibration_list(models_dir: Path, stem: str) -> Path:
    """Write ``<stem>.dataset.txt`` and its images (``calibration/<set>/``); return the list."""
    from PIL import Image  # only the kit needs Pillow

    recipe, _ = rknn_recipe(stem)
    models_dir = Path(models_dir)
    folder = models_dir / "calibration" / recipe.calibration
    lines = []
    prompts = _calibration_prompts() if recipe is PROMPT_RECIPE else None
    for n, (file_name, image) in enumerate(calibration_images(recipe.calibration)):
        path = folder / file_name
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(path)
        line = path.relative_to(models_dir).as_posix()
        if prompts is not None:
            # A multi-input model's calibration line: one file per input, in input order.
            prompt_path = path.with_suffix(".prompt.npy")
            if not prompt_path.exists():
                np.save(prompt_path, prompts[n])
            line += " " + prompt_path.relative_to(models_dir).as_posix()
        lines.append(line)
    dataset = models_dir / f"{stem}.dataset.txt"
    dataset.write_text("\n".join(lines) + "\n")
    return dataset


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
    original order), ``detection/`` (the synthetic detection val split:
    ``images/<nnnnn>.png`` and a COCO ``instances.json``, see
    :mod:`batchinfer.demo.detection`), ``prompt/``, ``video/`` (a clip of moving digits
    and its ground truth, :mod:`batchinfer.demo.clip`; only when PyAV, the ``video``
    extra, is installed), ``models/*.onnx``, ``README.txt``. A non-empty ``target`` is
    refused unless ``overwrite``, which replaces only those entries.
    """
    from PIL import Image  # only the kit needs Pillow

    target = Path(target)
    _claim(target, overwrite, owned=_OWNED)
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
    rknn = {stem: write_rknn_model(models_dir, stem) for stem in _all_rknn_stems()}
    detection = write_detection(target / "detection")
    prompt = write_prompt_dataset(target / "prompt")
    video = write_demo_clip_if_possible(target / "video")
    readme = target / "README.txt"
    readme.write_text(_README.format(dir=target))
    return DemoKit(
        root=target,
        dataset=dataset,
        models=models,
        rknn=rknn,
        readme=readme,
        count=len(images),
        detection=detection,
        prompt=prompt,
        video=video,
    )


#: What a demo kit consists of: all that --overwrite may delete.
_OWNED = ("dataset", "detection", "prompt", "video", "models", "README.txt")


_README = """\
batchinfer demo kit
===================

dataset/            the 1,797 handwritten digits of the UCI "Optical Recognition of
                    Handwritten Digits" set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0),
                    as 8x8 grayscale PNGs: dataset/<label>/<index>.png
detection/          500 synthetic detection images (160-320 px, 1-6 of the held-out
                    digits each): detection/images/<nnnnn>.png and their boxes as COCO
                    detection/instances.json (category id = the digit);
                    detection/instances-seg.json: the same with each digit's mask (its
                    ink) as COCO RLE, for instance segmentation;
                    detection/instances-pose.json: the same with each digit's four
                    keypoints (the top, right, bottom and left ends of its ink), for pose
video/digits.mp4    a 10 s clip (300 frames, 30 fps, 320x240, H.264) of four held-out
                    digits moving across a drifting background (written when PyAV, the
                    "video" extra, is installed); where each digit is in every frame:
                    video/instances.json (COCO, file_name "digits.mp4#<frame>") and
                    video/gt/gt.txt (MOT: frame,id,x,y,w,h,1,class,1; frames and classes
                    1-based, classes named by the lines of video/gt/labels.txt)
models/digits.onnx          a small float classifier (uint8 [1,8,8,1] NHWC in, probs [1,10] out)
models/digits-int8.onnx     the same model quantised to int8 (stands in for an NPU model)
models/digits-lowcal.onnx   int8 too, but calibrated on the raw 0..16 values instead of the
                            0..255 pixels: it visibly loses accuracy (a device model to
                            evaluate against digits.onnx)
models/pool224.onnx         a near-free [1,224,224,3] model for throughput tests
models/digits-det.onnx      a small digit detector for detection/ (float [1,3,256,256] NCHW,
                            pixels/255 of the letterboxed image; YOLOv8 head in the
                            rknn_model_zoo layout: 9 outputs, box/class/score-sum per stride)
models/digits-seg.onnx      the detector with a YOLOv8-seg mask head (rknn_model_zoo
                            yolov8_seg layout: 13 outputs, box/class/score-sum/32 mask
                            coefficients per stride, then the prototype [1,32,64,64])
models/digits-pose.onnx     the detector with a YOLOv8-pose keypoint head (rknn_model_zoo
                            yolov8_pose layout: 3 x [1,74,H,W] box DFL + class logits,
                            then the keypoints [1,4,3,1344] decoded: x, y, score)
models/digits-prompt.onnx   a model with two inputs: image uint8 [1,8,8,1] and prompt float32
                            [1,10] (1 for the digits asked about); scores [1,10] = the digit
                            probabilities times the prompt
prompt/             100 held-out digits for digits-prompt: prompt/<label>/<index>.npz, each
                    holding the arrays "image" and "prompt" (one per input name)

models/<model>-<chip>.rknn  real NPU models converted by rknn-toolkit2 2.5.0 for rk3588,
                            rk3576 and rk3566 (int8; they take uint8 NHWC and normalise
                            inside). Beside each: <same>.onnx (the float model it was
                            converted from, which --backend sim and toolkit run),
                            <same>.config.json (what was passed to rknn.config) and
                            <same>.dataset.txt (the calibration images, in calibration/).

Try:

  batchinfer info {dir}/models/digits.onnx
  batchinfer run {dir}/dataset --model {dir}/models/digits.onnx --cores 0,1,2
  batchinfer run {dir}/dataset --model {dir}/models/digits.onnx --cores 0,1,2 --backend sim
  batchinfer info {dir}/models/digits-rk3588.rknn
  batchinfer run {dir}/prompt --model {dir}/models/digits-prompt.onnx --backend sim
  batchinfer run {dir}/video/digits.mp4 --model {dir}/models/digits-det.onnx --backend sim \
      --mean 0,0,0 --std 255,255,255 --out runs/clip
  batchinfer export draw runs/clip --out drawn-clip      (drawn-clip/digits.mp4)
  batchinfer run {dir}/dataset --model {dir}/models/digits-rk3588.rknn   (on an RK3588 board)

The models' accuracies and how they were made: MODELS.md in the batchinfer package
(batchinfer/demo/assets/), rebuilt by `python tools/build_demo_assets.py`.
"""


def _prompt(rng: np.random.Generator, label: int) -> np.ndarray:
    """A class prompt (1, 10) float32: 1 for the digit's class and PROMPT_CLASSES - 1 others."""
    others = rng.permutation([c for c in range(10) if c != label])[: PROMPT_CLASSES - 1]
    prompt = np.zeros((1, 10), np.float32)
    prompt[0, [label, *others]] = 1.0
    return prompt


def _calibration_prompts() -> list[np.ndarray]:
    """The prompts beside the digits calibration images (one each, seeded)."""
    _, labels = load_digits()
    rng = np.random.default_rng(PROMPT_SEED + 1)
    return [_prompt(rng, int(labels[i])) for i in calibration_indices(labels, test_split())]


def prompt_items(n: int = PROMPT_ITEMS) -> list[tuple[int, np.ndarray, np.ndarray, int]]:
    """The two-input demo set: (index, image uint8 (1, 8, 8, 1), prompt float32 (1, 10),
    label) for the first ``n`` held-out digits, each with a seeded class prompt."""
    images, labels = load_digits()
    rng = np.random.default_rng(PROMPT_SEED)
    out = []
    for i in test_split()[:n]:
        label = int(labels[i])
        out.append((int(i), images[i].reshape(1, 8, 8, 1), _prompt(rng, label), label))
    return out


def write_prompt_dataset(target: Path, n: int = PROMPT_ITEMS) -> Path:
    """Write the two-input demo set as ``target/<label>/<nnnn>.npz``, each holding the arrays
    ``image`` and ``prompt`` (digits-prompt's input names); return ``target``."""
    target = Path(target)
    for index, image, prompt, label in prompt_items(n):
        folder = target / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / f"{index:04d}.npz", image=image, prompt=prompt)
    return target


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
