"""The transducer recursion vectorised along the wavefront (issue 36).

`duoloss.core.losses.transducer` runs the rescaled linear-space sweeps over the
lattice's levels (anti-diagonals for 'regular', frames for 'modified'), each level a
branch-free loop over guard-padded rows, scaled by powers of two, with sums in 8
fixed lanes.  Checked here:

* the losses and move gradients against the exact log-space recursion of the same
  module (``_log_space=True``: the scalar ``logaddexp`` form, an independent path)
  and, on tiny lattices, against brute-force enumeration of the paths;
* the level windows at every box shape that can occur (offset boundaries, one row,
  one column, modified boxes with ``s_end - s_begin == t_end - t_begin``);
* the full RNN-T step from logits (`rnnt_loss_from_logits`) and the lattice kernel
  give the same bytes compiled for AVX2 and for this machine (AVX-512 where it has
  it), in child processes with empty caches;
* the sweeps' inner loops contain packed floating-point instructions.
"""
import itertools

import numpy as np
import pytest

from duoloss.core.losses.transducer import transducer_loss_and_grad
from isa_children import run_per_target


def _lattice(rng, n, s, t, modified, dtype=np.float64, scale=1.0):
    px = rng.standard_normal((n, s, t if modified else t + 1)) * scale - 1.0
    py = rng.standard_normal((n, s + 1, t)) * scale - 1.0
    return px.astype(dtype), py.astype(dtype)


