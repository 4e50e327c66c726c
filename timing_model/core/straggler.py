"""Straggler term: how much longer the slowest of n workers takes than the average one.

Synchronous modes wait for the slowest worker, so they pay E[max_i T_c,i] rather than the mean.
For n iid normal compute times, E[max] = μ + e_n·σ, with e_2 = 1/√π = 0.564, e_4 = 1.029,
e_8 = 1.424, e_16 = 1.766 (order statistics of the normal; √(2 ln n) overestimates, 1.67 at n = 4).
Other n are integrated numerically. For exponential tails with rate λ, E[max] = H_n/λ
(H_n the n-th harmonic number: H_2 = 1.5, H_4 = 2.083, H_8 = 2.718).

The same question inside one worker's pipelined step: the step lasts the longer of its compute and the exchange
in flight, and when both vary from step to step E[max(A, B)] exceeds max(E[A], E[B]) most where they are equal
(``expected_max_of_two``, Clark 1961, for independent normal times).
"""
from __future__ import annotations

import math
from functools import lru_cache

__all__ = ["E_MAX_NORMAL", "expected_max_normal_factor", "expected_max_normal", "expected_max_of_two", "harmonic",
           "expected_max_exponential"]

# E[max of n standard normals], table values used as-is (REFERENCES §2).
E_MAX_NORMAL = {1: 0.0, 2: 0.564, 4: 1.029, 8: 1.424, 16: 1.766}


def _normal_pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


@lru_cache(maxsize=256)
def _integrate_max_factor(workers: int, steps: int = 4000, half_width: float = 9.0) -> float:
    """∫ x·n·φ(x)·Φ(x)^(n−1) dx by Simpson's rule on [−9, 9] (error far below 1e-6)."""
    h = 2 * half_width / steps
    total = 0.0
    for i in range(steps + 1):
        x = -half_width + i * h
        weight = 1 if i in (0, steps) else (4 if i % 2 else 2)
        total += weight * x * workers * _normal_pdf(x) * _normal_cdf(x) ** (workers - 1)
    return total * h / 3


def expected_max_normal_factor(workers: int) -> float:
    """e_n such that E[max of n iid N(μ, σ²)] = μ + e_n·σ (table for 1, 2, 4, 8, 16; integrated otherwise)."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    if workers in E_MAX_NORMAL:
        return E_MAX_NORMAL[workers]
    return _integrate_max_factor(workers)


def expected_max_normal(workers: int, mean_s: float, std_s: float) -> float:
    """E[max of n iid normal compute times] = mean + e_n·std, seconds."""
    if std_s < 0:
        raise ValueError(f"std must be >= 0, got {std_s!r}")
    if std_s == 0:
        return mean_s
    return mean_s + expected_max_normal_factor(workers) * std_s


def expected_max_of_two(mean_a_s: float, mean_b_s: float, std_s: float) -> float:
    """E[max(A, B)] for independent normal A and B whose difference has standard deviation ``std_s``
    (sqrt(std_a² + std_b²)): with μ = mean_a − mean_b, mean_b + μ·Φ(μ/std) + std·φ(μ/std) (Clark 1961)."""
    if std_s < 0:
        raise ValueError(f"std must be >= 0, got {std_s!r}")
    if std_s == 0:
        return max(mean_a_s, mean_b_s)
    z = (mean_a_s - mean_b_s) / std_s
    return mean_b_s + (mean_a_s - mean_b_s) * _normal_cdf(z) + std_s * _normal_pdf(z)


def harmonic(workers: int) -> float:
    """H_n = 1 + 1/2 + ... + 1/n."""
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return sum(1.0 / i for i in range(1, workers + 1))


def expected_max_exponential(workers: int, mean_s: float) -> float:
    """E[max of n iid exponential times with mean 1/λ] = H_n/λ, seconds."""
    return harmonic(workers) * mean_s
