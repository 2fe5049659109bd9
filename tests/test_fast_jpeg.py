"""JPEG pixels through simplejpeg (batchinfer.data.fast_jpeg) are Pillow's pixels.

Each case decodes the same file twice, with simplejpeg and with it hidden (Pillow only),
and compares the model input. Both are libjpeg-turbo at the same scale and colour space,
so the largest difference measured was 0 (tools/bench_jpeg_decoders.py: 640x480 and
4000x3000 photos -> 224); TOLERANCE allows one level of 255 for a libjpeg-turbo version
difference between Pillow's wheel and simplejpeg's.
"""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from PIL import Image

from batchinfer.data import fast_jpeg
from batchinfer.data.images import decode_image
from batchinfer.data.preprocess import preprocess_for
from batchinfer.errors import InputError

TOLERANCE = 1


@pytest.fixture(autouse=True)
def _fresh_import():
    fast_jpeg._simplejpeg.cache_clear()
    yield
    fast_jpeg._simplejpeg.cache_clear()


def _photo(w: int, h: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([127 + 90 * np.sin(xx / (17 + 9 * k) + yy / 23 + k) for k in range(3)], -1)
    img += rng.normal(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _jpeg(img: Image.Image, **save) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def _rotated(w: int, h: int, orientation: int) -> bytes:
    img = Image.fromarray(_photo(w, h))
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _jpeg(img, exif=exif)


def _decode(data: bytes, spec, *, fast: bool, monkeypatch) -> tuple[np.ndarray, object]:
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(fast_jpeg, "_simplejpeg", lambda: None)
        return decode_image(io.BytesIO(data), spec, "x.jpg")


def _same(data: bytes, spec, monkeypatch) -> None:
    fast, placed_fast = _decode(data, spec, fast=True, monkeypatch=monkeypatch)
    slow, placed_slow = _decode(data, spec, fast=False, monkeypatch=monkeypatch)
    assert fast.shape == slow.shape and fast.dtype == slow.dtype
    assert int(np.abs(fast.astype(np.int16) - slow.astype(np.int16)).max()) <= TOLERANCE
    assert placed_fast == placed_slow


CASES = {
    "640x480 to 224 (draft 1/2)": (_jpeg(Image.fromarray(_photo(640, 480))), (224, 224), {}),
    "odd sizes, 1001x767 to 97x61": (_jpeg(Image.fromarray(_photo(1001, 767))), (61, 97), {}),
    "odd sizes, no draft": (
        _jpeg(Image.fromarray(_photo(333, 251))),
        (64, 80),
        {"jpeg_draft": False},
    ),
    "EXIF rotated 90": (_rotated(400, 300, 6), (96, 128), {}),
    "EXIF transposed": (_rotated(300, 200, 5), (64, 64), {}),
    "grayscale file": (_jpeg(Image.fromarray(_photo(320, 240)[..., 0])), (56, 56), {}),
    "colour file, gray model": (
        _jpeg(Image.fromarray(_photo(320, 240))),
        (56, 56),
        {"color": "gray"},
    ),
    "progressive": (_jpeg(Image.fromarray(_photo(320, 240)), progressive=True), (64, 64), {}),
    "4:4:4": (_jpeg(Image.fromarray(_photo(257, 129)), subsampling=0), (32, 48), {}),
    "letterbox": (_jpeg(Image.fromarray(_photo(640, 360))), (320, 320), {"resize": "letterbox"}),
    "letterbox, rotated": (_rotated(640, 360, 8), (160, 160), {"resize": "letterbox"}),
}


@pytest.mark.parametrize("case", CASES)
def test_simplejpeg_gives_pillows_pixels(case, monkeypatch):
    pytest.importorskip("simplejpeg")
    data, (h, w), options = CASES[case]
    channels = 1 if options.get("color") == "gray" else 3
    spec = preprocess_for((1, h, w, channels), "uint8", **options)
    with Image.open(io.BytesIO(data)) as img:
        # the fast path really decodes these (it is not Pillow on both sides)
        mode = "L" if channels == 1 else "RGB"
        assert fast_jpeg.decode(img, io.BytesIO(data), mode, None) is not None
    _same(data, spec, monkeypatch)


def test_letterbox_geometry_unchanged(monkeypatch):
    """A detector's input: the geometry returned is the letterbox module's, either way."""
    pytest.importorskip("simplejpeg")
    from batchinfer.detect import letterbox_geometry

    data = _rotated(640, 360, 6)  # upright: 360 wide, 640 high
    spec = preprocess_for((1, 320, 320, 3), "uint8", resize="letterbox")
    pixels, placed = _decode(data, spec, fast=True, monkeypatch=monkeypatch)
    assert placed == letterbox_geometry(360, 640, 320, 320)
    assert pixels.shape == (320, 320, 3)
    left = int(placed.pad_x)
    assert (pixels[:, : left - 1] == 114).all()  # the pad colour beside the image


def test_cmyk_goes_to_pillow(monkeypatch):
    pytest.importorskip("simplejpeg")
    data = _jpeg(Image.fromarray(_photo(120, 80)).convert("CMYK"))
    with Image.open(io.BytesIO(data)) as img:
        assert img.mode == "CMYK"
        assert fast_jpeg.decode(img, io.BytesIO(data), "RGB", (40, 40)) is None
    _same(data, preprocess_for((1, 40, 40, 3), "uint8"), monkeypatch)


def test_truncated_file_is_pillows_error(monkeypatch):
    """simplejpeg refuses it; Pillow decodes it again and says what is wrong."""
    data = _jpeg(Image.fromarray(_photo(320, 240)))[:3000]
    spec = preprocess_for((1, 64, 64, 3), "uint8")
    messages = []
    for fast in (True, False):
        with pytest.raises(InputError) as err:
            _decode(data, spec, fast=fast, monkeypatch=monkeypatch)
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "truncated" in messages[0]


def test_without_simplejpeg_pillow_decodes(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import simplejpeg fails
    assert fast_jpeg._simplejpeg() is None
    data = _jpeg(Image.fromarray(_photo(640, 480)))
    with Image.open(io.BytesIO(data)) as img:
        assert fast_jpeg.decode(img, io.BytesIO(data), "RGB", (224, 224)) is None
    spec = preprocess_for((1, 224, 224, 3), "uint8")
    pixels, _ = decode_image(io.BytesIO(data), spec, "x.jpg")
    with Image.open(io.BytesIO(data)) as img:
        img.draft("RGB", (224, 224))
        want = np.asarray(img.convert("RGB").resize((224, 224), Image.Resampling.BILINEAR))
    assert np.array_equal(pixels, want)


@pytest.mark.parametrize(
    ("full", "size", "scale"),
    [((640, 480), (224, 224), 2), ((4000, 3000), (224, 224), 8), ((100, 100), (224, 224), 1)],
)
def test_draft_scale_is_pillows(full, size, scale):
    img = Image.new("RGB", full)
    buf = io.BytesIO(_jpeg(img))
    with Image.open(buf) as opened:
        opened.draft("RGB", size)
        assert opened.size == (-(-full[0] // scale), -(-full[1] // scale))
    assert fast_jpeg.draft_scale(full, size) == scale
