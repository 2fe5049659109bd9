"""Messages name settings as data (batchinfer.messages), rendered by each front end."""

from __future__ import annotations

import ast
import json
import pickle
import re
from pathlib import Path

import pytest

import batchinfer
from batchinfer.errors import ConfigError, UsageError
from batchinfer.messages import Message, Setting, as_message, join, render, setting


def _flag(field: str) -> str:
    return "--" + field.rsplit(".", 1)[-1].replace("_", "-")


def test_a_message_keeps_its_settings_as_references_through_concatenation() -> None:
    said = (
        f"{3} slots do not fit; lower "
        + setting("runtime.slots")
        + " or "
        + setting("runtime.readers")
        + "."
    )
    assert isinstance(said, Message)
    assert said.parts == (
        "3 slots do not fit; lower ",
        Setting("runtime.slots"),
        " or ",
        Setting("runtime.readers"),
        ".",
    )
    assert str(said) == "3 slots do not fit; lower runtime.slots or runtime.readers."
    assert said.render(_flag) == "3 slots do not fit; lower --slots or --readers."
    assert said.settings == ("runtime.slots", "runtime.readers")


def test_a_message_written_without_a_front_end_names_fields_never_templates() -> None:
    said = "raise " + setting("bench.duration_s") + "."
    assert json.dumps({"warnings": [said]}) == '{"warnings": ["raise bench.duration_s."]}'
    assert "{" not in f"{said}" and "{" not in said.upper()


def test_a_message_crosses_processes_whole() -> None:
    said = join("; ", ["core 1: lower " + setting("runtime.cores"), "plain"])
    again = pickle.loads(pickle.dumps(said))
    assert again == said and again.parts == said.parts
    error = pickle.loads(pickle.dumps(ConfigError(setting("runtime.slots") + " is too small.")))
    assert error.render(_flag) == "--slots is too small." and error.fields == ("runtime.slots",)


def test_errors_take_messages_and_plain_text_with_braces_stays_as_it_is() -> None:
    new = ConfigError(setting("preprocess.size") + " is not a size.")
    assert str(new) == "preprocess.size is not a size."
    assert new.render(_flag) == "--size is not a size."
    assert new.fields == ("preprocess.size",)
    assert as_message(new.message) is new.message
    # Braces in plain text are the user's (a folder, a shard pattern), never a setting:
    # "/tmp/{model}/o" was once said as "/tmp/--model/o".
    path = ConfigError("/tmp/{model}/o is not empty; use " + setting("output.overwrite") + ".")
    assert path.render(_flag) == "/tmp/{model}/o is not empty; use --overwrite."
    assert path.fields == ("output.overwrite",)
    assert render("plain {runtime.cores}", str.upper) == "plain {runtime.cores}"


@pytest.mark.parametrize("make", [lambda: UsageError("no settings here"), lambda: UsageError()])
def test_a_message_without_settings_is_its_text(make) -> None:
    error = make()
    assert error.render(_flag) == str(error)


# A setting's field (group.name) or one of the few settings outside any group.
_TEMPLATE = re.compile(
    r"\{((?:[a-z_]+\.)+[a-z_][a-z0-9_]*|model|dataset|limit|labels|ray|ray_data|image_root)\}"
)


