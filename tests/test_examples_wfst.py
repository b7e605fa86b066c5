"""The WFST examples run end to end (CI-sized) and their loss goes down.

``examples/mmi_train.py`` trains an LF-MMI model in PyTorch and JAX (shared,
packed denominator with epsilon back-off arcs); ``examples/wordpiece_train.py``
marginalises over every word-piece decomposition.  Each exits non-zero when its
loss did not fall.
"""
from __future__ import annotations

from test_examples import run


def test_mmi_example_trains_in_both_frameworks():
    out = run("mmi_train.py", "--steps", "30", env={"JAX_PLATFORMS": "cpu"})
    assert "torch: LF-MMI mean loss first 5 steps" in out and "jax: LF-MMI" in out, out


def test_wordpiece_example_trains():
    out = run("wordpiece_train.py", "--steps", "30")
    assert "word pieces: mean loss first 5 steps" in out, out
