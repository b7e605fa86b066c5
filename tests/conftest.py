import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: GTN golden fixtures (GTN's outputs), vendored in tests/data/gtn (see PROVENANCE.md there).
GTN_FIXTURES = Path(os.environ.get("DUOLOSS_GTN_FIXTURES") or ROOT / "tests" / "data" / "gtn") / "public"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _no_leaked_jax_x64():
    """Fail the test that leaves ``jax_enable_x64`` changed: later tests assume their own mode."""
    jax = sys.modules.get("jax")
    before = jax.config.jax_enable_x64 if jax is not None else None
    yield
    jax = sys.modules.get("jax")
    if jax is not None and before is not None and jax.config.jax_enable_x64 != before:
        jax.config.update("jax_enable_x64", before)
        pytest.fail("test left jax_enable_x64 changed (restore it, e.g. with a fixture)")
    default_on = os.environ.get("JAX_ENABLE_X64", "").lower() in ("1", "true", "yes", "on")
    if jax is not None and before is None and jax.config.jax_enable_x64 != default_on:
        jax.config.update("jax_enable_x64", default_on)
        pytest.fail("test left jax_enable_x64 changed (restore it, e.g. with a fixture)")
