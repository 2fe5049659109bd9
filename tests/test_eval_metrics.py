"""Metric functions against cases computed by hand (McNemar included), and custom metrics."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from batchinfer.errors import RunFailedError
from batchinfer.evaluate import EvalInputs, ItemResults, builtin_metrics, mcnemar
from batchinfer.evaluate.metrics import CustomMetricError, load_custom, score
from batchinfer.evaluate.scorers.classify_metrics import (
    BaselineItems,
    class_counts,
    confusion_matrix,
    cosine_similarity,
    topk_accuracy,
)

TESTS = Path(__file__).resolve().parent


def items(
    labels: list[int],
    probs: list[list[float] | None],
    cores: list[int] | None = None,
    ids: list[str] | None = None,
) -> ItemResults:
    """ItemResults for hand cases: ``probs[i]`` None makes item i an error row."""
    n, width = len(labels), max(len(p) for p in probs if p is not None)
    outputs = np.full((n, 1, width), np.nan, dtype=np.float32)
    pred = np.full(n, -1, dtype=np.int64)
    topk = np.full((n, 3), -1, dtype=np.int32)
    for i, p in enumerate(probs):
        if p is not None:
            outputs[i, 0] = p
            order = np.argsort(-np.asarray(p), kind="stable")
            pred[i] = order[0]
            topk[i, : min(3, width)] = order[:3]
    return ItemResults(
        index=np.arange(n, dtype=np.int64),
        id=np.array(ids or [f"{lab}/{i}.png" for i, lab in enumerate(labels)], dtype=object),
        label=np.array(labels, dtype=np.int64),
        label_name=np.array([str(lab) for lab in labels], dtype=object),
        pred=pred,
        topk=topk,
        core=np.array(cores or [0] * n, dtype=np.int64),
        error=np.array([None if p is not None else "broken" for p in probs], dtype=object),
        outputs=[outputs],
    )


# Five items, three classes. Predictions (best first):
#   0: label 0, ranks 0,1,2   top-1 right
#   1: label 1, ranks 0,1,2   top-1 wrong, top-2 right
#   2: label 2, ranks 0,1,2   wrong in top-2, right in top-3
#   3: label 2, ranks 2,...   right
#   4: label 1, error row     wrong whatever k
FIVE = items(
    [0, 1, 2, 2, 1],
    [[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.6, 0.3, 0.1], [0.1, 0.2, 0.7], None],
    cores=[0, 1, 0, 1, 2],
)


def test_topk_accuracy_counts_error_rows_as_wrong():
    assert topk_accuracy(FIVE, 1) == pytest.approx(2 / 5)
    assert topk_accuracy(FIVE, 2) == pytest.approx(3 / 5)
    assert topk_accuracy(FIVE, 3) == pytest.approx(4 / 5)


def test_accuracy_without_labels_is_not_a_number_but_absent():
    unlabelled = items([-1, -1], [[0.1, 0.9], [0.8, 0.2]])
    assert topk_accuracy(unlabelled, 1) is None
    values = score(EvalInputs(unlabelled, topk=3), builtin_metrics(3), [])
    assert "top1" not in values and values["errors"] == 0


def test_class_counts_and_confusion_matrix():
    total, correct, errors = class_counts(FIVE, 3)
    assert total.tolist() == [1, 2, 2]
    assert correct.tolist() == [1, 0, 1]
    assert errors.tolist() == [0, 1, 0]
    # rows: true class, columns: predicted; the error row is in neither
    assert confusion_matrix(FIVE, 3).tolist() == [[1, 0, 0], [1, 0, 0], [1, 0, 1]]


def test_cosine_similarity_by_hand():
    a = np.array([[1, 0], [1, 1], [3, 4], [0, 0], [0, 0], [np.nan, 1]], float)
    b = np.array([[0, 1], [2, 2], [4, 3], [0, 0], [1, 0], [1, 1]], float)
    cos = cosine_similarity(a, b)
    assert cos[:5].tolist() == pytest.approx([0.0, 1.0, 24 / 25, 1.0, 0.0])
    assert np.isnan(cos[5])


@pytest.mark.parametrize(
    ("lost", "gained", "p", "method", "statistic"),
    [
        (0, 0, 1.0, "exact", None),
        # exact: 2 * P[X <= 0], X ~ Bin(5, 1/2) = 2 * 1/32
        (5, 0, 0.0625, "exact", None),
        # 2 * (C(5,0) + C(5,1)) / 32 = 2 * 6/32
        (1, 4, 0.375, "exact", None),
        # 2 * (1 + 6 + 15 + 20) / 64 = 1.3125, capped at 1
        (3, 3, 1.0, "exact", None),
        # n = 24 is still exact: 2 * (1 + 24) / 2^24
        (23, 1, 2 * 25 / 2**24, "exact", None),
        # n = 25: chi-square, (|20 - 5| - 1)^2 / 25 = 7.84; P[chi2(1) > 7.84] = erfc(sqrt(3.92))
        (20, 5, 0.005110, "chi2", 7.84),
        # (|30 - 10| - 1)^2 / 40 = 361/40 = 9.025; between the tables' 0.005 (7.879) and
        # 0.001 (10.828) points, 0.002663
        (30, 10, 0.002663, "chi2", 9.025),
    ],
)
def test_mcnemar_by_hand(lost, gained, p, method, statistic):
    test = mcnemar(lost, gained)
    assert test.method == method
    assert test.p_value == pytest.approx(p, rel=1e-3)
    if statistic is None:
        assert test.statistic is None
    else:
        assert test.statistic == pytest.approx(statistic)
    assert mcnemar(gained, lost).p_value == pytest.approx(test.p_value)  # two-sided


def test_chi_square_tail_matches_the_table_points():
    # 3.841 and 6.635 are chi2(1)'s 5 % and 1 % critical values.
    assert mcnemar(36, 15).p_value < 0.01  # (21-1)^2/51 = 7.84
    assert math.erfc(math.sqrt(3.841 / 2)) == pytest.approx(0.05, abs=1e-4)
    assert math.erfc(math.sqrt(6.635 / 2)) == pytest.approx(0.01, abs=1e-4)


def test_reference_metrics_agreement_and_cosine():
    # The reference agrees on items 0, 2 (same argmax), not on 1 and 3; item 4 failed on
    # the device, so it cannot agree.
    reference = items(
        [0, 1, 2, 2, 1],
        [[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.6, 0.3, 0.1], [0.7, 0.2, 0.1], [0.1, 0.8, 0.1]],
    )
    x = EvalInputs(FIVE, reference, topk=3)
    assert x.agree.tolist() == [True, False, True, False, False]
    values = score(x, builtin_metrics(3), [])
    assert values["top1_agreement"] == pytest.approx(2 / 5)
    cos1 = (0.05 + 0.32 + 0.01) / (math.sqrt(0.42) * math.sqrt(0.66))
    cos3 = (0.07 + 0.04 + 0.07) / (math.sqrt(0.54) * math.sqrt(0.54))
    assert values["cosine_min"] == pytest.approx(cos3)
    assert values["cosine_mean"] == pytest.approx((1 + cos1 + 1 + cos3) / 4)
    # The reference's own accuracy (right on items 0, 1, 4), for min_ratio_to_reference.
    assert values["reference.top1"] == pytest.approx(3 / 5)
    assert values["top1"] == pytest.approx(2 / 5)


def test_a_core_that_computes_differently_shows_in_the_per_core_metrics():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=30)
    labels = probs.argmax(axis=1).tolist()
    cores = [i % 3 for i in range(30)]
    reference = items(labels, probs.tolist(), cores)
    # Core 2 adds 1 % of the largest value to every output, as the emulator's skew does.
    skewed = [p + 0.01 * p.max() if c == 2 else p for p, c in zip(probs, cores, strict=True)]
    device = items(labels, [p.tolist() for p in skewed], cores)
    x = EvalInputs(device, reference, topk=3)
    per_core = {r["core"]: r for r in x.per_core}
    assert per_core[0]["cosine_mean"] == pytest.approx(1.0)
    assert per_core[1]["cosine_mean"] == pytest.approx(1.0)
    assert per_core[2]["cosine_mean"] < 1 - 1e-5
    values = score(x, builtin_metrics(3), [])
    assert values["core_cosine_min"] == pytest.approx(per_core[2]["cosine_mean"])
    # The argmax does not move, so top-1 and agreement cannot show it: cosine must.
    assert values["core_agreement_min"] == 1.0 and values["core_top1_spread"] == 0.0


def test_flips_and_mcnemar_against_the_baseline_match_items_by_id():
    ids = [f"x/{i}.png" for i in range(5)]
    now = items([0, 1, 2, 2, 1], FIVE_PROBS, ids=ids)  # correct: T F F T F
    # The baseline had items in another order, one extra and one missing (x/4).
    baseline = BaselineItems(
        id=np.array(["x/3.png", "x/1.png", "x/0.png", "x/2.png", "gone.png"], dtype=object),
        correct=np.array([False, True, True, False, True]),
        metrics={"top1": 0.6},
    )
    x = EvalInputs(now, baseline=baseline, topk=3)
    assert x.flips is not None
    assert x.flips.lost == ["x/1.png"]
    assert x.flips.gained == ["x/3.png"]
    assert x.flips.compared == 4
    values = score(x, builtin_metrics(3), [])
    assert values["flipped_lost"] == 1 and values["flipped_gained"] == 1
    assert values["mcnemar_p"] == pytest.approx(1.0)


FIVE_PROBS = [[0.7, 0.2, 0.1], [0.5, 0.4, 0.1], [0.6, 0.3, 0.1], [0.1, 0.2, 0.7], None]


# --------------------------------------------------------------------------- custom metrics
def test_the_example_custom_metric_from_a_file_by_hand():
    metric = load_custom("eval_metric_example.py:confidence", TESTS)
    values = score(EvalInputs(FIVE, topk=3), builtin_metrics(3), [metric])
    # items with a result: best (0.7, 0.5, 0.6, 0.7), second (0.2, 0.4, 0.3, 0.2)
    assert values["confidence_mean"] == pytest.approx((0.7 + 0.5 + 0.6 + 0.7) / 4)
    assert values["margin_mean"] == pytest.approx((0.5 + 0.1 + 0.3 + 0.5) / 4)


def test_a_custom_metric_by_module_name_runs_on_the_reference_too(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    metric = load_custom("eval_metric_example:confidence", Path("/nonexistent"))
    reference = items([0, 1], [[0.9, 0.1], [0.2, 0.8]])
    device = items([0, 1], [[0.6, 0.4], [0.2, 0.8]])
    values = score(EvalInputs(device, reference, topk=2), builtin_metrics(2), [metric])
    assert values["confidence_mean"] == pytest.approx(0.7)
    assert values["reference.confidence_mean"] == pytest.approx(0.85)


def test_custom_metric_problems_are_named(tmp_path):
    (tmp_path / "bad.py").write_text(
        "def text(rows):\n    return {'m': 'high'}\n"
        "def builtin(rows):\n    return {'top1': 1.0}\n"
        "def boom(rows):\n    raise ValueError('no boxes')\n"
        "def listy(rows):\n    return [1.0]\n"
    )
    x = EvalInputs(FIVE, topk=3)
    registry = builtin_metrics(3)
    with pytest.raises(CustomMetricError, match="cannot import nosuchmodule"):
        load_custom("nosuchmodule:f", tmp_path)
    with pytest.raises(CustomMetricError, match="has no function missing"):
        load_custom("bad.py:missing", tmp_path)
    for name, needle in [
        ("text", "'m': 'high', not a number"),
        ("builtin", "'top1', which is a built-in metric"),
        ("listy", "returned list"),
    ]:
        with pytest.raises(CustomMetricError, match=needle):
            score(x, registry, [load_custom(f"bad.py:{name}", tmp_path)])
    with pytest.raises(RunFailedError, match=r"bad\.py:boom raised ValueError: no boxes"):
        score(x, registry, [load_custom("bad.py:boom", tmp_path)])
    assert "nosuchmodule" not in sys.modules
