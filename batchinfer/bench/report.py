"""Bench results as text for a terminal, made from their JSON (so a saved file prints the
same way as a fresh run)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from batchinfer.bench.conditions import describe
from batchinfer.runtime.npu_load import NA


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Fixed-width columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(header, *rows, strict=True)]
    return "\n".join(
        "  ".join(
            [
                cells[0].ljust(widths[0]),
                *(x.rjust(w) for x, w in zip(cells[1:], widths[1:], strict=True)),
            ]
        )
        for cells in [header, *rows]
    )


def _heading(d: dict[str, Any]) -> str:
    c = d.get("config") or {}
    model = str(c.get("model", "?")).rsplit("/", 1)[-1]
    source = c.get("source") or {}
    if source.get("kind") == "dataset":
        inputs = f"dataset {source.get('root')} ({source.get('items')} items, repeated as needed)"
    else:
        shape = "x".join(str(x) for x in (c.get("input") or {}).get("shape", []))
        inputs = f"synthetic inputs {shape} {(c.get('input') or {}).get('dtype', '')}".rstrip()
    cores = ",".join(str(x) for x in c.get("cores", []))
    return (
        f"bench: {model}, cores {cores}, {c.get('instances_per_core')} instance(s) per core, "
        f"{inputs}{_decoder(source, d)}\nfigures: {d.get('label')}"
    )


def _decoder(source: dict[str, Any], d: dict[str, Any]) -> str:
    """A video dataset's decoder and its frames per second per reader (1000 / the median
    ms a reader took per frame: decode and preprocess, as the readers measured them)."""
    if not source.get("decoder"):
        return ""
    args = " ".join(source.get("ffmpeg_args") or ())
    decoder = f"ffmpeg {args}".rstrip() if source["decoder"] == "ffmpeg" else "pyav"
    read_ms = (d.get("diagnosis") or {}).get("read_p50_ms")
    rate = f", {1000 / read_ms:.0f} frames/s per reader" if read_ms else ""
    return f"\nvideo decoder: {decoder}{rate} (median {_fmt(read_ms, '.1f')} ms a frame)"


def _verdict(d: dict[str, Any]) -> list[str]:
    lines = ["VALID" if d.get("valid") else "INVALID"]
    lines += [f"  - {r}" for r in d.get("reasons") or []]
    return lines


def _windows(d: dict[str, Any]) -> str:
    c = d.get("config") or {}
    rates = " ".join(f"{w['samples_per_s']:.0f}" for w in d.get("windows") or [])
    s = d.get("stability") or {}
    if s.get("spread") is not None:
        judged = (
            f"last {s['windows']} within {s['spread']:.1%} of their mean "
            f"({s['tolerance']:.0%} allowed)"
        )
    else:
        judged = "too few windows to judge stability"
    return f"windows (samples/s, {c.get('window_s', 0):g} s each): {rates or 'none'}; {judged}"


def _cores(d: dict[str, Any]) -> str:
    rows = []
    for c in d.get("cores") or []:
        rows.append(
            (
                str(c["core"]),
                _fmt(c["samples_per_s"], ".1f"),
                _fmt(100 * c["utilization"], ".0f"),
                _fmt(100 * c["instances_busy"], ".0f"),
                NA if c.get("npu_load") is None else f"{100 * c['npu_load']:.0f}",
                _fmt(c["p50_ms"], ".2f"),
                _fmt(c["p99_ms"], ".2f"),
            )
        )
    lat = d.get("latency_ms") or {}
    rows.append(
        (
            "all",
            _fmt(d.get("samples_per_s"), ".1f"),
            "",
            "",
            "",
            _fmt(lat.get("p50"), ".2f"),
            _fmt(lat.get("p99"), ".2f"),
        )
    )
    header = ("core", "samples/s", "util %", "instances busy %", "NPU load %", "p50 ms", "p99 ms")
    return table(header, rows)


def _latency(d: dict[str, Any]) -> str:
    lat = d.get("latency_ms") or {}
    names = (
        ("min", "min"),
        ("mean", "mean"),
        ("p50", "p50"),
        ("p90", "p90"),
        ("p95", "p95"),
        ("p99", "p99"),
        ("p999", "p99.9"),
        ("max", "max"),
    )
    return "latency ms: " + "  ".join(f"{label} {_fmt(lat.get(k), '.2f')}" for k, label in names)


def _cpu(d: dict[str, Any]) -> list[str]:
    cpu = d.get("cpu")
    if not cpu:
        return ["CPU: not measured (the measurement did not start)"]

    def role(name: str) -> str:
        procs = sorted((p for p in cpu["processes"] if p["role"] == name), key=lambda p: p["key"])
        if not procs:
            return "none"
        use = ", ".join(f"{p['key']}: {p['cpu']:.2f}" for p in procs)
        rss = "/".join(_fmt(p.get("peak_rss_mb"), ".0f") for p in procs)
        return f"{use} (peak RSS {rss} MB)"

    coord = [p for p in cpu["processes"] if p["role"] == "coordinator"]
    coordinator = (
        f"{coord[0]['cpu']:.2f} (peak RSS {_fmt(coord[0].get('peak_rss_mb'), '.0f')} MB)"
        if coord
        else "-"
    )
    warm = cpu.get("others_during_warmup")
    runnable = cpu.get("runnable")
    return [
        "CPU use by role (in CPUs, 1.0 = one CPU busy all the time; over the measurement):",
        f"  coordinator  {coordinator}",
        f"  core workers {role('worker')}",
        f"  readers      {role('reader')}",
        f"  all of ours {cpu['ours']:.2f}, other processes {cpu['others']:.2f}"
        + (f" (during the warm-up {warm:.2f})" if warm is not None else "")
        + f", machine {cpu['machine']:.2f} of {cpu['cpus']} CPUs busy"
        + (f", {runnable:.1f} tasks runnable on average" if runnable is not None else ""),
        *_postprocess(d),
    ]


def _postprocess(d: dict[str, Any]) -> list[str]:
    """A detector's decoding (boxes, NMS) in the core workers, per item."""
    post = d.get("postprocess")
    if not post:
        return []
    share = post.get("share_of_worker_cpu")
    of_all = post.get("share_of_cpu")
    return [
        f"  post-processing (box decoding and NMS in the core workers): "
        f"{post['cpu_ms_per_item']:.3f} ms CPU per item"
        + (f", {100 * share:.0f} % of the core workers' CPU" if share is not None else "")
        + (f", {100 * of_all:.0f} % of all CPU per item" if of_all is not None else "")
        + " (whole run, warm-up included)",
        *_nonfinite(post),
    ]


