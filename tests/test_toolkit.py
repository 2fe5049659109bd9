"""The toolkit backend's parts that need no rknn-toolkit2: what it reads, the fingerprint,
the build cache's lock, and what it says where the toolkit is missing.

The parts that run rknn-toolkit2 are in test_toolkit_sim.py (``toolkit`` marker).
"""

from __future__ import annotations

import fcntl
import json
import shutil
import threading
from pathlib import Path
from types import SimpleNamespace

import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import numpy as np
import pytest

from batchinfer import demo
from batchinfer.errors import RuntimeUnavailableError
from batchinfer.runtime import runtime_class
from batchinfer.runtime import toolkit as T
from batchinfer.runtime import toolkit_build as B


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A folder holding the demo's digits-rk3566 with everything the toolkit reads."""
    folder = tmp_path / "models"
    folder.mkdir()
    demo.write_rknn_model(folder, "digits-rk3566")
    return folder


def test_toolkit_model_reads_the_files_beside_the_rknn(model_dir: Path) -> None:
    model = T.toolkit_model(model_dir / "digits-rk3566.rknn")
    assert model.onnx == model_dir / "digits-rk3566.onnx"
    assert model.settings == json.loads((model_dir / "digits-rk3566.config.json").read_text())
    assert model.platform == "rk3566"
    assert len(model.dataset) == 10 * demo.CALIBRATION_PER_CLASS
    # Relative paths in the list are relative to the list's folder, not to the cwd.
    assert model.dataset[0] == (model_dir / "calibration" / "digits" / "0000.png",)
    assert all(f.is_file() for sample in model.dataset for f in sample)
    # An .onnx works too: the same files beside it.
    assert T.toolkit_model(model_dir / "digits-rk3566.onnx").settings == model.settings


@pytest.mark.parametrize(
    ("remove", "message"),
    [
        ("digits-rk3566.onnx", "put digits-rk3566.onnx beside it"),
        ("digits-rk3566.config.json", "needs digits-rk3566.config.json beside"),
        ("digits-rk3566.dataset.txt", "needs digits-rk3566.dataset.txt beside"),
        ("calibration/digits/0012.png", r"0012\.png \(line 22 of .*dataset\.txt\) does not exist"),
    ],
)
def test_a_missing_file_is_named(model_dir: Path, remove: str, message: str) -> None:
    (model_dir / remove).unlink()
    with pytest.raises(T.ToolkitError, match=message):
        T.toolkit_model(model_dir / "digits-rk3566.rknn")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "hold a list, not a JSON object"),
    ],
)
def test_bad_settings_are_named(model_dir: Path, content: str, message: str) -> None:
    (model_dir / "digits-rk3566.config.json").write_text(content)
    with pytest.raises(T.ToolkitError, match=message):
        T.toolkit_model(model_dir / "digits-rk3566.rknn")


def test_an_empty_calibration_list_is_refused(model_dir: Path) -> None:
    (model_dir / "digits-rk3566.dataset.txt").write_text("\n  \n")
    with pytest.raises(T.ToolkitError, match="is empty"):
        T.toolkit_model(model_dir / "digits-rk3566.rknn")


def test_a_missing_target_platform_comes_from_the_rknn(model_dir: Path) -> None:
    settings_path = model_dir / "digits-rk3566.config.json"
    settings = json.loads(settings_path.read_text())
    del settings["target_platform"]
    settings_path.write_text(json.dumps(settings))
    assert T.toolkit_model(model_dir / "digits-rk3566.rknn").platform == "rk3566"
    # An .rknn that names no platform, and settings that name none: say what to add.
    (model_dir / "digits-rk3566.rknn").write_bytes(M.rknn_bytes({"version": "2.5.0"}))
    with pytest.raises(T.ToolkitError, match='"target_platform": "rk3588"'):
        T.toolkit_model(model_dir / "digits-rk3566.rknn")


def test_the_fingerprint_follows_content_not_paths(model_dir: Path, tmp_path: Path) -> None:
    base = T.fingerprint(T.toolkit_model(model_dir / "digits-rk3566.rknn"), "2.5.0")
    moved = shutil.copytree(model_dir, tmp_path / "elsewhere")
    assert T.fingerprint(T.toolkit_model(moved / "digits-rk3566.rknn"), "2.5.0") == base
    assert T.fingerprint(T.toolkit_model(moved / "digits-rk3566.rknn"), "2.5.1") != base

    def changed(edit) -> str:
        folder = shutil.copytree(model_dir, tmp_path / f"edit{len(list(tmp_path.iterdir()))}")
        edit(folder)
        return T.fingerprint(T.toolkit_model(folder / "digits-rk3566.rknn"), "2.5.0")

    def settings(folder: Path) -> None:
        path = folder / "digits-rk3566.config.json"
        path.write_text(path.read_text().replace("w8a8", "w8a16"))

    def one_image(folder: Path) -> None:
        (folder / "calibration" / "digits" / "0000.png").write_bytes(
            (folder / "calibration" / "digits" / "0012.png").read_bytes()
        )

    def fewer_samples(folder: Path) -> None:
        path = folder / "digits-rk3566.dataset.txt"
        path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))

    def onnx(folder: Path) -> None:
        shutil.copyfile(demo.ASSETS / "digits.onnx", folder / "digits-rk3566.onnx")

    fingerprints = {changed(e) for e in (settings, one_image, fewer_samples, onnx)}
    assert base not in fingerprints and len(fingerprints) == 4


