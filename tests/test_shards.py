"""WebDataset-style tar shards as a dataset: naming, listing, faults, reading, whole runs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image
from runs import config, fast_sim
from tar_shards import add_bytes, write_shards
from test_cli import assert_error, invoke, run_args

from batchinfer import run
from batchinfer.data import load_into, open_dataset, preprocess_for
from batchinfer.data.dataset import Member
from batchinfer.data.fingerprint import files_sha256
from batchinfer.data.shard_names import expand_braces, is_shard_spec
from batchinfer.data.shard_reading import ShardFiles
from batchinfer.data.shards import ShardSet
from batchinfer.data.tar_headers import list_members
from batchinfer.errors import DatasetError, InputError
from batchinfer.results import read_predictions


def _png(value: int = 128, size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((size, size), value, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            add_bytes(tar, name, data)
    return path


# ------------------------------------------------------------------------ naming
def test_brace_patterns_expand_as_the_shell_does() -> None:
    assert expand_braces("s/t-{000..003}.tar") == [f"s/t-{n:03d}.tar" for n in range(4)]
    assert expand_braces("t-{8..11}.tar") == ["t-8.tar", "t-9.tar", "t-10.tar", "t-11.tar"]
    assert expand_braces("t-{09..11}.tar") == ["t-09.tar", "t-10.tar", "t-11.tar"]
    assert expand_braces("t-{2..0}.tar") == ["t-2.tar", "t-1.tar", "t-0.tar"]
    assert expand_braces("{a,b}-{0..1}.tar") == ["a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    for bad in ("t-{0..3.tar", "t-{x}.tar", "t-{{0..1}}.tar", "t-}0{.tar"):
        with pytest.raises(DatasetError):
            expand_braces(bad)
    with pytest.raises(DatasetError, match="more than"):
        expand_braces("t-{0..99999999}.tar")


def test_a_tar_path_names_shards_and_a_folder_does_not(tmp_path: Path) -> None:
    assert is_shard_spec("shards/train-{000..099}.tar")
    assert is_shard_spec(tmp_path / "x.TAR")
    assert is_shard_spec("x.tar.gz")
    assert not is_shard_spec(tmp_path)
    (tmp_path / "odd.tar").mkdir()
    assert not is_shard_spec(tmp_path / "odd.tar")  # a folder named like a tar is a folder


# ------------------------------------------------------------------------ listing
def test_members_are_grouped_into_samples_by_key(tmp_path: Path) -> None:
    shard = tmp_path / "s-0.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("d")
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        add_bytes(tar, "d/001.png", _png(1))
        add_bytes(tar, "d/001.cls", b"7\n")
        add_bytes(tar, "d/001.json", b"{}")
        add_bytes(tar, "d/._002.png", b"apple double")
        add_bytes(tar, "d/002.jpg", _png(2))  # Pillow reads by content, not by name
        add_bytes(tar, "d/002.seg.png", _png(3))  # not an image member: its extension is seg.png
        add_bytes(tar, "d/003.txt", b"a caption, not a label")
        link = tarfile.TarInfo("d/004.png")
        link.type, link.linkname = tarfile.SYMTYPE, "001.png"
        tar.addfile(link)
        add_bytes(tar, "./d/005.v.npy.png", _png(5))  # not .png: the extension is v.npy.png
        add_bytes(tar, "d/006.PNG", _png(6))
    shards = open_dataset(shard)
    assert isinstance(shards, ShardSet)
    items = list(shards)
    assert [(i.index, i.id, i.label, i.label_name) for i in items] == [
        (0, "d/001", 7, "7"),
        (1, "d/002", None, None),
        (2, "d/006", None, None),
    ]
    assert items[0].member.name == "d/001.png" and items[0].path == str(shard)
    assert shards.skipped.by_extension == {
        ".json": 1, ".seg.png": 1, ".txt": 1, "(not a regular file)": 1, ".v.npy.png": 1,
    }  # fmt: skip
    assert shards.leftovers == {"._*": 1}
    assert shards.classes == ("7",)
    assert shards.label_rule == "each sample's .cls member: label = its integer"
    record = shards.manifest_json()
    assert record["shards"] == {"count": 1, "names": ["s-0.tar"], "faults": 0}


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_listing_agrees_with_tarfile_on_long_and_odd_names(tmp_path: Path, fmt: int) -> None:
    names = [
        "short.png",
        "d" * 90 + "/" + "n" * 60 + ".png",  # ustar: split into prefix and name
        "ünïcode/ファイル.png",
        "x" * 120 + ".png" if fmt != tarfile.USTAR_FORMAT else "plain.png",  # a long name
    ]
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w", format=fmt) as tar:
        for n, name in enumerate(names):
            add_bytes(tar, name, _png(n) * (n + 1))
        big = tarfile.TarInfo("big.npy")
        big.size = 9000  # several blocks of data
        tar.addfile(big, io.BytesIO(bytes(9000)))
    with tarfile.open(shard) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar]
    assert [(e.name, e.offset, e.size) for e in list_members(str(shard))] == expected


def test_names_that_are_not_utf8_keep_their_bytes(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT, errors="surrogateescape") as tar:
        add_bytes(tar, os.fsdecode(b"caf\xe9.png"), _png())
        add_bytes(tar, "lonely.cls", b"1")  # a sample with no image: skipped, counted
    shards = open_dataset(shard)
    (item,) = shards
    assert (item.id, item.key) == ("caf\\xe9", b"caf\xe9")
    assert shards.skipped.by_extension == {".cls": 1}


def test_samples_are_items_in_shard_order_with_unique_keys(tmp_path: Path) -> None:
    _tar(tmp_path / "s-1.tar", [("b.png", _png()), ("c.png", _png())])
    _tar(tmp_path / "s-0.tar", [("a.png", _png())])
    shards = open_dataset(tmp_path / "s-{1,0}.tar")
    assert [i.id for i in shards] == ["b", "c", "a"]
    assert len(shards) == 3 and shards.counts == [2, 1]
    _tar(tmp_path / "s-2.tar", [("b.png", _png()), ("z.png", _png())])
    with pytest.raises(DatasetError, match="same key more than once \\('b'\\)"):
        open_dataset(tmp_path / "s-{0..2}.tar")


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("s-{0..3}.tar", "s-2.tar and 1 more of 4 does not exist"),
        ("s-0.tar.gz", "compressed"),
        ("only-text.tar", "hold no samples"),
        ("mixed.tar", "mix 1 images and 1 .npy"),
    ],
)
def test_unusable_shard_sets_are_dataset_errors(tmp_path: Path, spec: str, needle: str) -> None:
    for n in (0, 1):
        _tar(tmp_path / f"s-{n}.tar", [(f"{n}.png", _png())])
    _tar(tmp_path / "only-text.tar", [("a.txt", b"x")])
    npy = io.BytesIO()
    np.save(npy, np.zeros(3, np.float32))
    _tar(tmp_path / "mixed.tar", [("a.png", _png()), ("b.npy", npy.getvalue())])
    (tmp_path / "s-0.tar.gz").write_bytes(b"")
    with pytest.raises(DatasetError, match=needle):
        open_dataset(tmp_path / spec)


def test_a_missing_shard_is_a_usage_error_at_the_command_line(demo_kit, tmp_path: Path) -> None:
    result = invoke(*run_args(tmp_path / "x-{0..1}.tar", demo_kit.models["digits"], tmp_path / "o"))
    assert_error(result, 2, "x-0.tar and 1 more of 2 does not exist")


def test_the_fingerprint_sees_a_shard_rewritten(tmp_path: Path) -> None:
    for n in (0, 1):
        _tar(tmp_path / f"s-{n}.tar", [(f"{n}.png", _png())])
    shards = open_dataset(tmp_path / "s-{0..1}.tar")
    before = {c: files_sha256(shards, c) for c in ("stat", "content")}
    first = files_sha256(shards, "content", limit=1)
    _tar(tmp_path / "s-1.tar", [("1.png", _png(9))])
    os.utime(tmp_path / "s-1.tar", ns=(1, 1))
    assert all(files_sha256(shards, c) != before[c] for c in before)
    assert files_sha256(shards, "content", limit=1) == first  # s-1 holds none of item 0


def test_a_detection_job_refuses_shards_in_one_line(tmp_path: Path) -> None:
    from batchinfer.evaluate import JobError, load_job

    (tmp_path / "m.onnx").write_bytes(b"")
    job = tmp_path / "j.toml"
    job.write_text(
        'name = "j"\ntask = "detect"\n[device]\nmodel = "m.onnx"\n'
        '[dataset]\npath = "s-{0..1}.tar"\nground_truth = "gt.json"\n'
    )
    with pytest.raises(JobError, match="detection jobs do not read yet"):
        load_job(job)


def test_a_resume_is_refused_when_a_shard_changed(demo_kit, tmp_path: Path) -> None:
    pngs = sorted(demo_kit.dataset.glob("5/*.png"))[:4]
    for n in (0, 1):
        _tar(tmp_path / f"s-{n}.tar", [(f"{n}/{p.stem}.png", p.read_bytes()) for p in pngs])
    args = run_args(tmp_path / "s-{0..1}.tar", demo_kit.models["digits"], tmp_path / "o")
    assert invoke(*args).exit_code == 0
    _tar(tmp_path / "s-1.tar", [(f"1/{p.stem}.png", p.read_bytes()) for p in pngs[::-1]])
    assert_error(invoke(*args, "--resume"), 2, "different dataset listing")


# ------------------------------------------------------------------------ faults
def _digits_shard(demo_kit, tmp_path: Path) -> tuple[Path, list]:
    (shard,) = write_shards(demo_kit.dataset, tmp_path / "clean", 4)[:1]
    return shard, list(open_dataset(shard))


def test_a_corrupt_header_is_one_error_item_and_the_members_after_it_are_items(
    demo_kit, tmp_path: Path
) -> None:
    shard, items = _digits_shard(demo_kit, tmp_path)
    data = bytearray(shard.read_bytes())
    header = items[10].member.offset - 512
    data[header : header + 100] = b"X" * 100
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    shards = open_dataset(bad)
    got = list(shards)
    assert len(got) == len(items) and shards.faults == 1
    assert got[10].id == f"bad.tar:corrupt@{header}"
    assert "corrupt header at byte" in got[10].member.fault
    assert [i.id for i in got[11:]] == [i.id for i in items[11:]]
    assert shards.notes()[1] and "cannot be read" in shards.notes()[1][0]


def test_a_truncated_shard_and_a_file_that_is_no_tar_are_error_items(
    demo_kit, tmp_path: Path
) -> None:
    shard, items = _digits_shard(demo_kit, tmp_path)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[: items[20].member.offset + 50])
    got = list(open_dataset(cut))
    assert [i.id for i in got] == [i.id for i in items[:21]]
    assert "truncated: it ends 50 bytes into" in got[20].member.fault
    text = tmp_path / "text.tar"
    text.write_bytes(b"not a tar " * 100)
    (item,) = open_dataset(text)
    assert item.id == "text.tar:corrupt@0" and "not a tar file" in item.member.fault
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    (item,) = open_dataset(empty)
    assert "empty" in item.member.fault


def test_a_corrupt_member_is_an_error_row_naming_it_and_the_run_goes_on(
    demo_kit, tmp_path: Path
) -> None:
    pngs = sorted(demo_kit.dataset.glob("3/*.png"))[:6]
    members = [(f"3/{p.stem}.png", p.read_bytes()) for p in pngs]
    members[2] = ("3/broken.png", b"\x89PNG garbage")
    members.append(("3/bad-cls.png", pngs[0].read_bytes()))
    members.append(("3/bad-cls.cls", b"three"))
    _tar(tmp_path / "s-0.tar", members)
    data = bytearray((tmp_path / "s-0.tar").read_bytes())
    data[512 * 6 : 512 * 6 + 10] = b"#" * 10  # the header of the fourth member
    (tmp_path / "s-0.tar").write_bytes(bytes(data))
    _tar(tmp_path / "s-1.tar", [(f"4/{p.stem}.png", p.read_bytes()) for p in pngs])
    cfg = config(
        dataset=tmp_path / "s-{0..1}.tar",
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(),
        out=tmp_path / "o",
    )
    result = run(cfg)
    table = read_predictions(result.out).sort_by("index")
    assert table["index"].to_pylist() == list(range(13))  # 7 + 6: the corrupt member is one
    errors = {r["id"]: r["error"] for r in table.to_pylist() if r["error"]}
    assert set(errors) == {"3/broken", "s-0.tar:corrupt@3072", "3/bad-cls"}
    assert "3/broken (3/broken.png in s-0.tar)" in errors["3/broken"]
    assert "corrupt header at byte 3072" in errors["s-0.tar:corrupt@3072"]
    assert "holds b'three', not a non-negative integer" in errors["3/bad-cls"]
    manifest = json.loads((result.out / "manifest.json").read_text())
    assert manifest["dataset"]["shards"]["faults"] == 2
    assert result.status == "complete"


# ------------------------------------------------------------------------ reading
def test_a_reader_keeps_one_shard_open(tmp_path: Path) -> None:
    paths = [_tar(tmp_path / f"s-{n}.tar", [(f"{n}.png", _png(n))]) for n in range(3)]
    items = [i for n in range(3) for i in open_dataset(paths[n])]
    spec = preprocess_for((1, 8, 8, 1), "uint8")
    out = np.empty(spec.shape, np.uint8)
    for keep in (1, 2):
        files = ShardFiles(keep)
        for item in items * 2:
            load_into(
                item.path, spec, out, "images", name=item.id, member=item.member, shards=files
            )
            assert out[0, 0, 0, 0] == int(item.id)
            assert len(files) <= keep
        # Count the descriptors open on the shards only: other tests of the session may
        # leave descriptors of their own opening or closing in the background.
        assert len(_open_on(paths)) == keep
        files.close()
        assert _open_on(paths) == []
    with pytest.raises(InputError, match="truncated"):
        member = Member(items[0].member.offset, 10**6, "0.png")
        load_into(items[0].path, spec, out, "images", member=member)


def _open_on(paths: list[Path]) -> list[str]:
    """This process's open descriptors on any of ``paths``."""
    wanted = {str(p.resolve()) for p in paths}
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if target in wanted:
            found.append(target)
    return found


