"""Where numba caches duoloss's compiled kernels, settled before any kernel is defined.

Every kernel is an ``@njit(cache=True)`` function, and numba picks the cache
location when the decorator runs, at import.  Its choices are ``NUMBA_CACHE_DIR``
(when set), the ``__pycache__`` folder next to the source, then a user-wide folder
(``$XDG_CACHE_HOME/numba`` or ``~/.cache/numba`` on Linux); when none is writable
(a read-only ``site-packages`` and no writable home, as in locked-down containers)
the decorator raises ``RuntimeError: cannot cache function ...: no locator
available``, and ``import duoloss.torch`` fails.

This module runs first in ``duoloss.core`` (whose ``__init__`` imports it before
any kernel module, and every ``duoloss.core._x`` import runs that ``__init__``
first).  It leaves numba alone when the user set a cache folder or one of numba's
own locations works.  Otherwise it sets ``numba.config.CACHE_DIR`` to a private
per-user folder in the temporary directory (``<tmp>/numba-cache-<uid>``, mode
0700, used only if this user owns it and nobody else can write to it; else a fresh
``mkdtemp`` folder).  ``numba.config.CACHE_DIR`` is process-wide: other numba code
in the process then caches there too.  If not even the temporary directory is
writable, duoloss's kernels are compiled without a disk cache (about 5–10 s per
kernel on first use in every process), with exactly one warning.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import stat
import tempfile
import time
import warnings

import numba
import numba.core.event

__all__ = []

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CORE_DIR = os.path.dirname(os.path.abspath(__file__))

#: Where duoloss's kernels are cached: "NUMBA_CACHE_DIR", "in-tree", "user-wide",
#: "temporary" or "none" (set at import; for tests and diagnostics).
cache_choice = None


def _writable(path):
    """numba's own test for a cache folder: create it, then a temporary file in it."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _numba_user_cache_dir():
    try:
        from numba.misc.appdirs import AppDirs
    except ImportError:  # pragma: no cover - numba moved it
        return os.path.join(os.environ.get("XDG_CACHE_HOME") or
                            os.path.expanduser("~/.cache"), "numba")
    return AppDirs(appname="numba", appauthor=False).user_cache_dir


def _private_dir(path):
    """Create ``path`` (0700) or accept it only if it is this user's and private."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & 0o022):
        # Someone else made it, or others may write to it: cache files are
        # pickles that numba loads, so do not trust them.
        return False
    return _writable(path)


def _temporary_cache_dir():
    """A private, writable folder under the temporary directory, or None."""
    try:
        base = tempfile.gettempdir()
    except OSError:  # no usable temporary directory at all
        return None
    user = str(os.getuid()) if hasattr(os, "getuid") else (
        os.environ.get("USERNAME") or os.environ.get("USER") or "user")
    shared = os.path.join(base, f"numba-cache-{user}")
    if _private_dir(shared):
        return shared
    try:
        fresh = tempfile.mkdtemp(prefix="numba-cache-")
    except OSError:
        return None
    return fresh if _writable(fresh) else None


def _disable_cache_for_duoloss():
    """Make ``cache=True`` a no-op for duoloss's own kernels (other code unchanged)."""
    from numba.core import caching as _caching
    from numba.core import dispatcher as _dispatcher

    original = _dispatcher.Dispatcher.enable_caching
    if getattr(original, "_duoloss_no_cache", False):
        return

    def enable_caching(self):
        module = getattr(self.py_func, "__module__", "") or ""
        if module == "duoloss" or module.startswith("duoloss."):
            self._cache = _caching.NullCache()
        else:
            original(self)

    enable_caching._duoloss_no_cache = True
    _dispatcher.Dispatcher.enable_caching = enable_caching


def _setup_cache():
    global cache_choice
    if numba.config.CACHE_DIR:
        cache_choice = "NUMBA_CACHE_DIR"
    elif _writable(os.path.join(_CORE_DIR, "__pycache__")):
        cache_choice = "in-tree"
    elif _writable(_numba_user_cache_dir()):
        cache_choice = "user-wide"
    else:
        folder = _temporary_cache_dir()
        if folder is not None:
            numba.config.CACHE_DIR = folder
            cache_choice = "temporary"
        else:
            _disable_cache_for_duoloss()
            cache_choice = "none"
            warnings.warn(
                "duoloss: no writable folder for numba's kernel cache (the package folder "
                f"{_PACKAGE_DIR!r}, the user cache folder and the temporary directory are "
                "all read-only): kernels compile on first use in every process. Set "
                "NUMBA_CACHE_DIR to a writable folder to keep compiled kernels.",
                RuntimeWarning, stacklevel=2)


_setup_cache()


# --------------------------------------------------------------------------------------
# The compile notice: one line the first time a kernel family compiles in a process.

#: Kernel module (below ``duoloss.core.``) -> family (as ``duoloss.warmup`` names them).
_FAMILY_OF_MODULE = {
    "losses.ctc": "ctc", "losses.ctc_logits": "ctc", "losses.asg": "asg",
    "losses.graph_loss": "graph",
    "graph.scores": "graph", "graph.compose": "graph", "graph.ops": "graph",
    "graph.graph": "graph", "graph.io": "graph", "graph.compare": "graph",
    "losses.transducer": "rnnt", "losses.joiner": "rnnt", "losses.tdt": "tdt",
    "losses.rnnt_k2": "k2", "losses.align": "align",
}

