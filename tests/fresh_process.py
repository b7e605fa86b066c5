"""Run a snippet in a new interpreter with an empty numba cache (what a user's first
process sees), for tests of what a call compiles."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap


def run_with_empty_cache(code: str, timeout: float = 900) -> str:
    """Run ``code`` (dedented) in a fresh interpreter with an empty ``NUMBA_CACHE_DIR``;
    return its stdout, or fail with its stderr's tail if it exits with an error."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, DUOLOSS_QUIET_COMPILE="1")
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                             capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
