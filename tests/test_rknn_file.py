"""Reading the JSON document at the end of a real .rknn file (batchinfer.runtime.rknn_file)."""

from __future__ import annotations

import json
from pathlib import Path

import models as M  # tests/ is on sys.path under pytest (no tests/__init__.py)
import pytest

from batchinfer import demo
from batchinfer.errors import ModelError
from batchinfer.runtime import rknn_file
from batchinfer.runtime.rknn_file import RknnTensor, read_rknn_metadata

SOURCE_SHAPES = {"digits": (1, 1, 8, 8), "digits-lowcal": (1, 1, 8, 8), "pool224": (1, 3, 224, 224)}
CLASSES = {"digits": 10, "digits-lowcal": 10, "pool224": 1000}


@pytest.mark.parametrize("stem", sorted(demo.rknn_stems()))
def test_every_demo_rknn_names_its_platform_tensors_and_version(stem: str) -> None:
    recipe, platform = demo.rknn_stems()[stem]
    meta = read_rknn_metadata(demo.ASSETS / f"{stem}.rknn")
    assert meta is not None
    assert meta.platforms == (platform,)
    assert meta.version == "2.5.0"
    assert meta.source_format == "ONNX"
    assert meta.inputs == (RknnTensor("image", SOURCE_SHAPES[recipe.name], "int8", "layer"),)
    assert meta.outputs == (RknnTensor("probs", (1, CLASSES[recipe.name]), None, None),)
    assert meta.raw["target_platform"] == [platform]


def _real(stem: str = "digits-rk3588") -> bytes:
    return (demo.ASSETS / f"{stem}.rknn").read_bytes()


def _grown(data: bytes, extra: int, *, fix_header: bool) -> bytes:
    """``data`` with ``extra`` bytes more model, as a bigger model would have."""
    size = int.from_bytes(data[16:24], "little")
    model_end = 64 + size
    header = data[:16] + (size + extra if fix_header else size).to_bytes(8, "little") + data[24:64]
    return header + data[64:model_end] + b"\x5a" * extra + data[model_end:]


@pytest.mark.parametrize("fix_header", [True, False], ids=["header", "tail-scan"])
def test_files_over_one_mib_are_read_from_the_end(tmp_path: Path, fix_header: bool) -> None:
    path = tmp_path / "big.rknn"
    path.write_bytes(_grown(_real(), 3 << 20, fix_header=fix_header))
    assert path.stat().st_size > 3 << 20
    meta = read_rknn_metadata(path)
    assert meta is not None and meta.platforms == ("rk3588",)
    assert meta.inputs[0].shape == (1, 1, 8, 8)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"RKNN",
        M.rknn_bytes(None),  # an .rknn with no document
        M.rknn_bytes(b'{"target_platform": ["rk3588"'),  # cut short
        M.rknn_bytes(b"[1, 2, 3]"),  # JSON, but not an object
        b"ONNX" + M.rknn_bytes({"target_platform": ["rk3588"]})[4:],  # not an .rknn at all
    ],
    ids=["empty", "magic-only", "no-document", "truncated", "not-an-object", "other-magic"],
)
def test_a_file_without_a_document_gives_none(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "m.rknn"
    path.write_bytes(content)
    assert read_rknn_metadata(path) is None


def test_an_onnx_file_gives_none() -> None:
    assert read_rknn_metadata(demo.ASSETS / "digits.onnx") is None


def test_a_missing_file_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match=r"missing\.rknn"):
        read_rknn_metadata(tmp_path / "missing.rknn")


def test_inputs_and_outputs_follow_the_graph_order(tmp_path: Path) -> None:
    document = {
        "target_platform": "rk3588",
        "norm_tensor": [
            {"tensor_id": 0, "url": "out", "size": [1, 4], "dtype": {"qnt_type": ""}},
            {"tensor_id": 1, "url": "b", "size": [1, 3], "dtype": {"qnt_type": "int8"}},
            {"tensor_id": 2, "url": "a", "size": [1, 2], "dtype": {"qnt_type": "uint8"}},
        ],
        "graph": [
            {"left": "input", "left_tensor_id": 1, "right": "norm_tensor", "right_tensor_id": 1},
            {"left": "output", "left_tensor_id": 0, "right": "norm_tensor", "right_tensor_id": 0},
            {"left": "input", "left_tensor_id": 0, "right": "norm_tensor", "right_tensor_id": 2},
        ],
    }
    path = tmp_path / "two.rknn"
    path.write_bytes(M.rknn_bytes(document))
    meta = read_rknn_metadata(path)
    assert [(t.name, t.shape, t.dtype) for t in meta.inputs] == [
        ("a", (1, 2), "uint8"),
        ("b", (1, 3), "int8"),
    ]
    assert [t.name for t in meta.outputs] == ["out"]
    assert meta.platforms == ("rk3588",) and meta.version is None


def test_the_fallback_looks_back_no_further_than_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = json.dumps({"target_platform": ["rk3588"]}).encode()
    data = M.rknn_bytes(document, model=b"\x00" * 4096)
    path = tmp_path / "m.rknn"
    path.write_bytes(data[:16] + (1).to_bytes(8, "little") + data[24:])  # header no help
    monkeypatch.setattr(rknn_file, "TAIL_LIMIT", len(document) + 8)
    assert read_rknn_metadata(path) is not None
    monkeypatch.setattr(rknn_file, "TAIL_LIMIT", len(document) + 7)
    assert read_rknn_metadata(path) is None


# --------------------------------------------------------------------------- the emulator


@pytest.fixture(params=["sim", "onnx"])
def cpu_runtime(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sim":
        from batchinfer.runtime.sim import RKNNLite

        return RKNNLite(npu_ms=0.0, host_ms=0.0, state_dir=tmp_path / "state", faults="")
    from batchinfer.runtime.onnx import RKNNLite

    return RKNNLite()


@pytest.mark.parametrize("stem", ["digits-rk3576", "pool224-rk3566"])
def test_emulator_lists_the_platform_of_a_real_rknn(cpu_runtime, stem: str, capsys) -> None:
    result = cpu_runtime.list_support_target_platform(rknn_model=str(demo.ASSETS / f"{stem}.rknn"))
    chip = demo.rknn_stems()[stem][1].upper()
    assert result == {"filled_target_platform": [chip], "support_target_platform": [chip]}
    assert f"['{chip}']" in capsys.readouterr().out


def test_emulator_lists_the_platform_of_an_rknn_over_one_mib(cpu_runtime, tmp_path: Path) -> None:
    # Before reading from the end, anything past the first MiB was never seen.
    path = tmp_path / "big.rknn"
    path.write_bytes(_grown(_real("digits-rk3566"), 2 << 20, fix_header=True))
    result = cpu_runtime.list_support_target_platform(rknn_model=str(path))
    assert result["filled_target_platform"] == ["RK3566"]


def test_emulator_lists_every_platform_for_a_file_without_a_document(cpu_runtime) -> None:
    result = cpu_runtime.list_support_target_platform(rknn_model=str(demo.ASSETS / "digits.onnx"))
    assert result["filled_target_platform"] == []
    assert "RK3588" in result["support_target_platform"]