#: Kernel packages (below ``duoloss.core.``) whose every module is one family.
_FAMILY_OF_PACKAGE = {"decoding": "decode"}

#: family -> (what it is, rough seconds of its first call with an empty cache on a
#: 2-core machine, measured by benchmarks/cold_start.py; a busy machine takes longer).
#: "decode": the first ``ctc_decoder`` call, 15 CPU s (2026-11-27, docs/warmup.md); the
#: first ``graph_decode`` call compiles less (5.5 CPU s).  "ctc": 4.1 CPU s, "rnnt": 8.0,
#: "asg": 6.5 (2026-11-28 11:20 UTC, idle machine; docs/speed.md).
FAMILIES = {
    "ctc": ("CTC", 4), "asg": ("ASG", 6), "graph": ("WFST graph", 11),
    "rnnt": ("RNN-T", 8), "k2": ("k2 RNN-T", 3), "tdt": ("TDT/multi-blank RNN-T", 8),
    "align": ("alignment", 3), "decode": ("CTC beam search and WFST decoding", 15),
    "core": ("shared", 2),
}

_logger = logging.getLogger("duoloss")
_noticed = set()      # families already announced in this process
_quiet_depth = 0      # > 0 while duoloss.warmup prints its own progress


def cache_location():
    """Where numba keeps duoloss's compiled kernels (a folder, or a sentence)."""
    if cache_choice == "none":
        return "nowhere (no writable folder: kernels compile in every process)"
    if numba.config.CACHE_DIR:
        return os.path.abspath(numba.config.CACHE_DIR)
    if cache_choice == "in-tree":
        return f"the __pycache__ folders under {_PACKAGE_DIR}"
    return _numba_user_cache_dir()


def _family(dispatcher):
    module = getattr(getattr(dispatcher, "py_func", None), "__module__", "") or ""
    if not module.startswith("duoloss."):
        return None
    name = module[len("duoloss.core."):]
    if name in _FAMILY_OF_MODULE:
        return _FAMILY_OF_MODULE[name]
    return _FAMILY_OF_PACKAGE.get(name.split(".", 1)[0], "core")


def _quiet():
    return _quiet_depth > 0 or os.environ.get("DUOLOSS_QUIET_COMPILE", "") not in ("", "0")


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic garbage collector off for the block, then on again; a collector
    that was already off is left alone.  For a process's first call of a kernel, when
    numba loads it from its cache or compiles it (see `_CompileNotice`)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _CompileNotice(numba.core.event.Listener):
    """Announces the first compile (a numba cache miss) of each family, once per process,
    and pauses Python's cyclic garbage collector while a duoloss kernel compiles.

    Only an outermost compile counts: the helpers a kernel compiles on its way (in
    other modules) belong to the kernel's family.  A kernel loaded from the cache
    fires no event, so a warm cache prints nothing and changes nothing.

    The pause: numba's compiler allocates millions of short-lived objects, and with
    torch or JAX imported (about a million tracked objects) every full collection
    they trigger walks the whole heap: about a fifth of a cold first call.  The
    collector is switched off at the start of the outermost compile of a duoloss
    kernel, only if it was on, and switched on again when that compile ends, also on
    an error (numba sends the end event from a ``finally``); the compile's garbage
    (about 90 MB for RNN-T) goes at the first collection after it.  `gc_paused`
    does the same around a process's first call of each batch kernel
    (``_pool.run_batch``), which also covers numba's cache load and save.
    """

    def __init__(self):
        self._depth = 0
        self._started = None
        self._gc_pause = None   # the entered `gc_paused` of the outermost compile

    def on_start(self, event):
        self._depth += 1
        if self._depth != 1:
            return
        family = _family(event.data.get("dispatcher"))
        if family is None:
            return
        self._started = (family, time.perf_counter())
        self._gc_pause = gc_paused()
        self._gc_pause.__enter__()
        if family in _noticed:
            return
        _noticed.add(family)
        if _quiet():
            return
        what, seconds = FAMILIES[family]
        _logger.warning(
            "duoloss: compiling the %s kernels (first use with an empty numba cache: about "
            "%d s on 2 cores, more on a busy machine; once: cached in %s). Precompile with "
            "`python -m duoloss "
            "warmup`; silence with DUOLOSS_QUIET_COMPILE=1.", what, seconds,
            cache_location())

    def on_end(self, event):
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and self._gc_pause is not None:
            pause, self._gc_pause = self._gc_pause, None
            pause.__exit__(None, None, None)
        if self._depth == 0 and self._started is not None:
            family, t0 = self._started
            self._started = None
            _logger.debug("duoloss: compiled %s (%s kernels) in %.1f s",
                          getattr(event.data.get("dispatcher"), "__name__", "?"),
                          family, time.perf_counter() - t0)


numba.core.event.register("numba:compile", _CompileNotice())
