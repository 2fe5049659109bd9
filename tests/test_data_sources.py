"""Datasets named by a list: .txt/.csv/.jsonl/.parquet manifests, COCO JSON, data.yaml, globs
(batchinfer.data.sources and the modules it dispatches to), and their runs."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from runs import config, fast_sim
from test_cli import assert_error, invoke, run_args

from batchinfer import run
from batchinfer.data.fingerprint import files_sha256
from batchinfer.data.preprocess import BAD_ROW
from batchinfer.data.sources import open_source
from batchinfer.errors import DatasetError
from batchinfer.results import read_predictions


def _images(folder: Path, names: list[str]) -> None:
    for i, name in enumerate(names):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), i * 20, np.uint8)).save(path)


def _csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


# ----------------------------------------------------------------------------- forms
def test_a_txt_list_reads_paths_relative_to_itself_with_optional_labels(tmp_path):
    _images(tmp_path / "imgs", ["a.png", "b.png", "c.png"])
    lst = tmp_path / "val.txt"
    lst.write_text("# ImageNet style\nimgs/a.png 3\n\nimgs/b.png\t7\n./imgs/c.png\n")
    ds = open_source(lst)
    items = list(ds)
    assert [i.id for i in items] == ["imgs/a.png", "imgs/b.png", "imgs/c.png"]
    assert [i.label for i in items] == [3, 7, None]
    assert items[0].path == str(tmp_path / "imgs" / "a.png")
    assert (ds.form, ds.kind, len(ds)) == ("txt", "images", 3)
    assert ds.label_rule == "the label column's integers are the labels"


def test_a_csv_list_gives_ids_class_names_and_carried_columns(tmp_path):
    _images(tmp_path, ["x.png", "y.png", "z.png"])
    lst = _csv(
        tmp_path / "m.csv",
        ["path", "id", "label", "source", "score"],
        [["x.png", "cat-1", "cat", "cam1", "0.5"], ["y.png", "dog-1", "dog", "cam2", ""],
         ["z.png", "cat-2", "cat", "cam1", "1"]],
    )  # fmt: skip
    ds = open_source(lst)
    items = list(ds)
    assert [i.id for i in items] == ["cat-1", "dog-1", "cat-2"]
    assert [(i.label, i.label_name) for i in items] == [(0, "cat"), (1, "dog"), (0, "cat")]
    assert items[1].columns == {"source": "cam2", "score": ""}
    assert str(ds.meta_type) == "struct<source: string, score: string>"  # CSV carries text


def test_a_jsonl_list_infers_the_types_of_its_other_columns(tmp_path):
    _images(tmp_path, ["a.png", "b.png"])
    lst = tmp_path / "m.jsonl"
    rows = [
        {"path": "a.png", "id": 1, "w": 2, "f": 1.5, "tags": ["x"], "ok": True},
        {"path": "b.png", "id": 2, "w": None, "f": 3, "tags": "y", "ok": False},
    ]
    lst.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = open_source(lst)
    assert str(ds.meta_type) == "struct<w: int64, f: double, tags: string, ok: bool>"
    items = list(ds)
    assert [i.id for i in items] == ["1", "2"]
    assert items[0].columns == {"w": 2, "f": 1.5, "tags": '["x"]', "ok": True}


def test_a_parquet_list_keeps_its_column_types_and_reads_in_batches(tmp_path):
    from batchinfer.data.listed import open_listed
    from batchinfer.data.manifest import ParquetList

    _images(tmp_path / "i", [f"{n}.png" for n in range(5)])
    pq.write_table(
        pa.table({"path": [f"i/{n}.png" for n in range(5)], "label": [0, 1, 0, 1, None],
                  "weight": pa.array([0.5] * 5, pa.float32())}),
        tmp_path / "m.parquet",
    )  # fmt: skip
    ds = open_listed(ParquetList(tmp_path / "m.parquet", batch_rows=2))  # 3 batches
    items = list(ds)
    assert [i.index for i in items] == list(range(5))
    assert [i.label for i in items] == [0, 1, 0, 1, None]
    assert str(ds.meta_type) == "struct<weight: float>"
    assert [(i.id, i.label) for i in open_source(tmp_path / "m.parquet")] == [
        (i.id, i.label) for i in items
    ]


def test_a_coco_json_reads_its_images_against_the_image_root(tmp_path):
    _images(tmp_path / "val2017", ["1.png", "2.png"])
    ann = tmp_path / "annotations" / "instances.json"
    ann.parent.mkdir()
    ann.write_text(json.dumps({"images": [{"id": 7, "file_name": "2.png"},
                                          {"id": 9, "file_name": "1.png"}]}))  # fmt: skip
    ds = open_source(ann, image_root=tmp_path / "val2017")
    items = list(ds)
    assert [(i.id, i.columns) for i in items] == [
        ("2.png", {"image_id": 7}),
        ("1.png", {"image_id": 9}),
    ]
    assert items[0].path == str(tmp_path / "val2017" / "2.png")
    with pytest.raises(DatasetError, match="no images list"):
        (tmp_path / "bad.json").write_text("{}")
        open_source(tmp_path / "bad.json")


def test_an_ultralytics_yaml_gives_its_val_split(tmp_path):
    _images(tmp_path / "ds" / "images" / "val", ["b.png", "a.png", "sub/c.png"])
    _images(tmp_path / "ds" / "images" / "test", ["t.png"])
    (tmp_path / "ds" / "extra.txt").write_text("./images/test/t.png\n")
    (tmp_path / "cfg").mkdir()
    yml = tmp_path / "cfg" / "data.yaml"
    yml.write_text(
        "path: ../ds\ntrain: images/train\nval: [images/val, extra.txt]\nnames: {0: a}\n"
    )
    items = list(open_source(yml))
    assert [i.id for i in items] == [
        "images/val/a.png", "images/val/b.png", "images/val/sub/c.png", "images/test/t.png"
    ]  # fmt: skip
    yml.write_text("path: ../ds\ntrain: images/train\n")
    with pytest.raises(DatasetError, match="no val split"):
        open_source(yml)


def test_a_glob_matches_files_at_any_depth_with_ids_from_its_fixed_folder(tmp_path):
    _images(tmp_path / "imgs", ["a.png", "d/b.png", ".hidden/c.png", "__MACOSX/d.png"])
    (tmp_path / "imgs" / "note.txt").write_text("x")
    ds = open_source(str(tmp_path / "imgs" / "**" / "*.png"))
    assert [i.id for i in ds] == ["a.png", "d/b.png"]
    with pytest.raises(DatasetError, match="matches no file"):
        open_source(str(tmp_path / "imgs" / "*.jpg"))


# ----------------------------------------------------------------------------- bad lists
@pytest.mark.parametrize(
    ("name", "write", "needle"),
    [
        ("dup.csv", lambda p: _csv(p, ["path", "id"], [["a.png", "1"], ["b.png", "2"],
                                                       ["c.png", "1"]]),
         "gives the same item id twice: '1' (line 2 and line 4)"),
        ("dup.txt", lambda p: p.write_text("a.png\nb.png\n./a.png\n"),
         "'a.png' (line 1 and line 3)"),
        ("nopath.csv", lambda p: _csv(p, ["file", "label"], [["a.png", "1"]]), "no path column"),
        ("nopath.jsonl", lambda p: p.write_text('{"file": "a.png"}\n'), "no path column"),
        ("nopath.parquet", lambda p: pq.write_table(pa.table({"f": ["a"]}), p), "no path column"),
        ("float.parquet", lambda p: pq.write_table(pa.table({"path": ["a"], "label": [0.5]}), p),
         "The label column of"),
        ("intpath.parquet", lambda p: pq.write_table(pa.table({"path": [1]}), p),
         "The path column of"),
        ("badlabel.jsonl", lambda p: p.write_text('{"path": "a.png", "label": 2.5}\n'),
         "holds 2.5 at line 1"),
        ("mixed.csv", lambda p: _csv(p, ["path", "label"], [["a.png", "1"], ["b.png", "cat"]]),
         "mixes integers"),
        ("empty.csv", lambda p: _csv(p, ["path"], []), "has no rows"),
    ],
)  # fmt: skip
def test_a_bad_list_is_one_sentence_and_exit_2(tmp_path, demo_kit, name, write, needle):
    path = tmp_path / name
    write(path)
    with pytest.raises(DatasetError, match=re.escape(needle)):
        open_source(path)
    result = invoke(*run_args(path, demo_kit.models["digits"], tmp_path / "o"))
    assert_error(result, 2, needle)
    assert not (tmp_path / "o").exists()


def test_malformed_rows_are_items_whose_error_names_the_line(tmp_path):
    _images(tmp_path, ["a.png", "b.png"])
    lst = tmp_path / "m.csv"
    lst.write_text('path,label\na.png,1\nb.png,2,extra\n"unterminated\n')
    ds = open_source(lst)
    assert (len(ds), ds.bad_rows) == (3, 2)
    items = list(ds)
    assert items[0].path == str(tmp_path / "a.png")
    assert items[1].path.startswith(BAD_ROW)
    assert "line 3 of" in items[1].path and "3 fields where the header has 2" in items[1].path
    assert items[1].id == "line 3"
    assert any("each becomes an error row" in w for w in ds.notes()[1])


def test_a_run_over_a_list_makes_error_rows_for_bad_lines_and_missing_files(tmp_path, demo_kit):
    files = sorted((demo_kit.dataset / "3").glob("*.png"))[:4]
    lst = tmp_path / "m.jsonl"
    lines = [json.dumps({"path": str(f), "id": f"d{n}", "src": "kit"}) for n, f in enumerate(files)]
    lines[1:1] = ["not json", json.dumps({"path": str(tmp_path / "gone.png"), "id": "gone"})]
    lst.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    result = run(config(lst, demo_kit.models["digits"], backend="sim", sim=fast_sim(), out=out))
    assert (result.status, result.succeeded, result.errors) == ("complete", 4, 2)
    table = read_predictions(out).sort_by("index").to_pylist()
    assert [r["index"] for r in table] == list(range(6))
    assert "line 2 of" in table[1]["error"] and "not valid JSON" in table[1]["error"]
    assert table[2]["id"] == "gone" and "No such file" in table[2]["error"]
    assert table[0]["meta"] == {"src": "kit"} and table[1]["meta"] == {"src": None}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dataset"]["form"] == "jsonl"
    assert manifest["dataset"]["bad_rows"] == 1


def test_the_fingerprint_of_a_list_changes_with_its_content_and_its_files(tmp_path):
    _images(tmp_path, ["a.png", "b.png"])
    lst = _csv(tmp_path / "m.csv", ["path"], [["a.png"], ["b.png"]])
    first = open_source(lst)
    content = files_sha256(first, "content")
    _csv(lst, ["path"], [["b.png"], ["a.png"]])
    assert first.listing_sha256 != open_source(lst).listing_sha256
    _csv(lst, ["path"], [["a.png"], ["b.png"]])
    assert first.listing_sha256 == open_source(lst).listing_sha256
    _images(tmp_path, ["b.png"])  # a.png rewritten with b's pixels
    assert files_sha256(open_source(lst), "content") != content


def test_a_resume_of_a_list_whose_content_changed_is_refused(tmp_path, demo_kit):
    files = sorted((demo_kit.dataset / "5").glob("*.png"))[:3]
    lst = _csv(tmp_path / "m.csv", ["path"], [[str(f)] for f in files])
    out = tmp_path / "o"
    args = run_args(lst, demo_kit.models["digits"], out)
    assert invoke(*args).exit_code == 0
    _csv(lst, ["path"], [[str(f)] for f in files[:2]])
    assert_error(invoke(*args, "--resume"), 2, "dataset")


def test_a_labels_file_maps_a_lists_class_names(tmp_path):
    _images(tmp_path, ["a.png", "b.png"])
    lst = _csv(tmp_path / "m.csv", ["path", "label"], [["a.png", "zebra"], ["b.png", "ant"]])
    (tmp_path / "names.txt").write_text("zebra\nant\n")
    ds = open_source(lst, labels_file=tmp_path / "names.txt")
    assert [(i.label, i.label_name) for i in ds] == [(0, "zebra"), (1, "ant")]
    (tmp_path / "names.txt").write_text("zebra\n")
    with pytest.raises(DatasetError, match="not in the labels file"):
        open_source(lst, labels_file=tmp_path / "names.txt")


def test_bench_repeats_a_list_as_it_repeats_a_folder(tmp_path):
    from batchinfer.bench.runner import RepeatedDataset

    _images(tmp_path, ["a.png", "b.png"])
    source = RepeatedDataset(
        open_source(_csv(tmp_path / "m.csv", ["path"], [["a.png"], ["b.png"]]))
    )
    items = []
    for item in source:
        items.append((item.index, item.id))
        if len(items) == 5:
            source.finish()
    assert items == [(0, "a.png"), (1, "b.png"), (2, "a.png"), (3, "b.png"), (4, "a.png")]


def test_a_parquet_lists_categorical_and_nested_columns_are_carried_as_values(tmp_path):
    from batchinfer.sink.predictions import _meta_array

    _images(tmp_path, ["a.png"])
    categorical = pa.array(["x", "y"]).dictionary_encode()
    table = pa.table(
        {"path": ["a.png"] * 2, "id": ["1", "2"], "cat": categorical, "l": [[1, 2], [3]]}
    )
    pq.write_table(table, tmp_path / "m.parquet")
    ds = open_source(tmp_path / "m.parquet")
    assert str(ds.meta_type) == "struct<cat: string, l: list<element: int64>>"
    meta = _meta_array([i.columns for i in ds], ds.meta_type)
    assert meta.to_pylist() == [{"cat": "x", "l": [1, 2]}, {"cat": "y", "l": [3]}]


def test_paths_of_finds_a_lists_files_by_id(tmp_path):
    _images(tmp_path, ["a.png", "b.png"])
    lst = _csv(tmp_path / "m.csv", ["path", "id"], [["a.png", "x"], ["b.png", "y"]])
    assert open_source(lst).paths_of(["y"]) == {"y": str(tmp_path / "b.png")}