def test_npy_members_are_read_into_the_slot(tmp_path: Path) -> None:
    tensors = [np.arange(12, dtype=np.float32).reshape(3, 4) * n for n in range(3)]
    members = []
    for n, t in enumerate(tensors):
        buf = io.BytesIO()
        np.save(buf, t if n != 2 else np.asfortranarray(t))
        members.append((f"t{n}.npy", buf.getvalue()))
    members.append(("short.npy", members[0][1][:-8]))
    shards = open_dataset(_tar(tmp_path / "t.tar", members))
    assert shards.kind == "npy"
    spec = preprocess_for((1, 3, 4), "float32")
    out = np.empty(spec.shape, np.float32)
    items = list(shards)
    for item, tensor in zip(items, tensors, strict=False):
        load_into(item.path, spec, out, "npy", member=item.member)
        np.testing.assert_array_equal(out[0], tensor)
    with pytest.raises(InputError, match=r"short \(short.npy in t.tar\): the file is truncated"):
        load_into(items[3].path, spec, out, "npy", name=items[3].id, member=items[3].member)


# ------------------------------------------------------------------------ whole runs
def _digits(demo_kit, dataset: Path | str, out: Path, **settings):
    return config(
        dataset=dataset,
        model=demo_kit.models["digits"],
        backend="sim",
        sim=fast_sim(),
        out=out,
        **settings,
    )


