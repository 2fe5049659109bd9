"""The demo's data: 1,797 real handwritten digits (``assets/digits.npz``), the held-out
split the demo models were not trained on, and their 0..16 values as pixels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from batchinfer.errors import UsageError

ASSETS = Path(__file__).resolve().parent / "assets"
DIGIT_COUNT = 1797


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
