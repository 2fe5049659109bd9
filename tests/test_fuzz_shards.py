"""Fuzz tier: tar shards (batchinfer/data/shards.py), their headers and their members. A
valid shard is written, then mutated (names, sizes, type flags, ``.cls`` contents, bytes
flipped, cut short); listing it is a one-line usage error or items with unique ids, and
reading each item's member gives its bytes or an InputError (the item's error row), under
a memory bound (tests/fuzz_support.py)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from fuzz_support import MEMORY_BOUND, assert_clean, fuzz, ints, nasty_paths, run_bounded
from hypothesis import given
from hypothesis import strategies as st

from batchinfer.data.input_spec import DEFAULT_MAX_PIXELS, item_bytes_for
from batchinfer.data.shard_reading import ShardFiles
from batchinfer.data.sources import open_source
from batchinfer.errors import InputError

#: What a run's readers allow one item by default (preprocess.max_item_bytes: auto).
ITEM_LIMIT = item_bytes_for(DEFAULT_MAX_PIXELS)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 40


def _read(spec: str) -> dict[str, object]:
    """List the shards and read every item's member, as a run's readers would."""
    ds = open_source(spec)
    files = ShardFiles()
    items, reads = [], []
    try:
        for item in ds.iter_from():
            items.append((item.id, item.label))
            try:
                reads.append(len(files.read(item.path, item.member, item.id, ITEM_LIMIT)))
            except InputError as exc:
                reads.append(str(exc))
    finally:
        files.close()
    warnings = ds.notes()[1]
    return {"count": len(ds), "items": items, "reads": reads, "warnings": warnings}


def check_once(outcome, entries: int | None = None) -> None:
    assert_clean(outcome)
    if outcome.kind != "ok":
        return
    ids = [i for i, _ in outcome.value["items"]]
    assert len(ids) == len(set(ids)), f"repeated ids: {ids}"
    assert outcome.value["count"] == len(ids)
    if entries is not None:
        assert len(ids) == entries
    for read in outcome.value["reads"]:
        assert isinstance(read, int) or "\n" not in read, read


def _tar(members: list[tuple[str, bytes, bytes]]) -> bytes:
    """A GNU tar of (name, data, type flag) members."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, flag in members:
            info = tarfile.TarInfo(name)
            info.type = flag
            info.size = len(data) if flag in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return out.getvalue()


def _checksum(block: bytearray) -> None:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)


cls_texts = st.one_of(ints.map(lambda n: str(n).encode()), st.binary(max_size=70))


@fuzz
@given(labels=st.lists(cls_texts, min_size=1, max_size=6))
def test_cls_members_of_any_content(tmp_path_factory, labels):
    """Every sample is one item whatever its ``.cls`` holds; a bad one is its error row."""
    members = []
    for i, text in enumerate(labels):
        members += [(f"k{i}.png", PNG, tarfile.REGTYPE), (f"k{i}.cls", text, tarfile.REGTYPE)]
    path = tmp_path_factory.mktemp("cls") / "s.tar"
    path.write_bytes(_tar(members))
    check_once(run_bounded(lambda: _read(str(path))), len(labels))


member_names = st.one_of(
    nasty_paths,
    st.sampled_from(["k.png", "k.cls", "a/k.png", "./k.png", "._k.png", "__MACOSX/k.png"]),
)
flags = st.sampled_from(list(b"01234567") + [ord(c) for c in "xgLKSV"]).map(lambda b: bytes([b]))


@fuzz
@given(
    members=st.lists(
        st.tuples(member_names, st.one_of(st.just(PNG), st.binary(max_size=600)), flags),
        min_size=1,
        max_size=6,
    )
)
def test_members_of_any_name_and_type(tmp_path_factory, members):
    try:
        data = _tar(members)
    except (ValueError, UnicodeError):
        return  # a name tarfile cannot write (not a shard anyone has)
    path = tmp_path_factory.mktemp("names") / "s.tar"
    path.write_bytes(data)
    check_once(run_bounded(lambda: _read(str(path))))


@st.composite
def mutated_shards(draw):
    """A valid shard of three samples with headers edited (checksums kept valid, so the
    lister trusts them) and then bytes flipped or the end cut off."""
    data = bytearray(
        _tar(
            [
                ("a.png", PNG, tarfile.REGTYPE),
                ("a.cls", b"3", tarfile.REGTYPE),
                ("b.png", PNG * 20, tarfile.REGTYPE),
                ("c.npy", b"\x93NUMPY", tarfile.REGTYPE),
            ]
        )
    )
    headers = [0, 1024, 2048, 2048 + 512 + len(PNG * 20) + (-len(PNG * 20)) % 512]
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.sampled_from(headers))
        block = bytearray(data[at : at + 512])
        field = draw(st.sampled_from(["size", "name", "flag", "prefix", "mode"]))
        if field == "size":
            size = draw(st.integers(0, 8**11 - 1))
            block[124:136] = b"%011o\0" % size
        elif field == "name":
            block[0:100] = draw(st.binary(min_size=100, max_size=100))
        elif field == "flag":
            block[156:157] = draw(flags)
        elif field == "prefix":
            block[257:263] = b"ustar\0"
            block[345:500] = draw(st.binary(min_size=155, max_size=155))
        else:
            block[100:108] = draw(st.binary(min_size=8, max_size=8))
        if draw(st.booleans()):
            _checksum(block)
        data[at : at + 512] = block
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return bytes(data if cut is None else data[:cut])


@fuzz
@given(data=mutated_shards())
def test_mutated_headers_and_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("mutated") / "s.tar"
    path.write_bytes(data)
    check_once(run_bounded(lambda: _read(str(path))))


# --------------------------------------------------------------------------- issue 40 defects


def test_a_member_declaring_gigabytes_is_an_error_row_not_read(tmp_path):
    """A sparse shard: a few KiB on disk, a member that declares and spans 3 GiB."""
    size = 3 << 30
    header = bytearray(_tar([("big.png", PNG, tarfile.REGTYPE)])[:512])
    header[124:136] = b"%011o\0" % size
    _checksum(header)
    path = tmp_path / "s.tar"
    with open(path, "wb") as f:
        f.write(header + PNG)
        f.truncate(512 + size + 1024)  # a hole up to the end-of-archive blocks
    outcome = run_bounded(lambda: _read(str(path)))
    check_once(outcome, 1)
    assert outcome.kind == "ok" and isinstance(outcome.value["reads"][0], str), str(outcome)
    assert size > MEMORY_BOUND


def test_a_negative_cls_is_not_called_corrupt_tar_data(tmp_path):
    path = tmp_path / "s.tar"
    path.write_bytes(_tar([("a.png", PNG, tarfile.REGTYPE), ("a.cls", b"-5", tarfile.REGTYPE)]))
    outcome = run_bounded(lambda: _read(str(path)))
    check_once(outcome, 1)
    assert not any("corrupt" in w for w in outcome.value["warnings"]), outcome.value


def test_a_fifo_named_as_a_shard_is_refused_in_one_line(tmp_path):
    path = tmp_path / "s.tar"
    os.mkfifo(path)
    outcome = run_bounded(lambda: _read(str(path)), timeout=1)
    assert outcome.kind == "usage" and "not a regular file" in outcome.error, str(outcome)


def test_a_symlink_to_a_device_is_refused_in_one_line(tmp_path: Path):
    path = tmp_path / "s.tar"
    path.symlink_to("/dev/zero")
    outcome = run_bounded(lambda: _read(str(path)), timeout=1)
    assert outcome.kind == "usage" and "not a regular file" in outcome.error, str(outcome)