def test_cache_root_honours_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(T.CACHE_ENV, "/srv/cache/tk")
    assert T.cache_root() == Path("/srv/cache/tk")
    monkeypatch.delenv(T.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert T.cache_root() == Path("/xdg/batchinfer/toolkit")


def test_concurrent_requests_build_once_and_reuse_the_entry(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(T.CACHE_ENV, str(tmp_path / "cache"))
    builds = []
    # The build waits until every thread has passed the "already built?" check and come to
    # the lock, so that all four race for one build (a sleep only made that likely).
    at_lock = threading.Condition()
    arrived = [0]

    def counting_flock(fd: object, operation: int) -> None:
        with at_lock:
            arrived[0] += 1
            at_lock.notify_all()
        fcntl.flock(fd, operation)

    def fake_build(model: T.ToolkitModel, entry: Path, key: str) -> None:
        builds.append(key)
        with at_lock:
            assert at_lock.wait_for(lambda: arrived[0] == 4, timeout=30), arrived
        entry.mkdir()
        (entry / B._DONE).write_text("{}")

    monkeypatch.setattr(B, "fcntl", SimpleNamespace(flock=counting_flock, LOCK_EX=fcntl.LOCK_EX))
    monkeypatch.setattr(B, "_build", fake_build)
    model = T.toolkit_model(model_dir / "digits-rk3566.rknn")
    entries: list[Path] = []
    threads = [
        threading.Thread(target=lambda: entries.append(T.ensure_build(model))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and len(set(entries)) == 1
    assert entries[0].parent == tmp_path / "cache"
    assert T.ensure_build(model) == entries[0] and len(builds) == 1


def test_without_the_toolkit_the_backend_says_how_to_get_it(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(B.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeUnavailableError, match=r"bash tools/toolkit-env\.sh"):
        runtime_class("toolkit")
    r = T.RKNNLite()
    assert r.load_rknn(str(model_dir / "digits-rk3566.rknn")) == 0
    assert r.init_runtime() == -1
    assert "rknn-toolkit2, which is not installed" in capsys.readouterr().err
    assert r.get_sdk_version() is None
    assert r.inference(inputs=[]) is None


class _FakeSimulator:
    """Stands in for rknn-toolkit2's RKNN object once it runs: the arrays it was given."""

    def inference(self, inputs: list, data_format: list) -> list:
        return [np.full((1, 10), float(inputs[0].sum()), dtype=np.float64)]

    def release(self) -> None:
        pass


def test_the_backend_reads_inputs_and_counts_frames_as_the_other_runtimes_do(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Its own init_runtime and call (a fake simulator here) under the base class's public
    signatures: inputs read as RKNNLite reads them, frames counted by the base."""
    monkeypatch.setattr(T, "check_settings", lambda model: None)
    monkeypatch.setattr(T, "ensure_build", lambda model: model_dir)
    monkeypatch.setattr(T, "_open_simulator", lambda model, entry, warm_up: _FakeSimulator())
    r = T.RKNNLite()
    assert r.load_rknn(str(model_dir / "digits-rk3566.rknn")) == 0
    assert r.init_runtime(core_mask=T.RKNNLite.NPU_CORE_0) == 0 and r.core_mask == 1
    image = np.ones((1, 28, 28, 1), dtype=np.uint8)
    (out,) = r.inference(inputs=[image])
    assert out.dtype == np.float32 and out[0, 0] == 784
    out, frame = r.inference(inputs=image, get_frame_id=True)  # a lone array: listed
    assert frame == 2 and "W inference: inputs should be a list, but got ndarray" in (
        capsys.readouterr().err
    )
    assert r.inference(inputs=[image, image]) is None
    assert "E inference: The model needs 1 inputs, but 2 inputs were given." in (
        capsys.readouterr().err
    )
    assert r.inference(inputs=[image], get_frame_id=True)[1] == 3  # a refused call counts not
