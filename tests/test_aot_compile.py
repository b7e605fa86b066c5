"""Ahead-of-time compile check of the torch device path's Triton kernels (no GPU needed).

The interpreter the other device tests use accepts code a GPU compiler rejects or runs
badly, so a child process (``TRITON_INTERPRET`` unset: the kernels are defined for a
GPU) runs ``benchmarks/aot_table.py --subset``: the launchers run on meta tensors of
representative shapes, Triton's own binder gives the variant each launch would compile
(`duoloss.torch._triton._aot`), and ``triton.compile`` builds it for sm_80 and sm_90
with the ``ptxas`` inside the Triton wheel.  ``ptxas -v`` is the independent
reference for registers and spills, the TTIR for the width of every pointer offset.
The full table (every ``BLOCK``, every family, minutes) is ``python -m
benchmarks.aot_table``; its result is in docs/devices.md.

The same child also counts compiles across shapes: new lengths and strides of the
same ``BLOCK`` must map to the variant already compiled (``do_not_specialize``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_CHILD = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, sys.argv[1])
import torch
from triton.backends.compiler import GPUTarget
from benchmarks import aot_table
from duoloss.torch._triton import _aot
rows = aot_table.run(subset=True, progress=False)
# compiles across shapes: the variants of many T/U/S with the same BLOCK
t90 = GPUTarget("cuda", 90, 32)
launches = []
for n, t, s in ((32, 500, 100), (7, 333, 70), (1, 17, 127), (64, 1000, 65)):
    launches += _aot.ctc_launches(n, t, 50, s, torch.float32, True)
    launches += _aot.ctc_launches(n, t, 50, s, torch.float32, True, split=True)
for n, t, u in ((32, 150, 28), (3, 77, 17), (16, 1000, 31)):
    launches += _aot.transducer_launches(n, t, u, torch.float32, True)
for n, t, u in ((32, 150, 40), (3, 77, 50), (16, 1000, 33)):
    launches += _aot.rnnt_loss_launches(n, t, u, 28, torch.float32, True)
    launches += _aot.dur_launches(n, t, u, 28, "tdt", (0, 1, 2, 4), torch.float32, True)
counts = {}
for v in _aot.variants(launches, t90).values():
    name = v["kernel"].fn.__name__
    counts[name] = counts.get(name, 0) + 1
# one variant per duration set, and no tensor of durations passed at run time
tdt = []
for d in ((0, 1, 2), (0, 1, 3), (0, 1, 2)):
    tdt += _aot.dur_launches(2, 10, 5, 8, "tdt", d, torch.float32, True)
int_tensors = sum(1 for _k, _g, args, _kw in tdt for a in args
                  if isinstance(a, torch.Tensor) and not a.is_floating_point()
                  and a.shape[0] != 2)
per_kernel = {}
for v in _aot.variants(tdt, t90).values():
    name = v["kernel"].fn.__name__
    per_kernel[name] = per_kernel.get(name, 0) + 1
print(json.dumps({"rows": rows, "counts": counts, "tdt_variants": per_kernel,
                  "tdt_int_tensors": int_tensors}))
"""


#: rnnt_loss's fused kernels (duoloss.torch._triton._rnnt_kernels)
RNNT_LOSS_KERNELS = {"rnnt_norm_kernel", "rnnt_alpha_beta_kernel", "rnnt_reduce_kernel",
                     "rnnt_grad_kernel", "dur_norm_kernel", "dur_alpha_beta_kernel",
                     "dur_reduce_kernel", "dur_grad_kernel"}
CELL_PARALLEL = {"rnnt_norm_kernel", "rnnt_grad_kernel", "dur_norm_kernel", "dur_grad_kernel",
                 "k2_grad_kernel"}
K2_KERNELS = {"k2_alpha_beta_kernel", "k2_grad_kernel"}
#: CTC's two-launch form (alpha/beta concurrent, then the gradient rows)
CTC_SPLIT_KERNELS = {"ctc_ab_kernel", "ctc_post_kernel"}