_SAME = ("index", "label", "label_name", "error", "pred", "topk_index", "topk_score")


def _same_predictions(a: Path, b: Path, same_ids: bool = False) -> None:
    """The runs at ``a`` (shards) and ``b`` (their folder; shards too when ``same_ids``)
    have the same rows, but for where and when each item ran."""
    left = read_predictions(a).sort_by("index")
    right = read_predictions(b).sort_by("index")
    for column in _SAME:
        assert left[column].to_pylist() == right[column].to_pylist(), column
    ids = right["id"].to_pylist()
    assert (ids if same_ids else [i.rsplit(".", 1)[0] for i in ids]) == left["id"].to_pylist()


@pytest.mark.slow
def test_the_digits_give_identical_predictions_as_a_folder_and_as_shards(
    demo_kit, tmp_path: Path
) -> None:
    write_shards(demo_kit.dataset, tmp_path / "shards", 7)
    shards = run(_digits(demo_kit, tmp_path / "shards" / "part-{000..006}.tar", tmp_path / "s"))
    folder = run(_digits(demo_kit, demo_kit.dataset, tmp_path / "f"))
    assert shards.succeeded == folder.succeeded == 1797
    _same_predictions(shards.out, folder.out)


@pytest.mark.slow
def test_resume_after_kill_9_of_a_shard_run_is_exact(demo_kit, tmp_path: Path) -> None:
    write_shards(demo_kit.dataset, tmp_path / "shards", 5)
    pattern = str(tmp_path / "shards" / "part-{000..004}.tar")
    out = tmp_path / "o"
    cmd = [
        sys.executable, "-m", "batchinfer", "run", pattern,
        "--model", str(demo_kit.models["digits"]), "--backend", "sim",
        "--sim-npu-ms", "3", "--sim-host-ms", "0", "--cores", "0",
        "--out", str(out), "--no-progress", "--part-rows", "40",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((out / "predictions").glob("part-*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, "no part was written"
        time.sleep(0.02)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.communicate(timeout=30)
    psutil.wait_procs(children, timeout=30)
    written = read_predictions(out).num_rows
    assert 40 <= written < 1797
    fast = ["--sim-npu-ms", "0.2"]
    done = subprocess.run(
        [*cmd[:9], *fast, *cmd[11:], "--resume"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "already done (resumed)" in done.stdout
    reference = run(_digits(demo_kit, demo_kit.dataset, tmp_path / "f"))
    _same_predictions(out, reference.out)


@pytest.mark.slow
def test_an_eval_job_scores_shards_as_their_folder(demo_kit, tmp_path: Path) -> None:
    write_shards(demo_kit.dataset, tmp_path / "shards", 3)
    models = demo_kit.models

    def job(name: str, dataset: str) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(
            f'name = "{name}"\n[device]\nmodel = "{models["digits"]}"\n'
            '[device.runtime]\nbackend = "sim"\n'
            f'[dataset]\npath = "{dataset}"\n[metrics]\nworst = 0\n'
            f'[output]\ndir = "{tmp_path / name}"\n'
        )
        return path

    shards = invoke("eval", job("shards", str(tmp_path / "shards" / "part-{000..002}.tar")))
    folder = invoke("eval", job("folder", str(demo_kit.dataset)))
    assert shards.exit_code == folder.exit_code == 0, shards.output + folder.output
    results = [
        json.loads(next((tmp_path / n / "evals").glob("*/result.json")).read_text())
        for n in ("shards", "folder")
    ]
    assert results[0]["metrics"]["top1"] == results[1]["metrics"]["top1"]
    assert results[0]["confusion"] == results[1]["confusion"]
    assert results[0]["dataset"]["items"] == 1797
