"""The alpha-beta fit of `planner calibrate`: exact recovery, noisy recovery, bounds and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.calibrate.fit import Fit, FitError, Sample, fit_alpha_beta, format_fit_table, model_terms, predict_seconds

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast")
SIZES = [4096 * 4**i for i in range(9)]  # 4 KiB .. 256 MiB


def _samples(kind: str, ns: tuple[int, ...], alpha: float, beta: float, noise: float = 0.0,
             seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for n in ns:
        for b in SIZES:
            t = predict_seconds(kind, n, b, alpha, beta) * (1.0 + noise * rng.standard_normal())
            out.append(Sample(kind, n, b, t))
    return out


def test_terms_follow_the_architecture_formulas() -> None:
    # ARCHITECTURE "Bytes convention": AG/RS/A2A a(n-1) + bB(n-1)/n, AR twice that, broadcast a*ceil(log2 n) + bB.
    assert model_terms("all_gather", 8, 800) == (7.0, 700.0)
    assert model_terms("reduce_scatter", 4, 400) == (3.0, 300.0)
    assert model_terms("all_to_all", 2, 100) == (1.0, 50.0)
    assert model_terms("all_reduce", 8, 800) == (14.0, 1400.0)
    assert model_terms("broadcast", 8, 800) == (3.0, 800.0)
    assert model_terms("broadcast", 6, 10) == (3.0, 10.0)
    assert model_terms("all_reduce", 1, 10**9) == (0.0, 0.0)


@pytest.mark.parametrize("kind", KINDS)
def test_exact_timings_give_back_alpha_and_beta(kind: str) -> None:
    alpha, beta = 23e-6, 1 / 40e9
    fit = fit_alpha_beta(_samples(kind, (2, 4, 8), alpha, beta))
    assert math.isclose(fit.alpha, alpha, rel_tol=1e-9)
    assert math.isclose(fit.beta, beta, rel_tol=1e-9)
    assert math.isclose(fit.r2, 1.0, abs_tol=1e-12)
    assert fit.worst_rel_residual < 1e-9
    assert fit.samples == 27


def test_one_fit_over_mixed_kinds_and_group_sizes_is_exact() -> None:
    alpha, beta = 5e-6, 1 / 200e9
    samples = [s for k in KINDS for s in _samples(k, (2, 8), alpha, beta)]
    fit = fit_alpha_beta(samples)
    assert math.isclose(fit.alpha, alpha, rel_tol=1e-9) and math.isclose(fit.beta, beta, rel_tol=1e-9)


def test_binomial_broadcast_fits_only_on_its_own_terms() -> None:
    # Timings of gloo's binomial broadcast over groups of 2, 4 and 8: its own terms give alpha and beta
    # back exactly; the pipelined terms (bytes paid once) cannot follow the log2 n growth of the bandwidth
    # term across group sizes, which is what left the pooled gloo broadcast fit at R^2 0.81.
    alpha, beta = 1e-3, 1 / 0.8e9
    samples = [Sample("broadcast", n, b, math.ceil(math.log2(n)) * (alpha + beta * b))
               for n in (2, 4, 8) for b in SIZES[:7]]
    assert model_terms("broadcast", 8, 800, "binomial") == (3.0, 2400.0)
    own = fit_alpha_beta(samples, "binomial")
    assert math.isclose(own.alpha, alpha, rel_tol=1e-9) and math.isclose(own.beta, beta, rel_tol=1e-9)
    assert own.r2 == pytest.approx(1.0)
    assert fit_alpha_beta(samples, "pipelined").r2 < 0.9


@pytest.mark.parametrize("seed", range(5))
def test_noisy_timings_give_close_alpha_and_beta(seed: int) -> None:
    # 5 % multiplicative noise on every point: the weighted fit averages it out over 27 points.
    alpha, beta = 40e-6, 1 / 12e9
    fit = fit_alpha_beta(_samples("all_gather", (2, 4, 8), alpha, beta, noise=0.05, seed=seed))
    assert abs(fit.alpha / alpha - 1) < 0.1
    assert abs(fit.beta / beta - 1) < 0.1
    assert fit.r2 > 0.99
    assert 0.02 < fit.worst_rel_residual < 0.3


def test_weighting_keeps_the_latency_term() -> None:
    # Small alpha, 3 % noise: at 256 MiB the noise (~1.4 ms) is 5x all of alpha's 14 latency terms, so an
    # unweighted fit on seconds lets the largest messages decide alpha; weighting by 1/sqrt(t) does not.
    alpha, beta = 20e-6, 1e-10
    plain_errors, fit_errors = [], []
    for seed in range(6):
        samples = _samples("all_reduce", (8,), alpha, beta, noise=0.03, seed=seed)
        terms = np.array([model_terms(s.kind, s.n, s.nbytes) for s in samples])
        plain, *_ = np.linalg.lstsq(terms, np.array([s.seconds for s in samples]), rcond=None)
        plain_errors.append(abs(plain[0] / alpha - 1))
        fit_errors.append(abs(fit_alpha_beta(samples).alpha / alpha - 1))
    assert max(fit_errors) < 0.05
    assert max(plain_errors) > 0.2  # the comparison is meaningful: the plain fit does go wrong here


def test_negative_free_fit_is_clamped_to_zero_alpha() -> None:
    # Times exactly proportional to bytes minus a constant: the free fit wants alpha < 0; the bounded fit
    # puts alpha at 0 and still reports positive bandwidth.
    samples = [Sample("all_gather", 4, b, b * 1e-9 - 1e-6) for b in SIZES[2:]]
    fit = fit_alpha_beta(samples)
    assert fit.alpha == 0.0 and fit.beta > 0


def test_flat_timings_fit_latency_only() -> None:
    # Every size takes the same time: pure latency, beta at its floor (no bandwidth information).
    samples = [Sample("broadcast", 4, b, 2e-3) for b in SIZES[:4]]
    fit = fit_alpha_beta(samples)
    assert math.isclose(fit.alpha, 1e-3, rel_tol=1e-6)  # ceil(log2 4) = 2 latency terms
    assert fit.beta <= 1e-15
    assert fit.r2 == pytest.approx(1.0)


@pytest.mark.parametrize(("samples", "match"), [
    ([Sample("all_gather", 2, 4096, 1e-3)] * 2, "at least 3"),
    ([Sample("all_gather", 2, 4096, 1e-3)] * 3, "two message sizes"),
    ([Sample("all_gather", 2, b, -1.0) for b in SIZES[:3]], "positive"),
    ([Sample("all_gather", 1, b, 1e-3) for b in SIZES[:3]], "one rank"),
    ([Sample("gossip", 2, b, 1e-3) for b in SIZES[:3]], "unknown collective"),
])
def test_bad_samples_raise_fit_error(samples: list[Sample], match: str) -> None:
    with pytest.raises(FitError, match=match):
        fit_alpha_beta(samples)


def test_table_lists_every_row() -> None:
    fit = Fit(alpha=10e-6, beta=1e-10, r2=0.987, worst_rel_residual=0.12, samples=7)
    text = format_fit_table([("intra (profile)", "all_gather", fit, ""), ("x", "broadcast", None, "too few")])
    assert "all_gather" in text and "10.0" in text and "10.000" in text and "0.987" in text and "12%" in text
    assert "too few" in text
