"""Tests for image decoding: bit depth, orientation, transparency, pixel limit, drafts, hints."""

from __future__ import annotations

import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from batchinfer.data import load_into, preprocess_for
from batchinfer.data.preprocess import Preprocess
from batchinfer.errors import InputError, UsageError


def load(path: Path, spec: Preprocess) -> np.ndarray:
    out = np.full(spec.shape, 7, dtype=spec.dtype)
    load_into(str(path), spec, out, "images")
    return out[0]


# --------------------------------------------------------------------------- 16-bit and float

GRADIENT = (np.arange(64 * 256, dtype=np.uint32).reshape(64, 256) * 4).astype(np.uint16)


@pytest.mark.parametrize("fmt", ["PNG", "TIFF", "PPM"])
def test_16_bit_gray_is_scaled_not_clipped(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"g.{fmt.lower()}"
    Image.fromarray(GRADIENT).save(path, format=fmt)  # opens as I;16 (PNG, TIFF) or I (PPM)
    expected = GRADIENT / 257.0  # 0..65535 -> 0..255
    gray = load(path, preprocess_for((1, 64, 256, 1), "uint8"))[..., 0]
    assert np.abs(gray.astype(float) - expected).max() <= 0.5 + 1e-6
    assert (gray == 255).mean() < 0.01  # clipping made 99.6 % of it white
    # A float input keeps the 16-bit precision instead of rounding to 8 bits.
    exact = load(path, preprocess_for((1, 64, 256, 3), "float32"))
    np.testing.assert_allclose(exact, np.repeat(expected[..., None], 3, axis=-1), atol=1e-3)


def test_16_bit_gray_is_resized_and_normalised(tmp_path: Path) -> None:
    path = tmp_path / "g.png"
    Image.fromarray(GRADIENT).save(path)
    spec = preprocess_for((1, 32, 128, 1), "float32", mean=(127.5,), std=(127.5,))
    out = load(path, spec)[..., 0]
    reference = Image.fromarray(GRADIENT.astype(np.float32) / 257).resize(
        (128, 32), Image.Resampling.BILINEAR
    )
    np.testing.assert_allclose(out, (np.asarray(reference) - 127.5) / 127.5, atol=1e-4)


def test_float_images_are_taken_as_zero_to_one(tmp_path: Path) -> None:
    path = tmp_path / "f.tiff"
    values = np.linspace(-0.5, 1.5, 64 * 64, dtype=np.float32).reshape(64, 64)
    Image.fromarray(values).save(path)  # mode F
    out = load(path, preprocess_for((1, 64, 64, 1), "uint8"))[..., 0]
    np.testing.assert_array_equal(out, np.rint(np.clip(values, 0, 1) * 255).astype(np.uint8))


# --------------------------------------------------------------------------- EXIF orientation


def with_orientation(pixels: np.ndarray, orientation: int, path: Path, **save) -> Path:
    img = Image.fromarray(pixels)
    exif = img.getexif()
    exif[0x0112] = orientation
    img.save(path, exif=exif.tobytes(), **save)
    return path


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied_as_viewers_do(tmp_path: Path, orientation: int) -> None:
    pixels = np.random.default_rng(orientation).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    path = with_orientation(pixels, orientation, tmp_path / "phone.png")
    upright = np.asarray(ImageOps.exif_transpose(Image.open(path)).convert("RGB"))
    h, w = upright.shape[:2]
    np.testing.assert_array_equal(load(path, preprocess_for((1, h, w, 3), "uint8")), upright)
    as_stored = preprocess_for((1, 12, 20, 3), "uint8", exif_orientation=False)
    np.testing.assert_array_equal(load(path, as_stored), pixels)


def test_jpeg_draft_asks_for_the_size_in_the_files_orientation(tmp_path: Path) -> None:
    # Stored 1600x400, shown rotated (400 wide, 1600 tall); the model takes 400x100. The
    # file needs full width 400 in its own frame, so libjpeg may not scale it down: a
    # request in the shown frame would decode at 1/4 and stretch 4x (a blur).
    pixels = np.random.default_rng(0).integers(0, 256, (400, 1600, 3), dtype=np.uint8)
    path = with_orientation(pixels, 6, tmp_path / "tall.jpg", quality=95)
    out = load(path, preprocess_for((1, 100, 400, 3), "uint8")).astype(int)
    reference = ImageOps.exif_transpose(Image.open(path)).convert("RGB")
    reference = reference.resize((400, 100), Image.Resampling.BILINEAR)
    difference = np.abs(out - np.asarray(reference, dtype=int))
    assert difference.mean() < 1.0, difference.mean()


def test_jpeg_draft_to_gray_matches_a_full_decode(tmp_path: Path) -> None:
    yy, xx = np.mgrid[0:960, 0:1280]
    pixels = np.stack([xx * 255 // 1279, yy * 255 // 959, (xx + yy) * 255 // 2238], axis=-1)
    path = with_orientation(pixels.astype(np.uint8), 8, tmp_path / "smooth.jpg", quality=95)
    spec = preprocess_for((1, 64, 48, 1), "uint8")  # shown 960 wide, 1280 tall
    out = load(path, spec)[..., 0].astype(int)
    full = ImageOps.exif_transpose(Image.open(path)).convert("L")
    full = np.asarray(full.resize((48, 64), Image.Resampling.BILINEAR), dtype=int)
    difference = np.abs(out - full)
    assert difference.mean() < 2.0 and difference.max() < 16
    no_draft = load(path, preprocess_for((1, 64, 48, 1), "uint8", jpeg_draft=False))[..., 0]
    assert np.abs(no_draft.astype(int) - full).max() <= 1


# --------------------------------------------------------------------------- transparency


@pytest.fixture
def black_ink(tmp_path: Path) -> Path:
    """Black RGB everywhere; the drawing (a square) is only in the alpha channel."""
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[2:6, 2:6, 3] = 255
    rgba[0, 0, 3] = 128
    path = tmp_path / "logo.png"
    Image.fromarray(rgba).save(path)
    return path


def test_transparency_is_composited_over_white_by_default(black_ink: Path) -> None:
    out = load(black_ink, preprocess_for((1, 8, 8, 3), "uint8"))
    assert (out[2:6, 2:6] == 0).all()
    assert (out[7, 7] == 255).all()
    assert (out[0, 0] == 127).all()  # half transparent black over white
    gray = load(black_ink, preprocess_for((1, 8, 8, 1), "uint8"))
    assert gray[7, 7, 0] == 255 and gray[3, 3, 0] == 0


def test_background_is_configurable_or_off(black_ink: Path) -> None:
    out = load(black_ink, preprocess_for((1, 8, 8, 3), "uint8", background="0,128,255"))
    assert out[7, 7].tolist() == [0, 128, 255] and (out[3, 3] == 0).all()
    dropped = load(black_ink, preprocess_for((1, 8, 8, 3), "uint8", background=None))
    assert (dropped == 0).all()  # alpha dropped, as Image.convert("RGB") does


def test_palette_and_gray_transparency_are_composited(tmp_path: Path) -> None:
    gray = np.zeros((8, 8), np.uint8)
    gray[4:, :] = 200
    Image.fromarray(gray).convert("P").save(tmp_path / "p.png", transparency=0)
    Image.fromarray(gray).save(tmp_path / "l.png", transparency=0)
    Image.fromarray(np.stack([gray, (gray > 0) * 255], -1).astype(np.uint8), "LA").save(
        tmp_path / "la.png"
    )
    for name in ("p.png", "l.png", "la.png"):
        out = load(tmp_path / name, preprocess_for((1, 8, 8, 3), "uint8", background="black"))
        assert (out[:4] == 0).all() and (out[4:] == 200).all(), name
        out = load(tmp_path / name, preprocess_for((1, 8, 8, 1), "uint8"))
        assert (out[:4] == 255).all() and (out[4:] == 200).all(), name


@pytest.mark.parametrize(
    ("text", "rgb"),
    [("white", (255, 255, 255)), ("#102030", (16, 32, 48)), (" 1,2,3 ", (1, 2, 3))],
)
def test_parse_background(text: str, rgb: tuple[int, int, int]) -> None:
    from batchinfer.data import parse_background

    assert parse_background(text) == rgb
    assert parse_background("None") is None


@pytest.mark.parametrize("bad", ["mauvish", "1,2", "1,2,300", (1, 2), (0.5, 1, 2), (1, 2, -1)])
def test_bad_backgrounds_are_usage_errors(bad) -> None:
    with pytest.raises(UsageError, match="is not a colour"):
        Preprocess((1, 8, 8, 3), "uint8", background=bad)


# --------------------------------------------------------------------------- pixel limit


def png_header_only(path: Path, width: int, height: int) -> Path:
    """A tiny PNG whose header claims width x height gray pixels (no real data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = zlib.compress(b"\0" * 1000)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data))
    return path


def test_a_decompression_bomb_is_refused_from_its_header_without_a_warning(
    tmp_path: Path,
) -> None:
    path = png_header_only(tmp_path / "bomb.png", 13000, 13000)  # 1.9x Pillow's limit
    spec = preprocess_for((1, 8, 8, 3), "uint8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(InputError, match=r"169,000,000 pixels, over the limit of 89,478,485"):
            load(path, spec)
    assert caught == []


def test_the_pixel_limit_is_configurable_both_ways(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "img.png"
    Image.fromarray(np.zeros((20, 20, 3), np.uint8)).save(path)
    with pytest.raises(InputError, match="400 pixels, over the limit of 399"):
        load(path, preprocess_for((1, 8, 8, 3), "uint8", max_pixels=399))
    load(path, preprocess_for((1, 8, 8, 3), "uint8", max_pixels=400))
    # A limit above Pillow's own (here made tiny) is ours to set; Pillow's is restored.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    load(path, preprocess_for((1, 8, 8, 3), "uint8", max_pixels=1000))
    load(path, preprocess_for((1, 8, 8, 3), "uint8", max_pixels=None))
    assert Image.MAX_IMAGE_PIXELS == 100
    with pytest.raises(UsageError, match="at least 1"):
        preprocess_for((1, 8, 8, 3), "uint8", max_pixels=0)


# --------------------------------------------------------------------------- hints


def test_mean_std_on_a_model_that_normalises_inside_is_refused_without_a_dtype_hint() -> None:
    # The digits model takes uint8; feeding pixels/255 as float32 ran at 10 % top-1.
    for dtype_override in (None, "float32"):
        with pytest.raises(UsageError) as info:
            preprocess_for(
                (1, 8, 8, 1), "uint8", dtype_override=dtype_override, mean=(0,), std=(255,)
            )
        message = str(info.value)
        assert "raw 0..255 pixels" in message and "normalise twice" in message
        assert "--dtype" not in message
        # The library names settings, so a job file's user reads its own keys.
        assert "drop preprocess.mean/preprocess.std" in message and "--" not in message


def test_mean_std_with_an_integer_dtype_for_a_float_model_hints_the_models_dtype() -> None:
    with pytest.raises(UsageError, match=r"drop preprocess\.dtype to feed the model's float32"):
        preprocess_for((1, 8, 8, 3), "float32", dtype_override="uint8", mean=(1,))
    with pytest.raises(UsageError, match=r"fractional values") as info:
        Preprocess((1, 8, 8, 3), "uint8", mean=(1, 2, 3))
    assert "preprocess.dtype" not in str(info.value)


@pytest.mark.parametrize(
    ("stored", "hint"),
    [
        ("float64", r"float64, which RKNNLite does not take.*save the tensors as float32"),
        ("float16", r"save the tensors as float32 .*, or pass preprocess.dtype float16"),
        (">f2", r"float16 \(big-endian\) but the input takes float32.*preprocess.dtype float16 "),
    ],
)
def test_npy_dtype_hints_name_what_works(tmp_path: Path, stored: str, hint: str) -> None:
    path = tmp_path / "t.npy"
    np.save(path, np.zeros((1, 4), dtype=stored))
    spec = preprocess_for((1, 4), "float32")
    with pytest.raises(InputError, match=hint) as info:
        load_into(str(path), spec, np.zeros((1, 4), np.float32), "npy")
    assert "--dtype float64" not in str(info.value)
    if stored == "float64":  # the hint that works: float32 is read as it is
        np.save(path, np.zeros((1, 4)).astype("float32"))
        load_into(str(path), spec, np.zeros((1, 4), np.float32), "npy")
