import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: GTN golden fixtures live next to the repository (../shared/fixtures/gtn).
GTN_FIXTURES = ROOT.parent / "shared" / "fixtures" / "gtn" / "public"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