def _nonfinite(post: dict[str, Any]) -> list[str]:
    """The report says what the run's warning said: a detector whose outputs were NaN or
    infinite measured the speed of decoding nothing."""
    dropped = int(post.get("nonfinite_dropped") or 0)
    if not dropped:
        return []
    items = post.get("nonfinite_items")
    where = f" in {items:,} of {post['items']:,} items" if items is not None else ""
    return [
        f"  NOT FINITE: {dropped:,} candidate boxes dropped as NaN or infinite{where}: the "
        "model's outputs are not finite, so these figures time boxes that were never there"
    ]


def _limits(d: dict[str, Any]) -> list[str]:
    """samples/s as a fraction of the NPU and decode limits (bench.limits)."""
    lim = d.get("limits")
    if not lim:
        return []
    parts = []
    if lim.get("npu_per_s"):
        parts.append(
            f"{lim['of_npu']:.2f} of the emulated NPU limit ({lim['npu_per_s']:,.0f}/s: "
            "cores / npu ms)"
        )
    if lim.get("decode_per_s"):
        call = lim.get("call_cpu_ms")
        call_text = f" + {call:.3f} ms emulator call" if call is not None else ""
        parts.append(
            f"{lim['of_decode']:.2f} of the decode limit ({lim['decode_per_s']:,.0f}/s: "
            f"{lim['cpus']} CPUs / ({lim['decode_cpu_ms']:.3f} ms CPU to read an item"
            f"{call_text}))"
        )
    return [f"limits: {'; '.join(parts)}"] if parts else []


def format_result(d: dict[str, Any]) -> str:
    """A single run's report (``d``: its JSON)."""
    c = d.get("config") or {}
    cond = d.get("conditions") or {}
    dg = d.get("diagnosis") or {}
    lines = [
        _heading(d),
        "",
        *_verdict(d),
        f"measured {d.get('measured_s', 0):.1f} s after a {c.get('warmup_s', 0):g} s warm-up: "
        f"{d.get('samples', 0):,} samples, {d.get('samples_per_s', 0):,.1f} samples/s"
        + (f", {d['errors']} errors" if d.get("errors") else ""),
        _windows(d),
        *_limits(d),
        "",
        _cores(d),
        "",
        _latency(d),
        "",
        *_cpu(d),
        "",
        f"conditions before: {describe(cond.get('before'))}",
        f"conditions after:  {describe(cond.get('after'))}",
        "",
        f"diagnosis: {dg.get('summary', '-')}",
        f"advice: {dg.get('advice', '-')}",
    ]
    return "\n".join(lines)


def format_sweep(d: dict[str, Any]) -> str:
    """A sweep's table and recommendation (``d``: its JSON)."""
    kind = d.get("sweep_of")
    rows: list[tuple[str, ...]] = []
    for e in d.get("sweep") or []:
        rel = e.get("efficiency") if kind == "cores" else e.get("relative")
        rows.append(
            (
                e["name"],
                _fmt(e["samples_per_s"], ".1f"),
                _fmt(e.get("relative"), ".2f") + "x",
                _fmt(None if rel is None else 100 * rel, ".0f") + " %" if kind == "cores" else "",
                _fmt(e.get("p99_ms"), ".2f"),
                e.get("bound", "-"),
                "VALID" if e.get("valid") else "INVALID",
            )
        )
    eff = "scaling efficiency" if kind == "cores" else ""
    header: tuple[str, ...] = (
        "setting",
        "samples/s",
        "vs first",
        eff,
        "p99 ms",
        "bound",
        "verdict",
    )
    if kind != "cores":
        header = tuple(h for h in header if h)
        rows = [tuple(x for i, x in enumerate(r) if i != 3) for r in rows]
    rec = d.get("recommendation") or {}
    lines = [
        f"sweep of {kind}: {d.get('label')}",
        table(header, rows),
        "",
        *[f"INVALID {r}" for r in d.get("reasons") or []],
        f"recommendation: {rec.get('reason', '-')}",
    ]
    if d.get("interrupted"):
        lines.append("the sweep was interrupted; settings after the last row were not run.")
    return "\n".join(lines)
