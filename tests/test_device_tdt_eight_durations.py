"""TDT on the torch device path with the largest duration sets the AOT table compiles
(8 durations, with and without 0) and beyond it (10): the kernels' move loops read
each duration from one compile-time constant, 12 bits per entry
(``_dur_kernels._entry``).  Compared with the host path (the numba core, itself tested against brute-force path enumeration in
tests/test_tdt.py) on tiny inputs, under ``TRITON_INTERPRET=1`` (as
tests/test_device_tdt_torch.py).
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import duoloss.torch as dt  # noqa: E402
from test_device_torch import interpreted  # noqa: E402
from test_device_tdt_torch import _check, _logits  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _interpreter():
    yield from interpreted("_dur_kernels")


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4, 5, 6, 7), (1, 2, 3, 4, 5, 6, 7, 8),
                                       (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)],
                         ids=["d0-7", "d1-8", "d0-9"])
def test_eight_durations_device_equals_host(durations):
    """``T_b = 10`` > 9: each move (label and blank) lands inside the lattice for some
    frames and past its end for others; float64, losses and gradients to 1e-12
    (`test_device_torch.TOL`)."""
    dtype = torch.float64
    x = _logits(7, (2, 10, 3, 3 + len(durations)), dtype)
    targets = torch.tensor([[1, 2], [2, 0]])
    il, tl = torch.tensor([10, 6]), torch.tensor([2, 1])
    cot = torch.tensor([0.5, -2.0], dtype=dtype)
    loss, grad = _check(dt.tdt_loss, x, targets, il, tl, dtype, cot, blank=0,
                        durations=list(durations), sigma=0.05, reduction="none")
    assert torch.isfinite(loss).all()
    # the gradient of every duration column is not zero (each move is used)
    assert (grad[0, :, :, 3:].abs().amax(dim=(0, 1)) > 0).all()
