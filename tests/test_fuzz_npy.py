"""Fuzz tier: .npy and .npz items (batchinfer/data/npy.py, feeds.py). Headers of every
shape (versions, declared lengths, dtypes, shapes huge or negative, Fortran order, text
that is no dict) and zip archives whose members claim more than they hold: reading one
into a model input fills it or raises an InputError (the item's error row), under a memory
bound (tests/fuzz_support.py)."""

from __future__ import annotations

import io
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest
from fuzz_support import assert_clean, fuzz, huge_ints, run_bounded
from hypothesis import example, given
from hypothesis import strategies as st

from batchinfer.data.feeds import FROM_NPZ, Feed, load_feeds
from batchinfer.data.npy import fill_npy, read_npy

SHAPE = (1, 2, 3)
SPEC = SimpleNamespace(shape=SHAPE, dtype="float32")
ITEM = ("ok", "input")

dims = st.one_of(st.integers(-2, 4), huge_ints)
shapes = st.one_of(
    st.just("(1, 2, 3)"),
    st.just("(2, 3)"),
    st.lists(dims, max_size=4).map(lambda d: repr(tuple(d))),
    st.sampled_from(
        ["()", "(3,)", "[1, 2, 3]", "(1, 2, 3.0)", "('a',)", "((1,),)", "None", "(1" * 50]
    ),
)
descrs = st.sampled_from(
    ["'<f4'", "'>f4'", "'<f8'", "'|u1'", "'|O'", "'<U3'", "'|V0'", "'|V12'", "[('a', '<f4')]",
     "'<f4', 'x': 1", "'f4'", "'<f99'", "1", "'<M8[s]'", "'<c8'", "''"]
)  # fmt: skip
orders = st.sampled_from(["False", "True", "1", "'x'"])


@st.composite
def npy_files(draw):
    version = draw(st.sampled_from([(1, 0), (2, 0), (3, 0), (0, 1)]))
    descr, order, shape = draw(descrs), draw(orders), draw(shapes)
    text = f"{{'descr': {descr}, 'fortran_order': {order}, 'shape': {shape}, }}"
    if draw(st.booleans()):
        text = draw(st.text(max_size=40))  # no dict at all
    header = text.encode("latin-1", "replace")
    header += b" " * (-(len(header) + 12) % 64) + b"\n"
    length_bytes = 2 if version == (1, 0) else 4
    length = draw(st.one_of(st.just(len(header)), st.integers(0, 2 ** (8 * length_bytes) - 1)))
    data = draw(st.one_of(st.just(np.arange(6, dtype="<f4").tobytes()), st.binary(max_size=40)))
    return b"\x93NUMPY" + bytes(version) + length.to_bytes(length_bytes, "little") + header + data


def _read_file(path: str) -> list[float]:
    out = np.zeros(SHAPE, np.float32)
    read_npy(path, SPEC, out, "x.npy")
    return out.ravel().tolist()


def _read_member(data: bytes) -> list[float]:
    out = np.zeros(SHAPE, np.float32)
    fill_npy(None, data, SPEC, out, "x.npy in s.tar")
    return out.ravel().tolist()


