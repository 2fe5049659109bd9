"""``batchinfer export draw``: the demo detector's run (and a classifier's) drawn into a
folder, one image per successful item; error rows skipped; a folder that is not empty
refused; ``--overwrite`` deleting only what export draw wrote."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps
from tar_shards import write_shards
from test_cli import assert_error, invoke

from batchinfer.draw import class_color
from batchinfer.export_draw import RECORD, export_draw, safe_name
from batchinfer.results import read_run

DETECTOR = ("--mean", "0,0,0", "--std", "255,255,255")


@pytest.fixture(scope="module")
def detected(demo_kit, tmp_path_factory):
    """The demo detector run over 5 demo detection images, a corrupt one and one whose name
    needs making safe, as docs/guide/detection.md runs it: (run folder, dataset folder)."""
    root = Path(tmp_path_factory.mktemp("draw"))
    data = root / "images"
    data.mkdir()
    for source in sorted(demo_kit.detection.images.iterdir())[:5]:
        shutil.copy(source, data / source.name)
    shutil.copy(source, data / "a b#c.png")
    # Stored turned a quarter left and tagged "rotate 90 CW to view" (EXIF 6): the run's boxes
    # are in the upright picture's pixels, and so is the drawing.
    exif = Image.Exif()
    exif[0x0112] = 6
    upright = load(source)
    upright.transpose(Image.Transpose.ROTATE_90).save(data / "turned.png", exif=exif.tobytes())
    (data / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    out = root / "run"
    result = invoke(
        "run", data, "--model", demo_kit.models["digits-det"], *DETECTOR, "--out", out,
        "--cores", "0", "--readers", "1", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 1, result.output  # the corrupt image is an error row
    return out, data


def load(path: Path) -> Image.Image:
    """The image at ``path``, upright by its EXIF orientation, RGB (the file closed)."""
    with Image.open(path) as image:
        return ImageOps.exif_transpose(image).convert("RGB")


def recorded(folder: Path) -> list[str]:
    """The names export draw's record lists."""
    return [line.split(" ", 1)[1] for line in (folder / RECORD).read_text().splitlines()]


def _rows(run: Path) -> dict[str, dict]:
    return {r["id"]: r for r in read_run(run).predictions().to_pylist()}


def test_one_image_per_successful_item_with_its_boxes(detected, tmp_path):
    run, data = detected
    out = tmp_path / "drawn"
    result = invoke("export", "draw", run, "--out", out)
    assert result.exit_code == 0, result.output
    assert "drew 7 images" in result.stdout and "1 error row skipped" in result.stdout
    rows = _rows(run)
    ok = sorted(i for i, r in rows.items() if r["error"] is None)
    names = sorted(safe_name(i) + ".png" for i in ok)
    assert "a_b_c.png" in names and "turned.png" in names
    assert sorted(p.name for p in out.iterdir() if p.name != RECORD) == names
    assert sorted(recorded(out)) == names
    # each drawing is its image with the boxes >= 0.25 on it: the best box's left edge in
    # its class colour
    for item in ok:
        original = np.asarray(load(data / item))
        drawn = np.asarray(load(out / (safe_name(item) + ".png")))
        assert drawn.shape == original.shape
        best = max(rows[item]["boxes"], key=lambda b: b["score"])
        assert best["score"] >= 0.25
        x, y = round(best["x1"]), round((best["y1"] + best["y2"]) / 2)
        assert tuple(drawn[y, x]) == class_color(best["class_id"]), item


def test_conf_limit_and_ids(detected, tmp_path):
    run, data = detected
    done = export_draw(run, tmp_path / "none", conf=1.01)  # no box scores that much
    assert len(done.written) == 7 and done.error_rows == 1
    for name in done.written:
        item = next(p for p in data.iterdir() if safe_name(p.name) + ".png" == name)
        same = np.asarray(load(item))
        assert np.array_equal(np.asarray(load(tmp_path / "none" / name)), same)
    assert len(export_draw(run, tmp_path / "two", limit=2).written) == 2
    picked = export_draw(run, tmp_path / "one", ids=["a b#c.png", "corrupt.png"])
    assert picked.written == ["a_b_c.png"] and picked.error_rows == 1
    unknown = invoke("export", "draw", run, "--out", tmp_path / "u", "--ids", "nope.png")
    assert_error(unknown, 2, "name no item of the run", "'nope.png'")
    assert not (tmp_path / "u").exists()
    into_a_file = tmp_path / "f.png"
    into_a_file.write_bytes(b"")
    assert_error(invoke("export", "draw", run, "--out", into_a_file), 2, "is a file")
    jpeg = invoke("export", "draw", run, "--out", tmp_path / "j", "--format", "jpg", "--limit", "1")
    assert jpeg.exit_code == 0 and [p.suffix for p in (tmp_path / "j").glob("*g")] == [".jpg"]