def _templates(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    found = [
        match.group(0)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
        for match in _TEMPLATE.finditer(node.value)
    ]
    # A template made at run time: f"{{{name}}}", a value between a "{" and a "}".
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            values = node.values
            for before, value, after in zip(values, values[1:], values[2:], strict=False):
                if (
                    isinstance(before, ast.Constant)
                    and str(before.value).endswith("{")
                    and isinstance(value, ast.FormattedValue)
                    and isinstance(after, ast.Constant)
                    and str(after.value).startswith("}")
                ):
                    found.append("{" + ast.unparse(value.value) + "}")
    return found


def test_settings_are_named_with_setting_not_templates() -> None:
    root = Path(batchinfer.__file__).resolve().parent.parent
    found = {
        str(path.relative_to(root)): hits
        for path in sorted((root / "batchinfer").rglob("*.py"))
        if (hits := _templates(path))
    }
    braces = found.pop("batchinfer/data/shard_names.py", [])
    assert set(braces) <= {"{body}"}, braces  # a shard pattern's brace ({000..099}), not a setting
    assert not found, f"name settings with batchinfer.messages.setting(), not templates: {found}"


def test_a_preprocess_error_names_the_setting_as_each_front_end_sets_it() -> None:
    # It said "--mean" to eval jobs too, whose users set device.preprocess.mean.
    from batchinfer.cli.options import flag_of
    from batchinfer.data.input_spec import Preprocess
    from batchinfer.evaluate.job import job_key

    with pytest.raises(UsageError) as caught:
        Preprocess(shape=(1, 8, 8, 3), dtype="float32", mean=(1.0, 2.0))
    assert caught.value.render(flag_of).startswith("--mean has 2 values")
    said = caught.value.render(lambda field: job_key("device", field))
    assert said.startswith("device.preprocess.mean has 2 values")


# One message from each module that named settings by templates, made by that module's own
# code: (what makes it, the CLI's text, an eval job's text or None where it cannot reach an
# eval, whose runs choose their own output folders and never resume).
class _Chip:
    """A backend as engine/planning/plan.py's check_cores sees one."""

    def cores(self) -> tuple[int, ...]:
        return (0, 1, 2)

    def chip(self) -> str:
        return "rk3588"


class _Refusing:
    """An RKNNLite whose init_runtime fails."""

    def init_runtime(self, core_mask: int) -> int:
        return -1


def _plan_cores() -> None:
    from batchinfer.engine.planning.plan import check_cores
    from batchinfer.options import RuntimeOptions

    check_cores(RuntimeOptions(cores=(7,)), _Chip())  # type: ignore[arg-type]


def _slots() -> None:
    from batchinfer.engine.slots import check_free_space

    check_free_space(1 << 60)


def _adapter() -> None:
    from batchinfer.runtime.adapter import RuntimeAdapter

    RuntimeAdapter(_Refusing(), core=1, model=Path("m.rknn")).init(2)


def _loop() -> None:
    from batchinfer.engine.core_texts import for_cores as _for_cores
    from batchinfer.runtime.adapter import CoreError

    with pytest.raises(CoreError) as caught:
        _adapter()
    raise UsageError(_for_cores(caught.value.reason, [0, 2], advice=True))


def _manifest(tmp: Path) -> None:
    from batchinfer.sink.manifest import model_sha256

    model_sha256(tmp / "missing.rknn")


def _fingerprint(tmp: Path) -> None:
    from batchinfer.sink.fingerprint import check_resume_fingerprint

    check_resume_fingerprint(tmp, {"topk": 5}, {"topk": 3})


def _out_lock(tmp: Path) -> None:
    from batchinfer.errors import OutputLockedError
    from batchinfer.sink.out_lock import locked_message

    raise OutputLockedError(locked_message(tmp, {"pid": 12}))


def _outdir(tmp: Path) -> None:
    from batchinfer.sink.outdir import check_out, inspect_out

    check_out(inspect_out(tmp), overwrite=True, resume=True)


def _instances() -> None:
    from batchinfer.engine.planning.instances import planned_instances

    planned_instances("many")


def _options() -> None:
    from batchinfer.options import RuntimeOptions, from_mapping

    from_mapping(RuntimeOptions, {"instances_per_core": "many"}, "runtime")


@pytest.mark.parametrize(
    ("make", "cli", "job"),
    [
        (_instances, "--instances-per-core must be", "device.runtime.instances_per_core must"),
        (_options, "--instances-per-core must be", "device.runtime.instances_per_core must"),
        (_plan_cores, "--cores 7 is not a list", "device.runtime.cores 7 is not a list"),
        (_slots, "fewer slots (--slots)", "fewer slots (device.runtime.slots)"),
        (_adapter, "leave core 1 out of --cores, or", "leave core 1 out of device.runtime.cores"),
        (_loop, "leave cores 0, 2 out of --cores, or", "cores 0, 2 out of device.runtime.cores"),
        (_manifest, "check the --model path", "check the device.model path"),
        (_fingerprint, "--resume: the run in", None),
        (_fingerprint, "different --topk 5 → 3", "different metrics.topk 5 → 3"),
        (_out_lock, "pass another --out.", None),
        (_outdir, "--overwrite and --resume contradict", None),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_each_module_names_settings_as_each_front_end_sets_them(make, cli, job, tmp_path) -> None:
    from batchinfer.cli.options import flag_of
    from batchinfer.errors import BatchinferError
    from batchinfer.evaluate.job import job_key

    with pytest.raises(BatchinferError) as caught:
        make(*([tmp_path] if make.__code__.co_argcount else []))
    assert cli in caught.value.render(flag_of)
    if job is not None:
        assert job in caught.value.render(lambda field: job_key("device", field))
    assert not _TEMPLATE.search(str(caught.value)) and caught.value.message.settings


def test_cores_that_failed_alike_are_grouped_by_their_reasons_not_their_text() -> None:
    from batchinfer.cli.options import flag_of
    from batchinfer.engine.core_texts import alike as _alike
    from batchinfer.engine.core_texts import for_cores as _for_cores
    from batchinfer.runtime.adapter import CoreReason, Mark

    init = CoreReason.of("NPU ", Mark.CORE, " could not start; ", Mark.ADVICE, "check it.")
    other = CoreReason.of("its worker failed to start: core 1 is busy")  # names it in text
    groups = _alike({0: init, 1: other, 2: init})
    assert groups == {init: [0, 2], other: [1]}
    assert _for_cores(init, [0, 2], advice=False) == "NPU cores 0, 2 could not start; check it."
    said = _for_cores(other, [1], advice=True)
    assert said == "core 1: its worker failed to start: core 1 is busy"
    assert init.said([1]).render(flag_of) == (
        "NPU core 1 could not start; leave core 1 out of --cores, or check it."
    )
    assert pickle.loads(pickle.dumps(init)) == init  # it crosses from the worker whole


def test_a_retired_core_s_reason_names_its_setting_as_data(demo_kit, tmp_path) -> None:
    # The reason in CoreRetired (a bench's "failures", an observer's own record) was the
    # worker's template text: "leave core 1 out of {runtime.cores}" reached them unrendered.
    from runs import config, fast_sim

    from batchinfer import run
    from batchinfer.engine import events as ev

    class Retired:
        def __init__(self) -> None:
            self.events: list[ev.CoreRetired] = []

        def notify(self, event: object) -> None:
            if isinstance(event, ev.CoreRetired):
                self.events.append(event)

    observer = Retired()
    sim = fast_sim("init:core=1", npu_ms=20)  # slow enough that the run outlives core 1's start
    result = run(
        config(
            dataset=demo_kit.dataset,
            model=demo_kit.models["digits"],
            backend="sim",
            sim=sim,
            limit=60,
            out=tmp_path / "o",
        ),
        observers=[observer],
    )
    (event,) = observer.events
    assert event.core == 1 and not _TEMPLATE.search(event.reason), event.reason
    assert isinstance(event.reason, Message) and event.reason.settings == ("runtime.cores",)
    manifest = (result.out / "manifest.json").read_text()
    assert "leave core 1 out of runtime.cores" in manifest and not _TEMPLATE.search(manifest)


def _cli(*args: str | Path) -> tuple[int, str]:
    from click.testing import CliRunner

    from batchinfer.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.stderr


def test_a_refused_resume_says_flags_and_leaves_no_template_in_any_manifest(
    demo_kit, tmp_path
) -> None:
    out = tmp_path / "o"
    fast = ["--backend", "sim", "--sim-npu-ms", "0.2", "--sim-host-ms", "0", "--no-progress"]
    first = ["run", demo_kit.dataset, "--model", demo_kit.models["digits"], "--out", out, *fast]
    # --sim-npu-ms 20: slow enough that the run outlives core 1's failed start.
    failing = ["--sim-fault", "init:core=1", "--sim-npu-ms", "20", "--topk", "5"]
    code, _ = _cli(*first, "--limit", "20", *failing)
    assert code == 0
    code, said = _cli(*first, "--limit", "20", "--topk", "3", "--resume")
    assert code == 2, said
    assert said.startswith("error: --resume: the run in ") and "--topk 5 → 3" in said
    assert "(another --out, or --overwrite)." in said
    code, said = _cli(*first, "--overwrite", "--resume")
    assert code == 2 and "--overwrite and --resume contradict" in said, said
    manifest = (out / "manifest.json").read_text()
    assert "runtime.cores" in manifest and not _TEMPLATE.search(manifest), manifest
