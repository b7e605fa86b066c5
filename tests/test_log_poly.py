"""`duoloss.core._numerics.log_poly`, the table-free log of the joiner normaliser:
accurate against the C library's ``log`` over the whole normal range, and a loop of it
vectorises (packed division and FMAs): numba's ``/`` tests the divisor for zero and
raises, and that branch kept such a loop scalar, so the division is `_fdiv` (IEEE, the
same correctly rounded quotient)."""
from __future__ import annotations

import math
import re

import numba
import numpy as np

from duoloss.core._numerics import _fdiv, log_poly


@numba.njit(cache=False, fastmath={"contract"})  # as the kernels compile it
def _logs(x, out):
    for i in range(x.shape[0]):
        out[i] = log_poly(x[i])


def test_log_poly_is_within_two_ulps_of_libm():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        np.exp(rng.uniform(-700.0, 700.0, 20000)),          # the whole range
        1.0 + rng.uniform(-1e-3, 1e-3, 2000),                # around 1 (log near 0)
        [np.finfo(np.float64).tiny, np.finfo(np.float64).max, 0.5, 1.0, 2.0,
         math.sqrt(2.0), np.nextafter(math.sqrt(2.0), 2.0), math.e],
    ])
    out = np.empty_like(x)
    _logs(x, out)
    assert out[-5] == 0.0  # log(1) exactly
    ref = np.log(x)
    err = np.abs(out - ref)
    # absolute error relative to the result's ulp (log near 1 is small: measured in the
    # ulp of |log x| + 1e-16, as the reduction k ln2 + log f makes it)
    tol = 2 * np.spacing(np.maximum(np.abs(ref), 1e-16)) + 1e-19
    assert np.all(err <= tol), (x[err > tol][:5], out[err > tol][:5], ref[err > tol][:5])


def test_fdiv_is_the_ieee_quotient():
    @numba.njit(cache=False)
    def q(a, b):
        return _fdiv(a, b)

    assert q(1.0, 3.0) == 1.0 / 3.0
    assert q(1.0, 0.0) == math.inf and q(-1.0, 0.0) == -math.inf
    assert math.isnan(q(0.0, 0.0))
    assert q(np.float32(1.0), np.float32(3.0)) == 1.0 / 3.0  # float64 quotient of the values


def test_a_loop_of_log_poly_vectorises():
    x = np.full(64, 3.0)
    _logs(x, np.empty_like(x))
    asm = _logs.inspect_asm(_logs.signatures[0])
    assert re.search(r"vdivpd\s+[^\n]*%[xyz]mm", asm), "the division stayed scalar"
    assert re.search(r"vfmadd\w*pd", asm), "the polynomial stayed scalar"
