"""What one item may hold (``preprocess.max_item_bytes``), and shard labels and names that
used to mislead: a forged member size, a .cls Arrow cannot hold, ``../`` member names."""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from runs import config, fast_sim
from tar_shards import add_bytes
from test_cli import FAST_SIM, assert_error, invoke, run_args

from batchinfer import run
from batchinfer.data import load_into, open_dataset, preprocess_for
from batchinfer.data.input_spec import DEFAULT_MAX_PIXELS, item_bytes_for
from batchinfer.data.shard_reading import MAX_LABEL, ShardFiles
from batchinfer.errors import ConfigError, InputError
from batchinfer.evaluate.thumbnails import make_thumbnails, picture
from batchinfer.options import PreprocessOptions, _bytes, from_mapping
from batchinfer.results import read_predictions

GIB = 2**30


def _png(value: int = 128, size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((size, size), value, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            add_bytes(tar, name, data)
    return path


def _sparse_bomb(path: Path, declared: int = 3 * GIB) -> Path:
    """A shard of a few KiB on disk whose one member, 000000.png, declares ``declared``
    bytes: a real PNG at its start, then a hole (as the issue's reproduction)."""
    info = tarfile.TarInfo("000000.png")
    info.size = declared
    header = info.tobuf(format=tarfile.GNU_FORMAT)
    with open(path, "wb") as f:
        f.write(header)
        f.write(_png(200))
        f.truncate(len(header) + -(-declared // 512) * 512 + 1024)
    return path


@pytest.fixture
def no_big_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """os.pread refuses to read more than 1 MiB at once (and records what was asked), so a
    reader that trusts a forged header fails here instead of taking gigabytes."""
    asked: list[int] = []
    real = os.pread

    def pread(fd: int, n: int, offset: int) -> bytes:
        asked.append(n)
        if n > 2**20:
            raise AssertionError(f"asked to read {n:,} bytes at once")
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    return asked


# ------------------------------------------------------------------------ the bound
def test_the_default_bound_is_derived_from_max_pixels() -> None:
    assert item_bytes_for(DEFAULT_MAX_PIXELS) == 256 * 2**20
    assert item_bytes_for(1000) == 16 * 2**20  # metadata does not shrink with the pixels
    assert item_bytes_for(None) is None
    spec = preprocess_for((1, 8, 8, 1), "uint8")
    assert spec.item_limit == 256 * 2**20 and spec.item_bytes_derived
    assert preprocess_for((1, 8, 8, 1), "uint8", max_pixels=None).item_limit is None
    given = preprocess_for((1, 8, 8, 1), "uint8", max_item_bytes=1000)
    assert given.item_limit == 1000 and not given.item_bytes_derived


def test_the_setting_takes_bytes_with_units_words_and_refuses_the_rest() -> None:
    assert _bytes("268435456") == 256 * 2**20
    assert _bytes("256MiB") == _bytes("256M") == _bytes("256mb") == 256 * 2**20
    assert _bytes("1.5GiB") == 3 * 2**29
    assert _bytes("auto") == "auto" and _bytes("None") == "none"
    for bad in ("lots", "1.5", "inf", "nan", "MiB"):
        with pytest.raises(ValueError):
            _bytes(bad)
    opts = from_mapping(PreprocessOptions, {"max_item_bytes": 1000}, "preprocess")
    assert opts.max_item_bytes == 1000
    assert from_mapping(PreprocessOptions, {"max_item_bytes": "none"}, "x").max_item_bytes == "none"
    for bad in (0, -5, "lots", 2**70):
        with pytest.raises(ConfigError, match=r"preprocess\.max_item_bytes"):
            from_mapping(PreprocessOptions, {"max_item_bytes": bad}, "preprocess")


def test_a_member_declaring_gigabytes_is_an_error_decided_from_its_header(
    tmp_path: Path, no_big_reads: list[int]
) -> None:
    """The issue's 8 KiB shard whose member declares 3 GiB took a reader to 6.1 GB and the
    item "succeeded": now it is refused before a byte of it is read."""
    shard = _sparse_bomb(tmp_path / "bomb.tar")
    assert os.stat(shard).st_blocks * 512 < 2**20  # sparse: a few KiB on disk
    (item,) = open_dataset(shard)
    assert item.member.size == 3 * GIB
    spec = preprocess_for((1, 8, 8, 1), "uint8")
    out = np.empty(spec.shape, np.uint8)
    asked_before = len(no_big_reads)
    with pytest.raises(InputError) as caught:
        load_into(item.path, spec, out, "images", name=item.id, member=item.member)
    assert "000000 (000000.png in bomb.tar): the member is 3,221,225,472 bytes" in str(caught.value)
    assert "more than the 268,435,456" in str(caught.value)
    assert "preprocess.max_item_bytes" in str(caught.value)
    assert len(no_big_reads) == asked_before  # not one byte of the member was read


def test_a_member_within_the_bound_is_read_and_one_over_it_is_not(tmp_path: Path) -> None:
    data = _png(7, 64)
    shard = _tar(tmp_path / "s.tar", [("a.png", data)])
    (item,) = open_dataset(shard)
    files = ShardFiles()
    try:
        assert files.read(item.path, item.member, "a", limit=len(data)) == data
        with pytest.raises(InputError, match=f"the member is {len(data):,} bytes"):
            files.read(item.path, item.member, "a", limit=len(data) - 1)
        assert files.read(item.path, item.member, "a", limit=None) == data
    finally:
        files.close()


def test_an_image_file_larger_than_the_bound_is_refused_from_its_size(tmp_path: Path) -> None:
    path = tmp_path / "big.png"
    path.write_bytes(_png(9, 64))
    size = path.stat().st_size
    out = np.empty((1, 8, 8, 1), np.uint8)
    load_into(str(path), preprocess_for((1, 8, 8, 1), "uint8", max_item_bytes=size), out, "images")
    assert out[0, 0, 0, 0] == 9
    small = preprocess_for((1, 8, 8, 1), "uint8", max_item_bytes=size - 1)
    with pytest.raises(InputError, match=f"big.png: the file is {size:,} bytes, more than"):
        load_into(str(path), small, out, "images")
    # The bound is said in bytes at any size (below 1 MiB it read "more than the 10 one
    # item may hold", a bare number).
    tiny = preprocess_for((1, 8, 8, 1), "uint8", max_item_bytes=10)
    with pytest.raises(InputError, match="more than the 10 bytes one item may hold"):
        load_into(str(path), tiny, out, "images")


def test_the_report_pictures_refuse_a_member_over_the_bound_unread(
    tmp_path: Path, no_big_reads: list[int]
) -> None:
    shard = _sparse_bomb(tmp_path / "bomb.tar")
    (item,) = open_dataset(shard)
    source = (item.path, item.member.offset, item.member.size, item.member.name)
    uri, note, _ = picture(source, 32, DEFAULT_MAX_PIXELS, item_bytes_for(DEFAULT_MAX_PIXELS))
    assert uri is None and note is not None
    assert "3,221,225,472 bytes, more than the 268,435,456" in note
    assert max(no_big_reads, default=0) <= 2**20


def test_make_thumbnails_applies_the_jobs_bound(tmp_path: Path) -> None:
    big, small = _png(5, 64), _png(6, 8)
    shard = _tar(tmp_path / "s.tar", [("a.png", big), ("b.png", small)])
    sources = [(i.path, i.member.offset, i.member.size, i.member.name) for i in open_dataset(shard)]
    got = make_thumbnails(
        sources,
        decode_timeout_s=30,
        startup_timeout_s=60,
        max_pixels=DEFAULT_MAX_PIXELS,
        max_item_bytes=len(big) - 1,
    )
    assert got[sources[0]].uri is None
    assert f"{len(big):,} bytes, more than the {len(big) - 1:,}" in (got[sources[0]].note or "")
    assert got[sources[1]].uri is not None


def test_the_fingerprint_records_the_bound_only_when_it_is_set(tmp_path: Path) -> None:
    """A run that leaves the bound alone keeps the fingerprint it had before the setting
    existed (its --resume is not refused); one that sets it records it."""
    from batchinfer.engine.planning.plan_records import preprocess_record

    assert "max_item_bytes" not in preprocess_record(preprocess_for((1, 8, 8, 1), "uint8"))
    given = preprocess_for((1, 8, 8, 1), "uint8", max_item_bytes=1000)
    assert preprocess_record(given)["max_item_bytes"] == 1000


@pytest.mark.slow
def test_a_run_over_the_sparse_bomb_is_one_error_row_in_bounded_memory(
    demo_kit, tmp_path: Path
) -> None:
    """The issue's reproduction end to end, in a child under a 4 GB address-space limit
    (the readers inherit it): before the bound the reader read 3 GiB and the item
    "succeeded"; now its row is the error and the run's peak memory stays small."""
    shard = _sparse_bomb(tmp_path / "bomb.tar")
    out = tmp_path / "o"

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 10**9, 4 * 10**9))

    args = [sys.executable, "-m", "batchinfer", "run", str(shard), "--model"]
    args += [str(demo_kit.models["digits"]), "--out", str(out), *FAST_SIM]
    done = subprocess.run(args, capture_output=True, text=True, preexec_fn=cap, timeout=120)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, all children
    assert "the member is 3,221,225,472 bytes" in done.stdout + done.stderr
    (row,) = read_predictions(out).to_pylist()
    assert row["id"] == "000000" and "more than the 268,435,456" in row["error"]
    assert children < 2 * 2**20  # KiB: under 2 GiB (it was 6.1 GB)


# ------------------------------------------------------------------------ labels and names
def test_a_cls_arrow_cannot_hold_is_that_rows_error(tmp_path: Path) -> None:
    """A .cls of 2^63 stopped the run at its first Parquet part ("free disk space") and
    every --resume failed the same way; now that item's row is the error (the run over it:
    test_a_run_with_a_label_arrow_cannot_hold_completes)."""
    members = [("a.png", _png()), ("a.cls", b"%d" % (MAX_LABEL + 1))]
    members += [("b.png", _png()), ("b.cls", b"%d\n" % MAX_LABEL)]
    members += [("c.png", _png()), ("c.cls", b"9" * 60)]
    shards = open_dataset(_tar(tmp_path / "s.tar", members))
    a, b, c = shards
    assert a.label is None and "a class index larger than 9223372036854775807" in a.member.fault
    assert c.label is None and "larger than" in c.member.fault
    assert b.label == MAX_LABEL and b.member.fault is None
    assert shards.classes == (str(MAX_LABEL),)


def test_a_run_with_a_label_arrow_cannot_hold_completes(demo_kit, tmp_path: Path) -> None:
    png = sorted(demo_kit.dataset.glob("3/*.png"))[0].read_bytes()
    members = [("a.png", png), ("a.cls", b"%d" % (MAX_LABEL + 1)), ("b.png", png)]
    members += [("b.cls", b"%d" % MAX_LABEL)]
    cfg = config(
        dataset=_tar(tmp_path / "s.tar", members),
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(),
        out=tmp_path / "o",
    )
    result = run(cfg)
    assert result.status == "complete"
    rows = {r["id"]: r for r in read_predictions(result.out).to_pylist()}
    assert "a class index larger than" in rows["a"]["error"]
    assert rows["b"]["error"] is None and rows["b"]["label"] == MAX_LABEL


def test_a_negative_cls_is_warned_as_a_label_not_as_corrupt_tar_data(tmp_path: Path) -> None:
    shard = _tar(
        tmp_path / "s.tar",
        [("a.png", _png()), ("a.cls", b"-5"), ("b.png", _png()), ("b.cls", b"1")],
    )
    shards = open_dataset(shard)
    warnings = shards.notes()[1]
    assert not any("corrupt" in w for w in warnings), warnings
    (warning,) = warnings
    assert warning.startswith(f"1 item(s) of {shard} have a .cls member that is not a class")
    assert "a: its class member a.cls holds b'-5', not a non-negative integer" in warning
    assert shards.faults == 1 and shards.label_faults[0] == 1
    record = shards.manifest_json()["shards"]
    assert record["faults"] == 1 and record["label_faults"] == 1
    assert [i.label for i in shards] == [None, 1]


def test_a_corrupt_shard_and_a_bad_label_get_a_warning_each(tmp_path: Path) -> None:
    shard = _tar(tmp_path / "s.tar", [("a.png", _png()), ("a.cls", b"x"), ("b.png", _png(1, 64))])
    (_, b) = open_dataset(shard)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[: b.member.offset + 10])
    warnings = open_dataset(cut).notes()[1]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("1 item(s)")
    assert "corrupt or truncated tar data" in warnings[0]
    assert "not a class index" in warnings[1] and "a.cls holds b'x'" in warnings[1]


def test_members_named_dot_dot_are_named_in_a_warning_not_hidden(tmp_path: Path) -> None:
    names = [f"../{n}.png" for n in range(7)] + ["a/../../x.png", ".hidden.png"]
    shard = _tar(tmp_path / "s.tar", [(n, _png()) for n in names] + [("ok.png", _png())])
    shards = open_dataset(shard)
    assert [i.id for i in shards] == ["ok"]
    assert shards.leftovers == {".*": 1}  # only the real hidden name
    (warning,) = shards.notes()[1]
    assert warning.startswith(f"8 member(s) of {shard} have names that climb out of the shard")
    assert "'../0.png', '../1.png', '../2.png', '../3.png', '../4.png' and 3 more" in warning
    assert json.loads(json.dumps(shards.manifest_json()))["shards"]["climbing_names"][0] == (
        "../0.png"
    )


def test_the_bound_is_a_cli_option(demo_kit, tmp_path: Path) -> None:
    shard = _tar(tmp_path / "s.tar", [("a.png", _png(3, 64)), ("b.png", _png(4, 8))])
    big = len(_png(3, 64))
    out = tmp_path / "o"
    model = demo_kit.models["digits"]
    result = invoke(*run_args(shard, model, out, "--max-item-bytes", str(big - 1)))
    assert result.exit_code == 1, result.output  # an error row
    rows = {r["id"]: r["error"] for r in read_predictions(out).to_pylist()}
    assert rows["b"] is None and f"the member is {big:,} bytes" in rows["a"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["preprocess"]["max_item_bytes"] == big - 1
    refused = invoke(*run_args(shard, model, tmp_path / "p", "--max-item-bytes", "0"))
    assert_error(refused, 2, "--max-item-bytes must be at least 1")


def test_a_sparse_image_file_over_the_default_bound_is_refused_unread(tmp_path: Path) -> None:
    """A JPEG followed by a hole: 300 MiB by its size, a few KiB on disk. The fast-jpeg
    decoder read such a file whole (3 GiB for the issue's size); now its size refuses it.
    (300 MiB keeps the read bounded where the refusal is missing.)"""
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 90, np.uint8)).save(buf, "JPEG")
    path = tmp_path / "sparse.jpg"
    with open(path, "wb") as f:
        f.write(buf.getvalue())
        f.truncate(300 * 2**20)
    out = np.empty((1, 8, 8, 3), np.uint8)
    with pytest.raises(InputError, match=r"sparse\.jpg: the file is 314,572,800 bytes, more than"):
        load_into(str(path), preprocess_for((1, 8, 8, 3), "uint8"), out, "images")


def test_the_report_pictures_bound_image_files_but_not_mapped_npy_files(tmp_path: Path) -> None:
    image, array = tmp_path / "a.png", tmp_path / "b.npy"
    image.write_bytes(_png(3, 32))
    np.save(array, np.full((16, 16), 7, np.uint8))
    for path in (image, array):
        limit = path.stat().st_size - 1
        uri, note, _ = picture(str(path), 16, DEFAULT_MAX_PIXELS, limit)
        if path == image:
            assert uri is None and f"more than the {limit:,}" in (note or "")
        else:  # read as readers read it: mapped, so its size bounds nothing
            assert uri is not None, note
