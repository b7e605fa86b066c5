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
