"""Run a child script once per x86 target, at once, each with an empty numba cache: an
AVX2 + FMA build without AVX-512 (``NUMBA_CPU_NAME=haswell``) and the host's own, for
the tests that compare the kernels' bytes across vector widths
(tests/test_bit_identity_isa.py, tests/test_transducer_vectorised.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: AVX2 and FMA, no AVX-512 (LLVM's features of a Haswell); without NUMBA_CPU_FEATURES
#: numba would add the host's features (AVX-512 here) to the named CPU's.
HASWELL_FEATURES = ",".join(
    ["+64bit", "+avx", "+avx2", "+bmi", "+bmi2", "+cmov", "+cx16", "+f16c", "+fma", "+fxsr",
     "+lzcnt", "+mmx", "+movbe", "+popcnt", "+sse", "+sse2", "+sse3", "+sse4.1", "+sse4.2",
     "+ssse3", "+xsave", "-avx512f", "-avx512vl", "-avx512bw", "-avx512dq", "-avx512cd"])

TARGETS = ("haswell", "host")


def run_per_target(code: str, argument, timeout: float = 600) -> dict:
    """Run ``code`` as ``python -c code NPZ_PATH ARG`` for each of `TARGETS` (both at
    once: they compile on their own cores), ``ARG = argument(target)``; the child saves
    its arrays to ``NPZ_PATH`` (``np.savez``).  Returns ``{target: {name: array}}``."""
    tmp = tempfile.mkdtemp(prefix="duoloss-isa-")
    procs = {}
    for cpu in TARGETS:
        env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(tmp, cpu),
                   DUOLOSS_QUIET_COMPILE="1", PYTHONPATH=ROOT)
        env.pop("NUMBA_CPU_NAME", None)
        env.pop("NUMBA_CPU_FEATURES", None)
        if cpu != "host":
            env.update(NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES=HASWELL_FEATURES)
        path = os.path.join(tmp, f"{cpu}.npz")
        procs[cpu] = (path, subprocess.Popen([sys.executable, "-c", code, path, argument(cpu)],
                                             env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True))
    results = {}
    for cpu, (path, proc) in procs.items():
        log, _ = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"child for NUMBA_CPU_NAME={cpu} failed:\n{log[-3000:]}"
        with np.load(path) as data:
            results[cpu] = {k: data[k] for k in data.files}
    return results
