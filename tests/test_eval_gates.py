"""Gate logic: floors, ceilings, drops against the baseline (with McNemar), ratios to the
reference; the verdict names every gate with its value and limit."""

from __future__ import annotations

import pytest

from batchinfer.evaluate import Gate, check_gates


def only(verdict, check):
    (result,) = [g for g in verdict.gates if g.check == check]
    return result


def test_floor_and_ceiling():
    verdict = check_gates(
        [Gate("top1", min=0.95), Gate("errors", max=0)], {"top1": 0.96, "errors": 2}, None
    )
    assert not verdict.passed
    assert only(verdict, "min").passed is True
    errors = only(verdict, "max")
    assert (errors.passed, errors.value, errors.limit) == (False, 2, 0)
    assert [g.metric for g in verdict.failed] == ["errors"]
    assert errors.line() == "FAIL        errors <= 0 (ceiling): value 2"


def test_a_value_exactly_at_its_limit_passes():
    verdict = check_gates([Gate("top1", min=0.1 + 0.2)], {"top1": 0.3}, None)
    assert verdict.passed


def test_the_drop_gate_is_not_checked_without_a_baseline_and_never_fails_then():
    verdict = check_gates([Gate("top1", max_drop=0.0)], {"top1": 0.5}, None)
    result = only(verdict, "max_drop")
    assert result.passed is None and result.status == "not checked"
    assert "no baseline yet" in result.note
    assert verdict.passed


def test_the_drop_gate_on_the_night_that_accepts_the_first_baseline_does_not_ask_for_one():
    verdict = check_gates([Gate("top1", max_drop=0.0)], {"top1": 0.5}, None, accepting=True)
    result = only(verdict, "max_drop")
    assert result.passed is None
    assert "no baseline before this evaluation" in result.note
    assert "accept one" not in result.note and "makes this evaluation the baseline" in result.note


def test_the_drop_gate_against_the_baseline():
    gate = Gate("top1", max_drop=0.01)
    ok = check_gates([gate], {"top1": 0.905}, {"top1": 0.91})
    assert only(ok, "max_drop").passed and only(ok, "max_drop").limit == pytest.approx(0.90)
    bad = check_gates([gate], {"top1": 0.89}, {"top1": 0.91})
    result = only(bad, "max_drop")
    assert result.passed is False
    assert "top1 >= 0.9 (drop vs baseline): value 0.89; baseline 0.91" in result.line()


def test_with_alpha_only_a_significant_drop_fails():
    gate = Gate("top1", max_drop=0.0, alpha=0.05)
    # 3 lost, 1 gained: exact p = 0.625, not significant: passes despite the drop.
    rescued = check_gates([gate], {"top1": 0.89, "mcnemar_p": 0.625}, {"top1": 0.91})
    result = only(rescued, "max_drop")
    assert result.passed is True
    assert "McNemar p = 0.625 >= alpha 0.05: the drop is not significant" in result.note
    # The same drop with p = 0.01 fails.
    failed = check_gates([gate], {"top1": 0.89, "mcnemar_p": 0.01}, {"top1": 0.91})
    assert only(failed, "max_drop").passed is False
    assert "significant" in only(failed, "max_drop").note


def test_ratio_to_the_reference():
    gate = Gate("top1", min_ratio_to_reference=0.99)
    ok = check_gates([gate], {"top1": 0.90, "reference.top1": 0.905}, None)
    result = only(ok, "min_ratio_to_reference")
    assert result.passed and result.limit == pytest.approx(0.89595)
    bad = check_gates([gate], {"top1": 0.85, "reference.top1": 0.905}, None)
    assert not bad.passed
    assert "0.99 x reference 0.905" in only(bad, "min_ratio_to_reference").note


def test_a_metric_that_was_not_computed_fails_its_gate_and_says_so():
    verdict = check_gates(
        [Gate("top1", min=0.5, min_ratio_to_reference=0.99)], {"errors": 0.0}, None
    )
    assert [g.passed for g in verdict.gates] == [False, False]
    assert all("not computed" in g.note for g in verdict.gates)


def test_every_gate_is_listed_with_value_and_limit():
    gates = [Gate("top1", min=0.9, max_drop=0.01), Gate("cosine_mean", min=0.99)]
    verdict = check_gates(
        gates,
        {"top1": 0.95, "cosine_mean": 0.98},
        {"top1": 0.95},
        notes={"cosine_mean": "worst item 3/x.png"},
    )
    assert verdict.lines() == [
        "pass        top1 >= 0.9 (floor): value 0.95",
        "pass        top1 >= 0.94 (drop vs baseline): value 0.95; baseline 0.95",
        "FAIL        cosine_mean >= 0.99 (floor): value 0.98; worst item 3/x.png",
    ]
    assert verdict.word == "fail"
