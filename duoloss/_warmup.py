"""Compile (and cache) duoloss's kernels ahead of time: ``duoloss.warmup``.

Each family runs a few tiny calls through every installed frontend (PyTorch, JAX; the
numpy core when neither is installed), in float32 and float64, forward and backward,
and the kernels a call compiles only when it needs them (the exact log-space fallbacks,
the bounded-memory aligners) are called with an empty batch: the same kernels and
signatures as real calls, so that numba compiles them now and a later process loads
them from its cache.  The ``decode`` family decodes through ``ctc_decoder`` (lexicon-free,
and with a lexicon, an ARPA LM and hotwords) and ``graph_decode`` (on an ARPA grammar
acceptor); the searches compile one signature per emissions dtype (float32 and
float64 for the CTC beam search, float64 for ``graph_decode``), whatever the options.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

__all__ = ["FAMILIES", "warmup"]

#: The kernel families, in the order ``warmup()`` compiles them.
FAMILIES = ("ctc", "asg", "graph", "rnnt", "k2", "tdt", "align", "decode")

_DTYPES = ("float32", "float64")


def _rng():
    return np.random.default_rng(0)


# The decoders' inputs: tokens (0 = blank, 1 = silence), a lexicon and a 2-gram ARPA LM.
_DECODE_TOKENS = ["-", "|", "a", "b", "c"]
_DECODE_LEXICON = "ab a b |\nba b a |\ncab c a b |\n"
_DECODE_ARPA = ("\\data\\\nngram 1=6\nngram 2=2\n\n\\1-grams:\n-99\t<s>\t-0.3\n"
                "-0.8\tab\t-0.2\n-0.9\tba\t-0.2\n-1.1\tcab\t-0.2\n-0.7\t</s>\n"
                "-2.0\t<unk>\n\n\\2-grams:\n-0.2\t<s> cab\n-0.1\tcab ab\n\n\\end\\\n")


def _decode_inputs(folder):
    """``(emissions (2, 8, 5) float64, lengths, decoder keyword sets, decoding graph)``.

    The lexicon and LM files are written to ``folder``.  The keyword sets of
    ``ctc_decoder`` are lexicon-free, and lexicon + LM + hotwords: the two compile the
    same search signature, the second also the LM table kernels.  The decoding graph is
    the LM's grammar acceptor over labels ``[0, 5)`` (epsilon arcs: backoff and ``</s>``):
    the search's kernels and signatures do not depend on the graph, and a real
    ``H o L o G`` is composed with the ``graph`` family's kernels, which this family
    leaves to that one (no family compiles another's kernels in a parallel warm-up).
    """
    from duoloss.core.decoding import read_arpa
    from duoloss.graphs import arpa_graph

    lexicon, arpa = os.path.join(folder, "lexicon.txt"), os.path.join(folder, "lm.arpa")
    with open(lexicon, "w", encoding="utf-8") as f:
        f.write(_DECODE_LEXICON)
    with open(arpa, "w", encoding="utf-8") as f:
        f.write(_DECODE_ARPA)
    x = _rng().standard_normal((2, 8, len(_DECODE_TOKENS)))
    em = x - np.log(np.exp(x).sum(-1, keepdims=True))
    options = [{}, dict(lexicon=lexicon, lm=arpa, hotwords=["ab"], nbest=2)]
    graph = arpa_graph(read_arpa(arpa), words=["-", "|", "ab", "ba", "cab"])
    return em, np.array([8, 5]), options, graph


# ----------------------------------------------------------------------------- torch
def _torch_calls(family: str) -> List[Callable[[str], None]]:
    import torch

    import duoloss.torch as dt

    def tensor(a, dtype, grad=True):
        return torch.tensor(a, dtype=getattr(torch, dtype), requires_grad=grad)

    tg = torch.tensor([[1, 2, 3], [4, 2, 1]])
    il, tl = torch.tensor([12, 10]), torch.tensor([3, 2])

    def ctc(dtype):
        lp = tensor(np.log(_softmax(_rng().standard_normal((12, 2, 6)))), dtype)
        dt.ctc_loss(lp, tg, il, tl).backward()
        dt.ctc_loss(lp, tg, il, tl, reduction="none").sum().backward()

    def asg(dtype):
        x = tensor(_rng().standard_normal((12, 2, 6)), dtype)
        loss = dt.ASGLoss(6).to(getattr(torch, dtype))
        loss(x, tg, il, tl).backward()
        dt.asg_loss(x, None, tg, il, tl).backward()

    def graph(dtype):
        from duoloss import gtn
        from duoloss.graphs import ctc_graph, ctc_topo

        lp = tensor(np.log(_softmax(_rng().standard_normal((12, 2, 5)))), dtype)
        dt.graph_loss(lp, ctc_graph([[1, 2, 2], [3, 4]]), [12, 10]).backward()
        acc = gtn.Graph(calc_grad=False)
        for i in range(3):
            acc.add_node(start=i == 0, accept=i == 2)
        acc.add_arc(0, 1, 1)
        acc.add_arc(1, 2, 2)
        frames = gtn.compose(ctc_topo(5), acc)
        dt.graph_loss(lp[:, :1], [frames], [12], denominator=[ctc_topo(5)]).backward()

    def rnnt(dtype):
        x = tensor(_rng().standard_normal((2, 6, 4, 5)), dtype)
        t32 = tg.to(torch.int32)
        il32, tl32 = torch.tensor([6, 5], dtype=torch.int32), tl.to(torch.int32)
        dt.rnnt_loss(x, t32, il32, tl32, blank=0).backward()
        dt.rnnt_loss(x, t32, il32, tl32, blank=0, reduction="none").sum().backward()

    def k2(dtype):
        rng = _rng()
        am = tensor(rng.standard_normal((2, 6, 5)), dtype)
        lm = tensor(rng.standard_normal((2, 4, 5)), dtype)
        boundary = torch.tensor([[0, 0, 3, 6], [0, 0, 2, 5]])
        simple, (px_grad, py_grad) = dt.rnnt_loss_simple(
            lm, am, tg, termination_symbol=0, boundary=boundary, reduction="sum",
            return_grad=True)
        ranges = dt.get_rnnt_prune_ranges(px_grad, py_grad, boundary, 2)
        am_p, lm_p = dt.do_rnnt_pruning(am, lm, ranges)
        pruned = dt.rnnt_loss_pruned(am_p + lm_p, tg, ranges, 0, boundary, reduction="sum")
        smoothed = dt.rnnt_loss_smoothed(lm, am, tg, termination_symbol=0, lm_only_scale=0.25,
                                         am_only_scale=0.0, boundary=boundary)
        (simple + pruned + smoothed).backward()

    def tdt(dtype):
        rng = _rng()
        t32 = tg.to(torch.int32)
        il32, tl32 = torch.tensor([6, 5], dtype=torch.int32), tl.to(torch.int32)
        x = tensor(rng.standard_normal((2, 6, 4, 5 + 3)), dtype)
        dt.tdt_loss(x, t32, il32, tl32, blank=0, durations=[0, 1, 2]).backward()
        x = tensor(rng.standard_normal((2, 6, 4, 5 + 2)), dtype)
        mb = torch.tensor([[1, 2, 3], [3, 2, 1]], dtype=torch.int32)  # big blanks: 4, 5
        dt.multiblank_rnnt_loss(x, mb, il32, tl32, blank=6, big_blank_durations=[2, 3]
                                ).backward()

    def align(dtype):
        rng = _rng()
        lp = tensor(np.log(_softmax(rng.standard_normal((12, 2, 6)))), dtype, grad=False)
        tr = tensor(rng.standard_normal((6, 6)), dtype, grad=False)
        dt.ctc_align(lp, tg, il, tl)
        dt.asg_align(lp, tr, tg, il, tl)
        dt.asg_viterbi(lp, tr, il)
        from duoloss.graphs import ctc_graph

        dt.graph_align(lp, ctc_graph([[1, 2, 3], [4, 2]]), [12, 10])
        x = tensor(rng.standard_normal((2, 6, 4, 6)), dtype, grad=False)
        dt.rnnt_align(x, tg.to(torch.int32), torch.tensor([6, 5], dtype=torch.int32),
                      tl.to(torch.int32), blank=0)

    def decode(dtype):
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            em, lengths, options, graph = _decode_inputs(folder)
            x = torch.tensor(em, dtype=getattr(torch, dtype))
            for kw in options:
                dt.ctc_decoder(_DECODE_TOKENS, **kw)(x, torch.tensor(lengths))
            dt.graph_decode(x, graph, lengths=torch.tensor(lengths))

    return [locals()[family]]


# ------------------------------------------------------------------------------- jax
def _jax_calls(family: str) -> List[Callable[[str], None]]:
    import jax
    import jax.numpy as jnp

    import duoloss.jax as dj

    tg = np.array([[1, 2, 3], [4, 2, 1]])
    il, tl = np.array([12, 10]), np.array([3, 2])

    def run(f, *args):
        jax.block_until_ready(jax.value_and_grad(f)(*args))

    def ctc(dtype):
        lp = jnp.asarray(np.log(_softmax(_rng().standard_normal((12, 2, 6)))), dtype)
        run(lambda x: dj.ctc_loss(x, tg, il, tl), lp)
        # optax's API: log_softmax on the host beside the kernel (duoloss.core.losses.ctc_logits)
        lpad = np.zeros((2, 12), np.float32)
        labpad = (np.arange(3)[None] >= tl[:, None]).astype(np.float32)
        run(lambda x: dj.optax_ctc_loss(x, lpad, tg, labpad).sum(), lp.transpose(1, 0, 2))

    def asg(dtype):
        x = jnp.asarray(_rng().standard_normal((12, 2, 6)), dtype)
        tr = jnp.zeros((6, 6), dtype)
        run(lambda x, tr: dj.asg_loss(x, tr, tg, il, tl), x, tr)

    def graph(dtype):
        from duoloss.graphs import ctc_graph

        lp = jnp.asarray(np.log(_softmax(_rng().standard_normal((12, 2, 5)))), dtype)
        graphs = ctc_graph([[1, 2, 2], [3, 4]])
        run(lambda x: dj.graph_loss(x, graphs, [12, 10]), lp)

    def rnnt(dtype):
        x = jnp.asarray(_rng().standard_normal((2, 6, 4, 5)), dtype)
        t32 = tg.astype(np.int32)
        il32, tl32 = np.array([6, 5], np.int32), tl.astype(np.int32)
        run(lambda x: dj.rnnt_loss(x, t32, il32, tl32, blank=0), x)

    def k2(dtype):
        rng = _rng()
        am = jnp.asarray(rng.standard_normal((2, 6, 5)), dtype)
        lm = jnp.asarray(rng.standard_normal((2, 4, 5)), dtype)
        boundary = jnp.asarray([[0, 0, 3, 6], [0, 0, 2, 5]])
        run(lambda lm, am: dj.rnnt_loss_simple(lm, am, tg, termination_symbol=0,
                                               boundary=boundary, reduction="sum"), lm, am)

    def tdt(dtype):
        rng = _rng()
        t32 = tg.astype(np.int32)
        il32, tl32 = np.array([6, 5], np.int32), tl.astype(np.int32)
        x = jnp.asarray(rng.standard_normal((2, 6, 4, 5 + 3)), dtype)
        run(lambda x: dj.tdt_loss(x, t32, il32, tl32, blank=0, durations=[0, 1, 2]), x)
        x = jnp.asarray(rng.standard_normal((2, 6, 4, 5 + 2)), dtype)
        mb = np.array([[1, 2, 3], [3, 2, 1]], np.int32)  # big blanks: 4, 5
        run(lambda x: dj.multiblank_rnnt_loss(x, mb, il32, tl32, blank=6,
                                              big_blank_durations=[2, 3]), x)

    def align(dtype):
        lp = jnp.asarray(np.log(_softmax(_rng().standard_normal((12, 2, 6)))), dtype)
        jax.block_until_ready(dj.ctc_align(lp, tg, il, tl))

    def decode(dtype):
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            em, lengths, options, graph = _decode_inputs(folder)
            x, ln = jnp.asarray(em, dtype), jnp.asarray(lengths)
            for kw in options:
                decoder = dj.ctc_decoder(_DECODE_TOKENS, **kw)
                decoder(x, ln)
                jax.block_until_ready(jax.jit(decoder.padded)(x, ln))  # the host callback
            dj.graph_decode(x, graph, lengths=ln)

    return [locals()[family]]


# ------------------------------------------------------------------------------ core
def _core_calls(family: str) -> List[Callable[[str], None]]:
    from duoloss import core

    tg = np.array([[1, 2, 3], [4, 2, 1]])
    il, tl = np.array([12, 10]), np.array([3, 2])

    def lp(dtype, c=6):
        return np.log(_softmax(_rng().standard_normal((12, 2, c)))).astype(dtype)

    def ctc(dtype):
        core.ctc_loss_and_grad(lp(dtype), tg, il, tl)

    def asg(dtype):
        core.asg_loss_and_grad(lp(dtype), np.zeros((6, 6), dtype), tg, il, tl)

    def graph(dtype):
        from duoloss.graphs import ctc_graph

        core.graph_loss_and_grad(lp(dtype, 5), ctc_graph([[1, 2, 2], [3, 4]]), [12, 10])

    def align(dtype):
        core.ctc_align(lp(dtype), tg, il, tl)

    def decode(dtype):
        import tempfile

        from duoloss.core.decoding import build_decoder
        from duoloss.core.decoding.wfst import graph_decode

        with tempfile.TemporaryDirectory() as folder:
            em, lengths, options, graph = _decode_inputs(folder)
            for kw in options:
                build_decoder(_DECODE_TOKENS, **kw).decode(em.astype(dtype), lengths)
            graph_decode(em.astype(dtype), graph, lengths=lengths)

    calls = {"ctc": ctc, "asg": asg, "graph": graph, "align": align, "decode": decode}
    return [calls[family]] if family in calls else []


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _installed(name: str) -> bool:
    # (find_spec, not an import: the parent of the workers never needs torch or JAX)
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _jax_x64(enable: bool):
    import jax

    old = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", enable)
    return old


def _run_family(family: str, frontends: Sequence[str]) -> None:
    for frontend in frontends:
        calls = {"torch": _torch_calls, "jax": _jax_calls, "core": _core_calls}[frontend](family)
        for dtype in _DTYPES:
            old = _jax_x64(dtype == "float64") if frontend == "jax" else None
            try:
                for call in calls:
                    call(dtype)
            finally:
                if old is not None:
                    _jax_x64(old)


def _families(families):
    if families is None:
        return list(FAMILIES)
    if isinstance(families, str):
        families = [f for f in families.split(",") if f]
    chosen = [str(f).strip() for f in families]
    unknown = [f for f in chosen if f not in FAMILIES]
    if unknown:
        raise ValueError(f"warmup: argument 'families' must name families from "
                         f"{list(FAMILIES)}, got unknown {unknown}")
    return [f for f in FAMILIES if f in chosen]


def _shares(chosen, jobs):
    """The families split into ``jobs`` lists of about equal cost (longest first, each to
    the least loaded list).  A worker compiles its list in the order of
    ``_numba_setup.FAMILIES`` (its ``--families`` argument is normalised), which
    changes no worker's total."""
    shares = [[] for _ in range(jobs)]
    load = [0.0] * jobs
    for family in sorted(chosen, key=lambda f: -_COST[f]):
        i = load.index(min(load))
        shares[i].append(family)
        load[i] += _COST[family]
    return [share for share in shares if share]


def _in_workers(chosen, jobs, report):
    """The families split over ``jobs`` worker processes (``python -m duoloss warmup
    --jobs 1``; numba compiles on one thread, so on several cores families compile side
    by side).  One process per worker, not per family: each pays the imports of torch
    and JAX once.  Each family is reported as its worker finishes it."""
    import os
    import re
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    import numba

    env = dict(os.environ)
    if numba.config.CACHE_DIR:  # the folder this process settled on, also for the workers
        env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
    done = re.compile(r"^\s+(\w+)\s+([0-9.]+) s$")

    def worker(share):
        proc = subprocess.Popen([sys.executable, "-m", "duoloss", "warmup", "--jobs", "1",
                                 "--families", ",".join(share)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        lines = []
        for line in proc.stderr:
            lines.append(line)
            m = done.match(line.rstrip("\n"))
            if m and m.group(1) in share:
                report(m.group(1), float(m.group(2)))
        if proc.wait():
            raise RuntimeError(f"warmup: compiling families {share} failed:\n"
                               f"{''.join(lines)[-3000:]}")

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(worker, _shares(chosen, jobs)))


#: Seconds each family's warm-up took in its own process on a quiet 2-core machine
#: (imports included), to share the families out evenly between workers.
_COST = {"rnnt": 33, "decode": 20, "graph": 18, "asg": 16, "align": 14, "ctc": 9, "tdt": 8, "k2": 5}


def warmup(families: Optional[Iterable[str]] = None, *, verbose: bool = True,
           jobs: Optional[int] = None) -> Dict[str, float]:
    """Compile and cache duoloss's kernels now, instead of at the first call of each loss.

    numba compiles each kernel the first time a process uses it (seconds per loss
    family, up to about a minute on a busy 2-core machine) and keeps the result in its
    disk cache (see ``NUMBA_CACHE_DIR``), where every later process finds it.  Run this
    once where the cache will live -- a Docker image build
    (``RUN python -m duoloss warmup``), the first step of a cluster job -- and the first
    calls of later processes start in well under a second.

    Each family runs a few tiny calls through every installed frontend (``duoloss.torch``,
    ``duoloss.jax``; the numpy core when neither is installed) in float32 and float64,
    forward and backward, plus the kernels a call compiles only when it needs them
    (exact log-space fallbacks, bounded-memory aligners): the kernels and signatures
    that real calls use.  Families already cached load in a
    fraction of a second.

    Args:
      families: which to compile, from ``"ctc"``, ``"asg"``, ``"graph"`` (WFST losses,
        scores, compose), ``"rnnt"`` (transducer and joiner), ``"k2"`` (simple and pruned
        RNN-T), ``"tdt"`` (TDT and multi-blank RNN-T), ``"align"`` (aligners), ``"decode"``
        (the CTC beam search of ``ctc_decoder`` and ``graph_decode``'s WFST search);
        ``None`` (default) for all of them.
      verbose: print one line per family (its name and seconds) to stderr.
      jobs: how many families compile at once, each in its own worker process (numba
        compiles on one thread); default: the number of CPUs this process may use, at
        most the number of families.  ``1`` compiles in this process.

    Returns:
      ``{family: seconds}`` (wall-clock seconds each family took), in the order of
      ``FAMILIES``.

    Raises:
      ValueError: an unknown family name.

    Examples:
      ```python
      import duoloss

      seconds = duoloss.warmup(["ctc"], verbose=False)  # later ctc_loss calls start warm
      assert list(seconds) == ["ctc"]
      ```
    """
    chosen = _families(families)
    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"warmup: argument 'jobs' must be a positive integer or None, "
                         f"got {jobs!r}")
    jobs = min(jobs, len(chosen))
    frontends = [f for f in ("torch", "jax") if _installed(f)] or ["core"]

    from duoloss.core import _numba_setup, _numerics

    if verbose:
        print(f"duoloss warmup: compiling {', '.join(chosen)} through "
              f"{' and '.join(frontends)} into {_numba_setup.cache_location()}"
              + (f", {jobs} at a time" if jobs > 1 else ""), file=sys.stderr, flush=True)
    seconds = {}

    def report(family, sec):
        seconds[family] = sec
        if verbose:
            print(f"  {family:<6} {sec:6.1f} s", file=sys.stderr, flush=True)

    total = time.perf_counter()
    if jobs > 1:
        _in_workers(chosen, jobs, report)
    else:
        _numba_setup._quiet_depth += 1
        _numerics._compile_both = True
        try:
            for family in chosen:
                t0 = time.perf_counter()
                _run_family(family, frontends)
                report(family, time.perf_counter() - t0)
        finally:
            _numerics._compile_both = False
            _numba_setup._quiet_depth -= 1
    if verbose:
        print(f"duoloss warmup: done in {time.perf_counter() - total:.1f} s",
              file=sys.stderr, flush=True)
    return {f: seconds[f] for f in chosen}