def test_a_folder_that_is_not_empty_is_refused_and_overwrite_deletes_only_ours(detected, tmp_path):
    run, _ = detected
    out = tmp_path / "drawn"
    assert invoke("export", "draw", run, "--out", out).exit_code == 0
    (out / "notes.txt").write_text("mine")
    again = invoke("export", "draw", run, "--out", out, "--limit", "2")
    assert_error(again, 2, "is not empty", "--overwrite")
    assert len(list(out.iterdir())) == 9  # nothing touched
    first = sorted(recorded(out))
    # A file of the user's under a name export draw would use is kept and not written over.
    (out / first[0]).unlink()
    (out / first[0]).write_text("a file of the user's")
    # A record naming a file outside the folder deletes nothing there.
    (tmp_path / "outside.png").write_text("keep")
    with open(out / RECORD, "a") as record:
        record.write(f"{hashlib.sha256(b'keep').hexdigest()} ../outside.png\n")
    done = invoke("export", "draw", run, "--out", out, "--overwrite", "--limit", "2")
    assert done.exit_code == 0, done.output
    assert (out / "notes.txt").read_text() == "mine"
    assert (tmp_path / "outside.png").read_text() == "keep"
    new = recorded(out)
    assert len(new) == 2 and first[0] not in new  # the user's name taken: an -index name
    assert (out / first[0]).read_text() == "a file of the user's"
    expected = [RECORD, "notes.txt", first[0], *new]  # the other earlier drawings: deleted
    assert sorted(p.name for p in out.iterdir()) == sorted(expected)


def test_a_classification_run_over_a_tar_shard_has_its_top1_as_caption(demo_kit, tmp_path):
    digits = tmp_path / "digits"
    for item in ("0/0000.png", "3/0003.png", "7/0007.png"):
        (digits / item).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(demo_kit.dataset / item, digits / item)
    (shard,) = write_shards(digits, tmp_path / "shards", 1)
    run = tmp_path / "cls"
    result = invoke(
        "run", shard, "--model", demo_kit.models["digits"], "--out", run,
        "--cores", "0", "--readers", "1", "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    done = export_draw(run, tmp_path / "drawn")  # each member read from the shard (ids: keys)
    assert sorted(done.written) == ["0_0000.png", "3_0003.png", "7_0007.png"]
    for item, row in _rows(run).items():
        assert row["pred"] is not None
        image = load(tmp_path / "drawn" / (safe_name(item) + ".png"))
        assert image.size == (256, 256)  # the 8x8 digit enlarged 32 times, pixels kept
        original = load(digits / f"{item}.png").resize((256, 256), Image.Resampling.NEAREST)
        diff = np.any(np.asarray(image) != np.asarray(original), axis=2)
        assert diff[:12, :20].any() and not diff[40:, :].any()  # only the caption's corner


def test_a_raw_run_or_a_missing_run_is_a_usage_error(tmp_path):
    missing = invoke("export", "draw", tmp_path / "nothing", "--out", tmp_path / "d")
    assert_error(missing, 2)
    assert not (tmp_path / "d").exists()


def test_a_dataset_gone_is_one_error_line_and_touches_nothing(detected, tmp_path):
    run, data = detected
    out = tmp_path / "drawn"
    assert invoke("export", "draw", run, "--out", out, "--limit", "1").exit_code == 0
    before = sorted(p.name for p in out.iterdir())
    moved = data.with_name("moved")
    data.rename(moved)
    try:
        gone = invoke("export", "draw", run, "--out", out, "--overwrite")
        fresh = invoke("export", "draw", run, "--out", tmp_path / "fresh")
    finally:
        moved.rename(data)
    assert_error(gone, 2, "dataset cannot be opened now", str(data))
    assert sorted(p.name for p in out.iterdir()) == before  # the earlier drawing kept
    assert_error(fresh, 2, "dataset cannot be opened now")
    assert not (tmp_path / "fresh").exists()


def test_an_item_that_became_a_fifo_is_skipped_unopened(detected, tmp_path):
    # export draw reads the items again in its own process: an item that is now a symlink to
    # a FIFO (or a file on a dead mount) must not block it, deaf to Ctrl-C.
    run, data = detected
    item = sorted(data.glob("*.png"))[0]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    item.rename(tmp_path / "kept")
    item.symlink_to(fifo)
    try:
        drawing = threading.Thread(
            target=lambda: done.append(export_draw(run, tmp_path / "drawn")), daemon=True
        )
        drawing.start()
        drawing.join(60)
        if drawing.is_alive():  # blocked in open(): a writer that comes and goes lets it go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            drawing.join()
    finally:
        item.unlink()
        (tmp_path / "kept").rename(item)
    (export,) = done
    assert export.unreadable == [(item.name, "not a regular file")]
    assert len(export.written) == 6  # the others: 7 successful items, one now a FIFO