@pytest.fixture(scope="module")
def table():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT)], env=env,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    if "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("Triton's ptxas is not available")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_subset_variant_compiles_for_sm80_and_sm90(table):
    from benchmarks import aot_table
    rows = table["rows"]
    seen = {(r["case"], r["sm"]) for r in rows}
    for case in aot_table.SUBSET:
        for sm in (80, 90):
            assert (aot_table.describe(case), sm) in seen
    kernels = {r["kernel"] for r in rows}
    assert kernels >= {"ctc_kernel"} | CTC_SPLIT_KERNELS | K2_KERNELS | RNNT_LOSS_KERNELS
    for r in rows:
        assert r["regs"] > 0 and r["regs"] <= 255, r


def test_no_spill_and_no_32_bit_bases(table):
    from benchmarks import aot_table
    assert aot_table.problems(table["rows"]) == []


def test_warps_follow_block(table):
    """``num_warps * 32 <= max(BLOCK, 32)`` (no warp recomputes another's values) and
    at least 8 warps from ``BLOCK = 1024``."""
    for r in table["rows"]:
        if r["kernel"] in CELL_PARALLEL:
            continue  # (a block of cells x classes per program, not a level per sequence)
        assert r["num_warps"] * 32 <= max(r["block"], 32), r
        if r["block"] >= 1024:
            assert r["num_warps"] >= 8, r


def test_new_lengths_do_not_compile_anew(table):
    """Shapes of one ``BLOCK`` share one variant per kernel (lengths, batch sizes and
    strides are not specialised)."""
    assert table["counts"] == {"ctc_kernel": 1, **{k: 1 for k in CTC_SPLIT_KERNELS},
                               **{k: 1 for k in K2_KERNELS},
                               **{k: 1 for k in RNNT_LOSS_KERNELS}}


def test_durations_are_compile_time_constants(table):
    """Every TDT duration set is a variant of its own (the move loops unrolled) of the
    kernels that read durations, and no table of durations is passed (copied to the
    device) at run time."""
    from duoloss.torch._triton import _dur_ops
    assert table["tdt_variants"]["dur_alpha_beta_kernel"] == 2
    assert table["tdt_variants"]["dur_grad_kernel"] == 2
    assert table["tdt_int_tensors"] == 0  # only the (N,) lengths are integer tensors
    assert _dur_ops._pack([1, 2, 4]) == 1 + (2 << 12) + (4 << 24)
    with pytest.raises(ValueError, match="tdt_loss: argument 'durations'"):
        _dur_ops._pack([4096])


def test_duration_lattice_beyond_32_bit_offsets_is_refused():
    """The fused TDT / multi-blank kernels address one sequence's workspace (``5 + NB +
    D`` planes of ``T (U + 1)`` cells) with 32-bit offsets from 64-bit per-sequence
    bases: a larger workspace is refused on the host (shapes only, ``meta`` tensors:
    nothing allocated, no kernel), while a batch whose total size exceeds ``2**31``
    elements is not limited."""
    import torch

    from duoloss.torch._triton import _dur_ops
    meta = torch.device("meta")
    tdt = _dur_ops.tdt_spec((0, 1), 0.0, 2)          # 5 + 1 + 2 = 8 planes
    mb = _dur_ops.multiblank_spec((2,), 0.0)         # 5 + 2 + 0 = 7 planes

    def logits(n, t, u1):
        return torch.empty((n, t, u1, 3), device=meta)

    # 8 T (U + 1) + 3 <= 2**31 - 1  <=>  T (U + 1) <= 268435455 = 3 * 5 * 17 * 257 * 4097
    _dur_ops.check_lattice("tdt_loss", logits(1, 268435455, 1), tdt)
    with pytest.raises(ValueError, match=r"tdt_loss: argument 'logits' .*268435456 cells"):
        _dur_ops.check_lattice("tdt_loss", logits(1, 268435456, 1), tdt)
    with pytest.raises(ValueError, match=r"multiblank_rnnt_loss: argument 'logits'"):
        _dur_ops.check_lattice("multiblank_rnnt_loss", logits(1, 2 ** 16, 2 ** 15), mb)
    # TDT's omega mixture: the widest spec decides
    omega = [(tdt, 0.9), (_dur_ops.rnnt_on_tokens_spec(2), 0.1)]
    with pytest.raises(ValueError, match=r"tdt_loss: argument 'logits'"):
        _dur_ops.check_lattice("tdt_loss", logits(1, 268435456, 1), omega)
    # many sequences whose logits together exceed 2**31 elements: accepted (64-bit bases)
    _dur_ops.check_lattice("tdt_loss", logits(4096, 1000, 201), tdt)
