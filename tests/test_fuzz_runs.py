"""Fuzz tier, end to end (slow): the strongest cases the library-level fuzz tests found,
through ``batchinfer run`` and ``eval`` as a user meets them, each run's process tree
watched and killed past a memory bound (tests/fuzz_support.py: run_cli_watched)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from fuzz_support import run_cli_watched

from batchinfer.results import read_predictions

pytestmark = pytest.mark.slow

#: No process of a run over a few small files may hold more than this.
RSS_BOUND = 600 << 20


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def _run(dataset: Path, model: Path, out: Path, *extra: str):
    return run_cli_watched(
        ["run", str(dataset), "--model", str(model), "--out", str(out), "--no-progress",
         "--cores", "0", *extra],
        rss_bound=RSS_BOUND,
    )  # fmt: skip


def _rows(out: Path) -> dict[str, str | None]:
    table = read_predictions(out, columns=["id", "error"]).to_pydict()
    return dict(zip(table["id"], table["error"], strict=True))


def test_npy_and_npz_bombs_are_error_rows_in_bounded_memory(demo_kit, tmp_path):
    """A sparse .npy whose header says 4 GiB, and a 5 MB .npz whose image array declares
    and holds 1 GiB of zeros, beside good items: each bomb is its own error row."""
    model = demo_kit.models["digits"]
    image = np.zeros((1, 8, 8, 1), np.uint8)
    npy = tmp_path / "npy"
    npy.mkdir()
    np.save(npy / "good.npy", image)
    with open(npy / "bomb.npy", "wb") as f:
        f.write(b"\x93NUMPY\x02\x00" + (2**32 - 16).to_bytes(4, "little") + b"{'descr'")
        f.truncate(2**32 + 64)
    npz = tmp_path / "npz"
    npz.mkdir()
    np.savez(npz / "good.npz", image=image)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        head, {"descr": "|u1", "fortran_order": False, "shape": (1 << 30,)}
    )
    zeros = bytes(1 << 24)
    with (
        zipfile.ZipFile(npz / "bomb.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z,
        z.open("image.npy", "w", force_zip64=True) as f,
    ):
        f.write(head.getvalue())
        for _ in range(64):
            f.write(zeros)
    for dataset in (npy, npz):
        out = tmp_path / f"out-{dataset.name}"
        done = _run(dataset, model, out)
        assert done.returncode == 1, (done, dataset)
        assert done.peak_rss < RSS_BOUND
        rows = _rows(out)
        assert sorted(rows) == [f"bomb.{dataset.name}", f"good.{dataset.name}"]
        assert rows[f"good.{dataset.name}"] is None
        assert "header" in rows[f"bomb.{dataset.name}"] or "shape" in rows[f"bomb.{dataset.name}"]


def test_a_split_list_that_is_not_utf8_is_one_line_exit_2(demo_kit, tmp_path):
    (tmp_path / "val.txt").write_bytes(b"\x80\xff images/a.png\n")
    (tmp_path / "data.yaml").write_text("val: val.txt\n")
    done = _run(tmp_path / "data.yaml", demo_kit.models["digits"], tmp_path / "o")
    assert done.returncode == 2, done
    assert "not UTF-8" in _one_line(done.stderr)


def test_a_labels_file_past_int64_is_one_line_exit_2(demo_kit, tmp_path):
    labels = tmp_path / "labels.json"
    # The demo's class folders 0..9; folder 9 given a label no int64 column holds.
    labels.write_text(json.dumps({**{str(n): n for n in range(9)}, "9": 2**63}))
    done = _run(
        demo_kit.dataset, demo_kit.models["digits"], tmp_path / "o", "--labels", str(labels)
    )
    assert done.returncode == 2, done
    assert "9223372036854775808" in _one_line(done.stderr)


def test_a_job_file_nested_deep_is_one_line_exit_2(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\n[metrics]\ncustom = ' + "[" * 5000 + "]" * 5000 + "\n")
    done = run_cli_watched(["eval", str(job), "--no-progress"], rss_bound=RSS_BOUND)
    assert done.returncode == 2, done
    assert str(job) in _one_line(done.stderr)