@fuzz
@given(data=npy_files())
def test_npy_headers_of_any_kind(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("npy") / "x.npy"
    path.write_bytes(data)
    assert_clean(run_bounded(lambda: _read_file(str(path))), ITEM)
    assert_clean(run_bounded(lambda: _read_member(data)), ITEM)


def test_a_header_of_unbalanced_brackets_is_an_error_row(tmp_path):
    """numpy's header parser fell back to tokenize, whose TokenError was no InputError."""
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1" + b"(1" * 50 + b", }"
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(24)
    path = tmp_path / "x.npy"
    path.write_bytes(data)
    outcome = run_bounded(lambda: _read_file(str(path)))
    assert outcome.kind == "input" and "header is damaged" in outcome.error, str(outcome)
    assert outcome.one_line


def test_a_valid_npy_is_read(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(6, dtype=np.float32).reshape(SHAPE))
    outcome = run_bounded(lambda: _read_file(str(path)))
    assert outcome.kind == "ok" and outcome.value == [0, 1, 2, 3, 4, 5], str(outcome)


def test_a_header_declaring_gigabytes_is_an_error_row_not_read(tmp_path):
    """A sparse .npy: its version 2 header says it is 4 GiB long, and the file is as long.
    The header was read whole (4 GiB of zeros) before numpy refused it as too large."""
    path = tmp_path / "x.npy"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x02\x00" + (2**32 - 16).to_bytes(4, "little") + b"{'descr'")
        f.truncate(2**32 + 64)
    outcome = run_bounded(lambda: _read_file(str(path)), timeout=5)
    assert outcome.kind == "input" and "header" in outcome.error, str(outcome)


# --------------------------------------------------------------------------- .npz


def _npz_member(header: dict[str, object], data: bytes, compress: bool) -> bytes:
    """A .npz holding one member x.npy with ``header`` and ``data``."""
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, header)
    out = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(out, "w", method) as z:
        z.writestr("x.npy", head.getvalue() + data)
    return out.getvalue()


@st.composite
def npz_files(draw):
    shape = draw(st.one_of(st.just(SHAPE), st.lists(st.integers(0, 2**20), max_size=3).map(tuple)))
    descr = draw(st.sampled_from(["<f4", ">f4", "<f8", "|u1", "<U2"]))
    data = draw(st.one_of(st.just(bytes(24)), st.binary(max_size=64)))
    member = _npz_member(
        {"descr": descr, "fortran_order": False, "shape": shape}, data, draw(st.booleans())
    )
    flips = draw(
        st.lists(st.tuples(st.integers(0, len(member) - 1), st.integers(0, 255)), max_size=3)
    )
    out = bytearray(member)
    for at, value in flips:
        out[at] = value
    return bytes(out)


def _read_npz(path: str) -> list[float]:
    out = np.zeros(SHAPE, np.float32)
    feed = Feed("x", SHAPE, "float32", FROM_NPZ)
    load_feeds([feed], path, None, [out], "npz", name="x.npz")
    return out.ravel().tolist()


@fuzz
@given(data=npz_files())
def test_npz_members_of_any_kind(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("npz") / "x.npz"
    path.write_bytes(data)
    assert_clean(run_bounded(lambda: _read_npz(str(path))), ITEM)


@fuzz
@example(data=b"PK\x05\x06" + bytes(18))  # an empty zip
@given(data=st.binary(max_size=200))
def test_npz_of_any_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("npzb") / "x.npz"
    path.write_bytes(data)
    assert_clean(run_bounded(lambda: _read_npz(str(path))), ITEM)


def test_an_npz_member_declaring_gigabytes_is_an_error_row_not_read(tmp_path):
    """A .npz of a few hundred KiB whose member declares and holds 256 MiB of zeros
    (deflate packs them 1000:1): its array was inflated whole before its shape was checked
    (under a bound of 128 MiB here; 1 GiB of them took a reader to 1.06 GB RSS)."""
    path = tmp_path / "x.npz"
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "|u1", "fortran_order": False, "shape": (1 << 28,)}
    )
    zeros = bytes(1 << 24)
    with (
        zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z,
        z.open("x.npy", "w", force_zip64=True) as f,
    ):
        f.write(head.getvalue())
        for _ in range(16):
            f.write(zeros)
    assert path.stat().st_size < 4 << 20
    outcome = run_bounded(lambda: _read_npz(str(path)), memory=128 << 20, timeout=5)
    assert outcome.kind == "input" and "shape" in outcome.error, str(outcome)


def test_an_npz_member_with_a_corrupt_deflate_stream_is_an_error_row(tmp_path):
    """zlib's own error (not a ValueError nor an OSError) was no InputError: the row said
    "cannot read x.npz: error: Error -3 while decompressing data"."""
    data = bytearray(
        _npz_member({"descr": "<f4", "fortran_order": False, "shape": SHAPE}, bytes(24), True)
    )
    start = 30 + len("x.npy")  # the member's data, after its local header
    data[start : start + 4] = b"\xff\xff\xff\xff"
    path = tmp_path / "x.npz"
    path.write_bytes(bytes(data))
    outcome = run_bounded(lambda: _read_npz(str(path)))
    assert outcome.kind == "input" and "x.npz" in outcome.error, str(outcome)


@pytest.mark.parametrize("flags, method", [(1, 8), (0, 99)])
def test_an_encrypted_or_oddly_compressed_npz_member_is_an_error_row(tmp_path, flags, method):
    """zipfile raises RuntimeError for an encrypted member and NotImplementedError for a
    compression method it lacks: neither was an InputError."""
    data = bytearray(
        _npz_member({"descr": "<f4", "fortran_order": False, "shape": SHAPE}, bytes(24), True)
    )
    for signature, at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local, central header
        start = data.index(signature)
        data[start + at : start + at + 2] = flags.to_bytes(2, "little")
        data[start + at + 2 : start + at + 4] = method.to_bytes(2, "little")
    path = tmp_path / "x.npz"
    path.write_bytes(bytes(data))
    outcome = run_bounded(lambda: _read_npz(str(path)))
    assert outcome.kind == "input" and "x.npz" in outcome.error, str(outcome)


def test_a_zip_of_a_version_zipfile_cannot_read_is_an_error_row(tmp_path):
    """np.load let zipfile's NotImplementedError ("zip file version 6.4") through."""
    data = bytearray(
        _npz_member({"descr": "<f4", "fortran_order": False, "shape": SHAPE}, bytes(24), False)
    )
    start = data.index(b"PK\x01\x02")  # the central directory's entry: version needed
    data[start + 6 : start + 8] = (64).to_bytes(2, "little")
    path = tmp_path / "x.npz"
    path.write_bytes(bytes(data))
    outcome = run_bounded(lambda: _read_npz(str(path)))
    assert outcome.kind == "input" and "not a .npz file" in outcome.error, str(outcome)
