"""Ground-truth readers: COCO and YOLO matched to dataset items, what is left unmatched,
image sizes after EXIF orientation, and model classes mapped onto categories."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
from PIL import Image

from batchinfer.evaluate.groundtruth import (
    Category,
    GroundTruth,
    GroundTruthError,
    category_ids_for,
    image_size,
    read_coco,
    read_yolo,
)


def coco_file(tmp_path: Path, images: list[tuple[int, str]], annotations: list[dict]) -> Path:
    path = tmp_path / "instances.json"
    data = {
        "images": [{"id": i, "file_name": name, "width": 64, "height": 48} for i, name in images],
        "annotations": annotations,
        "categories": [{"id": 1, "name": "cat"}, {"id": 3, "name": "dog"}],
    }
    path.write_text(json.dumps(data))
    return path


def ann(id_: int, image_id: int, category_id: int = 1, **extra) -> dict:
    return {"id": id_, "image_id": image_id, "category_id": category_id,
            "bbox": [1, 2, 10, 20], **extra}  # fmt: skip


# --------------------------------------------------------------------------- COCO
def test_coco_matches_by_relative_path_then_unique_base_name(tmp_path):
    items = ["val/a.jpg", "val/b.jpg", "other/b.jpg", "c.jpg", "x/d.jpg"]
    path = coco_file(
        tmp_path,
        [
            (10, "val/a.jpg"),  # the relative path
            (11, ".\\val\\b.jpg"),  # Windows separators and ./ are tolerated
            (12, "c.jpg"),
            (13, "images/d.jpg"),  # no such path: the base name, which one item has
            (14, "b.jpg"),  # base name of two items: ambiguous, so not matched
            (15, "gone.jpg"),  # no item at all
        ],
        [ann(1, 10), ann(2, 11, 3), ann(3, 13), ann(4, 15), ann(5, 15), ann(6, 14)],
    )
    gt = read_coco(path, items)
    assert gt.image_ids == {"val/a.jpg": 10, "val/b.jpg": 11, "c.jpg": 12, "x/d.jpg": 13}
    assert gt.unmatched_items == ("other/b.jpg",)
    assert gt.unknown_images == ("b.jpg", "gone.jpg")
    assert gt.dropped_annotations == 3  # two of gone.jpg, one of b.jpg
    # c.jpg is listed with no annotation: matched, an image with no objects.
    assert {a["image_id"] for a in gt.annotations} == {10, 11, 13}
    summary = gt.summary()
    assert summary["unmatched_items"] == 1 and summary["unknown_images"] == 2
    assert summary["format"] == "coco" and len(summary["sha256"]) == 64


def test_coco_annotations_get_fresh_ids_area_and_crowd(tmp_path):
    path = coco_file(tmp_path, [(5, "a.jpg")], [ann(0, 5, iscrowd=1, area=33.0), ann(7, 5)])
    gt = read_coco(path, ["a.jpg"])
    assert [a["id"] for a in gt.annotations] == [1, 2]  # COCO's matcher reads 0 as "none"
    assert [a["iscrowd"] for a in gt.annotations] == [1, 0]
    assert [a["area"] for a in gt.annotations] == [33.0, 200.0]  # given, else w x h
    assert gt.categories == (Category(1, "cat"), Category(3, "dog"))


@pytest.mark.parametrize(
    ("images", "annotations", "words"),
    [
        ([(1, "a.jpg"), (2, "./a.jpg")], [], "both name the dataset item a.jpg"),
        ([(1, "a.jpg"), (1, "b.jpg")], [], "image id 1 twice"),
        ([(1, "a.jpg")], [ann(1, 2)], "names image 2"),
        ([(1, "a.jpg")], [ann(1, 1, 7)], "names category 7"),
        ([(1, "a.jpg")], [{"id": 1, "image_id": 1, "category_id": 1}], "no bbox"),
        ([(1, "a.jpg")], [{**ann(1, 1), "bbox": [0, 0, -1, 2]}], "negative width"),
        # issue 40: a copied annotation counted as a second object, silently
        (
            [(1, "a.jpg")],
            [ann(4, 1), ann(9, 1), ann(4, 1), ann(9, 1), ann(4, 1)],
            r"gives 2 annotation id\(s\) to more than one annotation \(4, 9\)",
        ),
        (
            [(1, "a.jpg")],
            [ann(k % 7, 1) for k in range(14)],
            r"gives 7 annotation id\(s\) .* \(0, 1, 2, 3, 4 and 2 more\)",
        ),
        ([(1, "a.jpg")], [{**ann(1, 1), "id": [1]}], r"annotation 0 .* has the id a list of 1"),
    ],
)
def test_coco_inconsistent_files_are_refused(tmp_path, images, annotations, words):
    path = coco_file(tmp_path, images, annotations)
    with pytest.raises(GroundTruthError, match=words) as info:
        read_coco(path, ["a.jpg", "b.jpg"])
    assert info.value.exit_code == 2


def test_coco_unreadable_or_not_coco(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(GroundTruthError, match="not valid JSON"):
        read_coco(bad, [])
    bad.write_text('{"images": []}')
    with pytest.raises(GroundTruthError, match="not a COCO instances file"):
        read_coco(bad, [])
    with pytest.raises(GroundTruthError, match="cannot be read"):
        read_coco(tmp_path / "missing.json", [])


# --------------------------------------------------------------------------- sizes
def jpeg(path: Path, size: tuple[int, int], orientation: int | None = None) -> Path:
    img = Image.new("RGB", size, (90, 120, 150))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, exif=exif.tobytes())
    return path


@pytest.mark.parametrize(("orientation", "expected"), [(None, (40, 30)), (1, (40, 30)),
                                                       (3, (40, 30)), (6, (30, 40)),
                                                       (8, (30, 40)), (5, (30, 40))])  # fmt: skip
def test_image_size_is_after_exif_orientation(tmp_path, orientation, expected):
    path = jpeg(tmp_path / "p.jpg", (40, 30), orientation)
    assert image_size(path) == expected
    assert image_size(path, exif_orientation=False) == (40, 30)


def test_image_size_reads_the_header_only(tmp_path):
    path = jpeg(tmp_path / "p.jpg", (4000, 3000), 6)
    data = path.read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 3])  # pixels cut off: header intact
    assert image_size(tmp_path / "cut.jpg") == (3000, 4000)
    (tmp_path / "junk.jpg").write_bytes(b"not an image")
    with pytest.raises(GroundTruthError, match="cannot read the size"):
        image_size(tmp_path / "junk.jpg")


def test_image_size_refuses_a_fifo_without_blocking(tmp_path):
    # A symlink to a FIFO is a dataset item; its size was read with a plain open, which
    # blocked the coordinator for ever (deaf to Ctrl-C) before the run.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "p.jpg").symlink_to(fifo)
    refused: list[str] = []

    def read_size() -> None:
        with pytest.raises(GroundTruthError) as caught:
            image_size(tmp_path / "p.jpg")
        refused.append(str(caught.value))

    reader = threading.Thread(target=read_size, daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # blocked in open(): a writer that comes and goes lets it return
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
    assert refused == [
        f"The image {tmp_path / 'p.jpg'} is a FIFO (named pipe), not a regular file; YOLO "
        "labels are normalised to the image's size, so the image must be readable."
    ]


# --------------------------------------------------------------------------- YOLO
def yolo_dataset(tmp_path: Path) -> tuple[Path, list[str], dict[str, Path]]:
    root = tmp_path / "data"
    files = {
        "images/a.jpg": jpeg(root / "images/a.jpg", (200, 100)),
        "images/b.jpg": jpeg(root / "images/b.jpg", (200, 100), orientation=6),  # upright 100x200
        "images/c.jpg": jpeg(root / "images/c.jpg", (50, 50)),
        "images/d.jpg": jpeg(root / "images/d.jpg", (50, 50)),
    }
    labels = root / "labels"
    labels.mkdir()
    (labels / "a.txt").write_text("0 0.5 0.5 0.5 0.2\n1 0.1 0.1 0.2 0.2\n")
    (labels / "b.txt").write_text("2 0.5 0.25 0.4 0.1\n\n")
    (labels / "c.txt").write_text("")  # an image with no objects
    (labels / "ghost.txt").write_text("0 0.5 0.5 0.1 0.1\n")  # no such image
    return labels, list(files), {k: str(v) for k, v in files.items()}


def test_yolo_boxes_are_denormalised_by_the_upright_size(tmp_path):
    labels, items, paths = yolo_dataset(tmp_path)
    gt = read_yolo(labels, items, paths, names=["cat", "dog", "bird"])
    assert gt.image_ids == {"images/a.jpg": 1, "images/b.jpg": 2, "images/c.jpg": 3}
    boxes = {(a["image_id"], a["category_id"]): a["bbox"] for a in gt.annotations}
    assert boxes[1, 0] == pytest.approx([50, 40, 100, 20])
    assert boxes[1, 1] == pytest.approx([0, 0, 40, 20])
    # b.jpg is stored 200x100 with orientation 6: upright it is 100 wide, 200 high.
    assert boxes[2, 2] == pytest.approx([30, 40, 40, 20])
    assert [i["width"] for i in gt.images] == [200, 100, 50]
    assert gt.unmatched_items == ("images/d.jpg",)  # no label file
    assert gt.unknown_images == ("ghost.txt",)
    assert gt.dropped_annotations == 1
    assert [c.name for c in gt.categories] == ["cat", "dog", "bird"]


def test_yolo_missing_files_as_empty_images_and_default_names(tmp_path):
    labels, items, paths = yolo_dataset(tmp_path)
    gt = read_yolo(labels, items, paths, missing_is_empty=True)
    assert gt.unmatched_items == ()
    assert "images/d.jpg" in gt.image_ids
    assert [c.name for c in gt.categories] == ["0", "1", "2"]


def test_yolo_relative_path_wins_over_stem(tmp_path):
    root = tmp_path / "data"
    paths = {
        "train/x.jpg": str(jpeg(root / "train/x.jpg", (10, 10))),
        "val/x.jpg": str(jpeg(root / "val/x.jpg", (10, 10))),
        "val/y.png": str(jpeg(root / "val/y.png", (10, 10))),
    }
    labels = tmp_path / "labels"
    (labels / "val").mkdir(parents=True)
    (labels / "train").mkdir(parents=True)
    (labels / "val/x.txt").write_text("0 0.5 0.5 1 1\n")
    (labels / "train/x.txt").write_text("")
    (labels / "y.txt").write_text("0 0.5 0.5 1 1\n")  # stem y: one item has it
    gt = read_yolo(labels, list(paths), paths)
    assert set(gt.image_ids) == {"train/x.jpg", "val/x.jpg", "val/y.png"}
    by_item = {i["file_name"]: i["id"] for i in gt.images}
    assert [a["image_id"] for a in gt.annotations] == [by_item["val/x.jpg"], by_item["val/y.png"]]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("0 0.5 0.5 0.1", "has 4 values"),
        ("a 0.5 0.5 0.1 0.1", "is not 'class cx cy w h'"),
        ("5 0.5 0.5 0.1 0.1", "names class 5; the class names list 3"),
        ("0 0.5 0.5 -0.1 0.1", "bad box"),
    ],
)
def test_yolo_bad_lines_are_refused_with_file_and_line(tmp_path, line, words):
    labels, items, paths = yolo_dataset(tmp_path)
    (labels / "a.txt").write_text(f"0 0.5 0.5 0.1 0.1\n{line}\n")
    with pytest.raises(GroundTruthError, match=words) as info:
        read_yolo(labels, items, paths, names=["a", "b", "c"])
    assert "a.txt line 2" in str(info.value)


def test_yolo_without_a_labels_folder(tmp_path):
    with pytest.raises(GroundTruthError, match="does not exist"):
        read_yolo(tmp_path / "labels", [], {})


# --------------------------------------------------------------------------- classes
def gt_with(categories: list[tuple[int, str]]) -> GroundTruth:
    cats = tuple(Category(i, n) for i, n in categories)
    return GroundTruth({}, cats, {}, (), (), (), ())


def test_category_ids_by_name_then_by_order():
    gt = gt_with([(1, "person"), (3, "Traffic Light"), (2, "car")])
    assert category_ids_for(["car", "person", "traffic light"], gt) == [2, 1, 3]
    # The model zoo's names differ from COCO's: same count, so by sorted id order.
    assert category_ids_for(["a", "b", "c"], gt) == [1, 2, 3]
    with pytest.raises(GroundTruthError, match=r"2 classes .* 3 categories"):
        category_ids_for(["a", "b"], gt)


def test_items_not_evaluated_are_matched_but_not_scored(tmp_path):
    # dataset.limit: the entries of images past the limit are neither scored nor "unknown".
    items = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    path = coco_file(tmp_path, [(1, "a.jpg"), (2, "c.jpg"), (3, "zz.jpg")],
                     [ann(1, 1), ann(2, 2), ann(3, 3)])  # fmt: skip
    gt = read_coco(path, items, scored={"a.jpg", "b.jpg"})
    assert gt.image_ids == {"a.jpg": 1}
    assert [a["image_id"] for a in gt.annotations] == [1]
    assert gt.unmatched_items == ("b.jpg",)  # d.jpg is past the limit: not counted
    assert gt.unknown_images == ("zz.jpg",) and gt.dropped_annotations == 1


def test_yolo_reads_the_size_of_evaluated_images_only(tmp_path):
    labels, items, paths = yolo_dataset(tmp_path)
    (tmp_path / "data/images/c.jpg").write_bytes(b"broken")  # its header is never read
    gt = read_yolo(labels, items, paths, scored={"images/a.jpg", "images/b.jpg"})
    assert set(gt.image_ids) == {"images/a.jpg", "images/b.jpg"}
    assert gt.unmatched_items == () and gt.unknown_images == ("ghost.txt",)
