"""planner.verify.compare: per-tensor comparison that a wrong tensor cannot hide from (no ranks needed)."""

from __future__ import annotations

import pytest
import torch

from planner.verify.compare import GRAD_NOISE, compare, grad_floor, move_floor, moved

TOL = 1e-5


def _grads() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(64, 64, generator=g), "ln.bias": 1e-3 * torch.randn(64, generator=g),
            "key.bias": 1e-12 * torch.randn(64, generator=g)}  # zero in exact arithmetic: rounding noise


def test_zero_gradient_noise_never_fails_nor_heads_the_list() -> None:
    want = _grads()
    got = {k: v.clone() for k, v in want.items()}
    got["key.bias"] = -want["key.bias"]  # another summation order, another noise: 100 % off on its own scale
    got["w"] = want["w"] * (1 + 1e-7)
    c = compare(got, want, grad_floor(want))
    assert c.failing(TOL) == []
    assert c.worst is not None and c.worst.name == "w"
    assert c.floor == pytest.approx(GRAD_NOISE * torch.cat([v.double().flatten() for v in want.values()]).norm().item())


def test_a_scaled_small_bias_fails_and_is_named() -> None:
    want = _grads()
    got = {k: v.clone() for k, v in want.items()}
    got["ln.bias"] = 0.5 * want["ln.bias"]
    c = compare(got, want, grad_floor(want))
    assert [r.name for r in c.failing(TOL)] == ["ln.bias"]
    assert c.failing(TOL)[0].error == 0.5  # on its own scale, not on the largest tensor's


def test_every_failing_tensor_is_listed_worst_first() -> None:
    want = _grads()
    got = {"w": want["w"] * 1.01, "ln.bias": want["ln.bias"] * 2, "key.bias": want["key.bias"]}
    c = compare(got, want, grad_floor(want))
    assert [r.name for r in c.failing(TOL)] == ["ln.bias", "w"]
    missing = compare({"w": want["w"]}, want, grad_floor(want))
    assert {r.name for r in missing.failing(TOL)} == {"ln.bias", "key.bias"}  # a missing tensor fails


def test_parameters_floor_is_the_largest_move_not_the_largest_value() -> None:
    before = {"ln.weight": torch.ones(8), "bias": torch.zeros(8)}
    after = {"ln.weight": torch.ones(8) - 1e-4, "bias": torch.full((8,), 1e-4)}
    floor = move_floor(moved(after, before))
    assert floor == pytest.approx(1e-4, rel=1e-3)  # (fp32 ones - 1e-4)
    wrong = {"ln.weight": after["ln.weight"], "bias": torch.full((8,), 2e-4)}  # the bias moved twice as far
    c = compare(wrong, after, floor)
    assert [r.name for r in c.failing(TOL)] == ["bias"]
    # the old check (relative to the largest value, 1.0) called this 1e-4: a pass at 1e-3, a miss at any
    # tolerance above the update size
    assert c.failing(TOL)[0].error > 0.5