def _brute_force(px, py, bd, modified):
    """-log of the sum over every path of the box (enumerated move sequences)."""
    s0, t0, s1, t1 = (int(v) for v in bd)
    ns, nt = s1 - s0, t1 - t0
    total = []
    n_moves = nt + (0 if modified else ns)
    for moves in itertools.product((0, 1), repeat=n_moves):  # 1: symbol
        if sum(moves) != ns:
            continue
        s, t, lp = s0, t0, 0.0
        ok = True
        for mv in moves:
            if mv:
                if modified:
                    if t >= t1:
                        ok = False
                        break
                    lp += px[s, t]
                    t += 1
                else:
                    lp += px[s, t]
                s += 1
            else:
                if t >= t1:
                    ok = False
                    break
                lp += py[s, t]
                t += 1
        if ok and s == s1 and t == t1:
            total.append(lp)
    if not total:
        return np.inf
    total = np.array(total)
    m = total.max()
    return -(m + np.log(np.exp(total - m).sum()))


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
def test_every_box_shape_matches_brute_force(rnnt_type):
    modified = rnnt_type == "modified"
    rng = np.random.default_rng(1)
    s_max, t_max = 3, 4
    boxes = [(sb, tb, se, te) for sb in range(s_max + 1) for se in range(sb, s_max + 1)
             for tb in range(t_max + 1) for te in range(tb, t_max + 1)
             if not modified or se - sb <= te - tb]
    px, py = _lattice(rng, len(boxes), s_max, t_max, modified)
    bd = np.array(boxes)
    losses, _ = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)
    want = [_brute_force(px[i], py[i], bd[i], modified) for i in range(len(boxes))]
    np.testing.assert_allclose(losses, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("rnnt_type", ["regular", "modified"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("s_max,t_max", [(1, 7), (9, 1), (17, 23), (40, 150), (70, 31)])
def test_matches_the_exact_log_space_recursion(rnnt_type, dtype, s_max, t_max):
    modified = rnnt_type == "modified"
    if modified and s_max > t_max:
        s_max = t_max
    rng = np.random.default_rng(s_max * 1000 + t_max)
    n = 6
    px, py = _lattice(rng, n, s_max, t_max, modified, dtype, scale=2.0)
    if not modified:
        px[:, :, -1] = -np.inf  # k2's fix_for_boundary
    # offset boxes, a full box, an empty target
    se = rng.integers(0, s_max + 1, n)
    te = np.maximum(rng.integers(1, t_max + 1, n), se if modified else 0)
    sb = np.minimum(rng.integers(0, 3, n), se)
    tb = np.minimum(rng.integers(0, 3, n), te - (se - sb) if modified else te)
    bd = np.stack([sb, tb, se, te], 1)
    bd[0] = [0, 0, s_max, t_max]
    bd[1] = [0, 0, 0, t_max]
    got, (gx, gy) = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type)
    want, (wx, wy) = transducer_loss_and_grad(px, py, bd, rnnt_type=rnnt_type, _log_space=True)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(gx, wx, rtol=tol * 100, atol=tol * 10)
    np.testing.assert_allclose(gy, wy, rtol=tol * 100, atol=tol * 10)
    # zero outside each box, exactly
    for b in range(n):
        s0, t0, s1, t1 = bd[b]
        mask = np.ones(gy.shape[1:], bool)
        mask[s0:s1 + 1, t0:t1] = False
        assert not gy[b][mask].any()


def test_extreme_scales_agree_with_log_space():
    """Steep lattices: cells far below their level's bulk (flushed products, the
    per-level check) and a spread of 1e4 nats."""
    rng = np.random.default_rng(3)
    for scale in (30.0, 300.0, 3000.0):
        px, py = _lattice(rng, 4, 12, 40, False, scale=scale)
        got, (gx, gy) = transducer_loss_and_grad(px, py)
        want, (wx, wy) = transducer_loss_and_grad(px, py, _log_space=True)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        np.testing.assert_allclose(gx, wx, atol=1e-9)
        np.testing.assert_allclose(gy, wy, atol=1e-9)


# ---------------------------------------------------------------------------------- #
# The same bytes on AVX2 and on the host, and packed instructions                     #
# ---------------------------------------------------------------------------------- #
_CHILD = r"""
import sys
import numpy as np
from duoloss.core.losses import joiner, transducer
out = {}
rng = np.random.default_rng(8)
n, t, u, v = 3, 11, 6, 13
x = rng.standard_normal((n, t, u + 1, v)).astype(np.float32) * 2
tg = rng.integers(1, v, (n, u)); il = np.array([t, t - 2, 4]); tl = np.array([u, 3, 0])
bd = np.stack([0 * il, 0 * il, tl, il], 1)
losses, lse, gx, gy, grad = joiner.rnnt_loss_from_logits(x, tg, il, tl, 0, bd, 1.0 / 3)
out.update(fused_loss=losses, fused_lse=lse, fused_gx=gx, fused_gy=gy, fused_grad=grad)
px = rng.standard_normal((n, u, t)) - 1.0
py = rng.standard_normal((n, u + 1, t)) - 1.0
loss, (mx, my) = transducer.transducer_loss_and_grad(px, py, rnnt_type="modified")
out.update(modified_loss=loss, modified_gx=mx, modified_gy=my)
if sys.argv[2] == "asm":
    counts = {}
    for name in ("_linear_forward", "_linear_backward", "_exp_row"):
        asm = "".join(getattr(transducer, name).inspect_asm().values())
        ins = [l.split()[0] for l in asm.splitlines() if l.startswith("\t") and l.split()]
        counts[name] = sum(1 for i in ins if i.startswith("v") and i.endswith("pd")
                           and not i.startswith(("vmov", "vbroadcast", "vperm", "vshuf",
                                                 "vunpck", "vextract", "vinsert", "vblend")))
    out["asm_counts"] = np.array([counts[k] for k in sorted(counts)])
np.savez(sys.argv[1], **out)
"""

@pytest.fixture(scope="module")
def builds():
    return run_per_target(_CHILD, lambda cpu: "asm" if cpu == "host" else "values")


def test_avx2_and_host_builds_give_the_same_bytes(builds):
    avx2, host = builds["haswell"], builds["host"]
    names = sorted(k for k in avx2 if not k.startswith("asm"))
    assert len(names) == 8
    for name in names:
        a, b = avx2[name], host[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.isfinite(a.astype(np.float64)).any(), name
        diff = np.flatnonzero(a.view(np.uint8) != b.view(np.uint8))
        assert diff.size == 0, f"{name}: {diff.size} bytes differ"


def test_the_sweeps_use_packed_instructions(builds):
    """Arithmetic on packed doubles (``v...pd``, not moves or shuffles) in the
    exponential pass and in both sweeps of the host build."""
    counts = builds["host"]["asm_counts"]  # _exp_row, _linear_backward, _linear_forward
    assert (counts > 0).all(), counts
