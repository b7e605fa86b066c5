"""The same bits whatever the CPU's vector width (issue 36 item 2).

The host kernels are vectorised (packed AVX2 / AVX-512 loops over the states of a
frame), and their sums add in fixed lanes written out in the source
(`duoloss.core.losses.ctc._lane_sum`), never in an order the compiler picks for
the vector width.  So a kernel compiled for AVX2 (``NUMBA_CPU_NAME=haswell``)
and the same kernel compiled for this machine (``NUMBA_CPU_NAME=host``: AVX-512
where the CPU has it) must give byte-identical outputs.  Each target is compiled
in a child process of its own, with an empty ``NUMBA_CACHE_DIR`` (a cached kernel
of the other target would otherwise be loaded), on tiny inputs: compile time
dominates, and only the kernels below are compiled.

Families: the CTC loss and its gradient (float32 and float64, the linear-space
path and a sequence that takes the exact log-space one), ``ctc_align`` (full
table and bounded-memory paths), and the transducer recursion under
``rnnt_loss`` (`duoloss.core.losses.transducer.transducer_loss_and_grad`).
"""
import numpy as np
import pytest

from isa_children import run_per_target

#: What each child computes; every output array is saved to ``sys.argv[1]`` (npz).
_CHILD = r"""
import sys
import numpy as np
out = {}
rng = np.random.default_rng(36)

def batch(t, n, c, s, dtype):
    x = rng.standard_normal((t, n, c)) * 3.0
    x -= np.log(np.exp(x).sum(-1, keepdims=True))
    tg = rng.integers(1, c, size=(n, s))
    tg[0, 1] = tg[0, 0]  # a repeated label: the skip rule's other branch
    il = np.array([t] + [t - 3 - b for b in range(1, n)])
    tl = np.array([s] + [s - 1 - (b % 3) for b in range(1, n)])
    il = np.minimum(np.maximum(il, 2 * tl + 1), t)
    return x.astype(dtype), tg, il, tl

def ctc_cases():
    # float32 (one signature: compile time); the log-space fallback is scalar code
    # and is left out for the same reason
    from duoloss.core.losses.ctc import ctc_loss_and_grad
    # 9 classes: the scalar exp of the frame probabilities; 40 classes and 30 labels:
    # the packed one (`_PACKED_EXP_MIN` distinct classes or more)
    for name, size in (("small", (37, 5, 9, 11)), ("wide", (70, 3, 40, 30))):
        x, tg, il, tl = batch(*size, np.float32)
        w = np.linspace(0.5, 2.0, size[1])
        losses, grad = ctc_loss_and_grad(x, tg, il, tl, grad_weights=w)
        out[f"ctc_loss_{name}"] = losses
        out[f"ctc_grad_{name}"] = grad
    from duoloss.core.losses import ctc
    packed("ctc", ctc._ctc_batch_serial)

def align_cases():
    from duoloss.core.losses.align import ctc_align
    x, tg, il, tl = batch(41, 3, 7, 9, np.float64)
    x = np.round(x, 1)  # ties: the tie rule must not depend on the width either
    for name, cells in (("table", None), ("checkpointed", 0)):
        labels, scores = ctc_align(x, tg, il, tl, _checkpoint_cells=cells)
        out[f"align_labels_{name}"] = labels
        out[f"align_scores_{name}"] = scores
    from duoloss.core.losses import align
    packed("align", align._ctc_align_big)

def transducer_cases():
    # H8's transducer kernel (issue 36): whatever duoloss.core.losses.transducer
    # holds at this commit, the bits must not depend on the width either.
    from duoloss.core.losses.transducer import transducer_loss_and_grad
    n, s, t = 3, 5, 9
    px = rng.standard_normal((n, s, t + 1)) - 1.0
    py = rng.standard_normal((n, s + 1, t)) - 1.0
    losses, (gx, gy) = transducer_loss_and_grad(px, py)
    out["transducer_loss"] = losses
    out["transducer_gx"] = gx
    out["transducer_gy"] = gy

def logits_cases():
    # optax_ctc_loss's host path: log_softmax and its backward around the CTC kernel
    from duoloss.core.losses.ctc_logits import ctc_logits_loss_and_grad
    x, tg, il, tl = batch(70, 3, 40, 30, np.float32)
    x = np.ascontiguousarray(x.transpose(1, 0, 2) * 2.0)
    x[1, 5] += 120.0  # a row outside the unshifted range: the max-shifted pass
    w = np.linspace(0.5, 2.0, 3)
    losses, grad = ctc_logits_loss_and_grad(x, tg, il, tl, grad_weights=w)
    out["logits_loss"] = losses
    out["logits_grad"] = grad

def packed(family, kernel):
    # packed double-precision arithmetic in the compiled kernel (its loops inlined)
    import re
    asm = kernel.inspect_asm(kernel.signatures[0])
    ops = re.findall(r"^\s+(v(?:add|mul|max)pd)\s+(.*)$", asm, re.M)
    wide = [op for op, args in ops if "%ymm" in args or "%zmm" in args]
    out[f"probe_packed_{family}"] = np.array(len(wide))

def probe():
    # which vector registers this build uses: a plain map over an array
    import numba
    f = numba.njit(lambda x: x * 2.0 + 1.0)
    f(np.ones(64))
    asm = f.inspect_asm(f.signatures[0])
    out["probe_zmm"] = np.array("zmm" in asm)
    out["probe_ymm"] = np.array("ymm" in asm)

probe()
for case in sys.argv[2].split(","):
    {"ctc": ctc_cases, "align": align_cases, "transducer": transducer_cases,
     "logits": logits_cases}[case]()
np.savez(sys.argv[1], **out)
"""

CASES = ("ctc", "align", "transducer", "logits")

@pytest.fixture(scope="module")
def outputs():
    return run_per_target(_CHILD, lambda _cpu: ",".join(CASES), timeout=300)


def test_the_builds_differ(outputs):
    """The AVX2 build uses no 512-bit register; the host build does where the CPU
    has AVX-512 (else the comparison below is AVX2 against AVX2 and proves less)."""
    assert outputs["haswell"]["probe_ymm"] and not outputs["haswell"]["probe_zmm"]
    import llvmlite.binding as ll
    if ll.get_host_cpu_features().get("avx512f"):
        assert outputs["host"]["probe_zmm"]


@pytest.mark.parametrize("family", ["ctc", "align"])
def test_the_inner_loops_are_packed(outputs, family):
    """The CTC forward-backward and the aligner's rows compile to packed 256/512-bit
    additions, multiplications and maxima in both builds (numba's signed-index
    wraparound, branches in the recursion or a strict running sum would leave them
    scalar)."""
    for cpu in ("haswell", "host"):
        assert outputs[cpu][f"probe_packed_{family}"] >= 2, (cpu, family)


@pytest.mark.parametrize("family", CASES)
def test_avx2_and_host_give_the_same_bytes(outputs, family):
    avx2, host = outputs["haswell"], outputs["host"]
    names = sorted(k for k in avx2 if k.startswith(family) and not k.startswith("probe"))
    assert names, f"no output of {family}"
    assert sorted(k for k in host if k.startswith(family)) == names
    for name in names:
        a, b = avx2[name], host[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.isfinite(a.astype(np.float64)).any(), name  # something was computed
        diff = np.flatnonzero(a.view(np.uint8) != b.view(np.uint8))
        assert diff.size == 0, (
            f"{name}: AVX2 and host builds differ in {diff.size} bytes "
            f"(first values {a.ravel()[:4]} vs {b.ravel()[:4]})")
