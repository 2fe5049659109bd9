"""A list's missing or unreadable file: its error row names the list's line, as a malformed
row's does (batchinfer.data.listed, engine/collector.py), on one board and on Ray."""

from __future__ import annotations

import csv
from pathlib import Path

from runs import config, fast_sim

from batchinfer import run
from batchinfer.results import read_predictions


def _list_with_a_missing_file(kit: Path, tmp_path: Path) -> Path:
    files = sorted((kit / "3").glob("*.png"))[:3]
    lst = tmp_path / "list.csv"
    with open(lst, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "id"])
        w.writerow([str(files[0]), "a"])
        w.writerow([str(tmp_path / "gone.png"), "gone"])  # line 3
        (tmp_path / "empty.png").write_bytes(b"")
        w.writerow([str(tmp_path / "empty.png"), "empty"])  # line 4
        w.writerows([[str(p), f"b{i}"] for i, p in enumerate(files[1:])])
    return lst


def _errors(out: Path) -> dict[str, str]:
    rows = read_predictions(out).to_pylist()
    return {r["id"]: r["error"] for r in rows if r["error"] is not None}


def test_a_missing_file_of_a_list_is_an_error_row_naming_its_line(tmp_path, demo_kit):
    lst = _list_with_a_missing_file(demo_kit.dataset, tmp_path)
    out = tmp_path / "o"
    result = run(config(lst, demo_kit.models["digits"], backend="sim", sim=fast_sim(), out=out))
    assert (result.succeeded, result.errors) == (3, 2)
    errors = _errors(out)
    assert errors["gone"].startswith(f"line 3 of {lst}: ") and "No such file" in errors["gone"]
    assert errors["empty"].startswith(f"line 4 of {lst}: ") and "empty" in errors["empty"]
