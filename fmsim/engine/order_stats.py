"""Order statistics for folded symmetry (DESIGN.md principle 5).

A synchronising group of n ranks waits for its slowest member. When each rank's time is
``mean · (1 + cv · Z)`` with Z standard normal, the group takes ``mean · (1 + cv · e(n))`` where
e(n) = E[max of n iid N(0, 1)] -- computed here by quadrature of n·z·φ(z)·Φ(z)^(n-1) (David &
Nagaraja, *Order Statistics*, 3rd ed., §3.1), so stragglers enter without sampling ranks.
"""
from __future__ import annotations

import functools
import math

import numpy as np

_Z = np.linspace(-9.0, 9.0, 4001)
_PHI = np.exp(-0.5 * _Z * _Z) / math.sqrt(2.0 * math.pi)
_CDF = 0.5 * (1.0 + np.vectorize(math.erf)(_Z / math.sqrt(2.0)))


@functools.lru_cache(maxsize=1024)
def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals]: 0 for n = 1, 1/√π for n = 2, about 3.9 for n = 16,384."""
    if n <= 1:
        return 0.0
    integrand = n * _Z * _PHI * np.power(_CDF, n - 1)
    return float(np.trapezoid(integrand, _Z))
