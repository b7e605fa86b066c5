"""Labels anywhere in ``[-1, 2**63 - 1]`` (issue #10 point 7).

Before the fix, ``intersect``/``compose`` sized a (node, label) lookup table as
``num_nodes * (max label + 1)`` in int64: with ``2**62 - 1`` (or ``2**54`` and
1,024 nodes) the product wrapped to 0 and the kernel indexed past the table
(segfault); with ``2**63 - 1`` the ``+ 1`` wrapped and results were wrong.
The crashing reproducers run in a subprocess so that a segfault fails the test
instead of killing pytest.
"""
import io
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import duoloss.gtn as gtn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A chain of n nodes whose arc i has label `big` (i even) or 0 (i odd) and a
# weight; intersecting or composing it with itself has exactly one path, so
# the analytic result is the chain with doubled weights and score 2 * sum(w).
_CHAIN_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import duoloss.gtn as gtn
    big, n = int(sys.argv[1]), int(sys.argv[2])
    w = np.linspace(-1.0, 1.0, n - 1).astype(np.float32)
    labels = [big if i % 2 == 0 else 0 for i in range(n - 1)]
    g = gtn.Graph.from_arrays(n, np.arange(n - 1), np.arange(1, n), labels,
                              weight=w, start=[0], accept=[n - 1])
    for op in (gtn.intersect, gtn.compose):
        r = op(g, g)
        assert r.num_nodes() == n and r.num_arcs() == n - 1, (r.num_nodes(), r.num_arcs())
        assert r.labels_to_list() == labels and r.labels_to_list(False) == labels
        np.testing.assert_array_equal(r.weights_to_numpy(), 2 * w)
        s = gtn.forward_score(r).item()
        assert abs(s - 2 * float(w.astype(np.float64).sum())) < 1e-5, s
    print("OK")
""")


def _run_chain(big: int, n: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", _CHAIN_SCRIPT, str(big), str(n)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


@pytest.mark.parametrize("big, n", [
    (2 ** 62 - 1, 4),      # n * (big + 1) wraps to 0: segfault before the fix
    (2 ** 63 - 1, 4),      # big + 1 wraps negative: empty result before the fix
    (2 ** 54, 1024),       # 1024 * 2**54 == 2**64 wraps to 0: segfault before
    (5, 4),                # control: the dense (node, label) table path
])
def test_intersect_and_compose_with_huge_labels(big, n):
    r = _run_chain(big, n)
    assert r.returncode == 0 and r.stdout.strip() == "OK", (r.returncode, r.stdout, r.stderr[-2000:])


_RENAME_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import duoloss.gtn as gtn
    big = int(sys.argv[1])

    def random_transducer(rng, n, m, labels):
        return gtn.Graph.from_arrays(
            n, rng.integers(0, n, m), rng.integers(0, n, m), rng.choice(labels, m),
            rng.choice(labels, m), rng.standard_normal(m).astype(np.float32),
            [0, 1], [n - 2, n - 1])

    def rename(g):
        n, src, dst, il, ol, w, st, ac = gtn.graph_arrays(g)
        f = lambda x: np.where(x == 3, big, x)
        return gtn.Graph.from_arrays(n, src, dst, f(il), f(ol), w, st, ac)

    for seed in range(6):
        rng = np.random.default_rng(seed)
        small = [-1, 0, 1, 2, 3] if seed % 2 else [0, 1, 2, 3]
        g1 = random_transducer(rng, 7, 25, small)
        g2 = random_transducer(rng, 6, 20, small)
        for op in (gtn.compose, gtn.intersect):
            want = rename(op(g1, g2))
            got = op(rename(g1), rename(g2))
            assert got.num_arcs() > 0
            # same arrays in the same order (stricter than gtn.equal)
            for a, b in zip(gtn.graph_arrays(got), gtn.graph_arrays(want)):
                np.testing.assert_array_equal(a, b)
    print("OK")
""")


@pytest.mark.parametrize("big", [2 ** 31, 2 ** 62 - 1, 2 ** 63 - 1])
def test_huge_label_is_just_a_name(big):
    """Renaming label 3 to ``big`` (order kept: both are the largest label) must
    rename it in the output and change nothing else: same states, arcs, order
    and weights, with epsilons on one, both or neither side.  Small labels use
    the (node, label) tables, huge ones the label-sorted merge."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _RENAME_SCRIPT, str(big)], capture_output=True,
                       text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "OK", (r.returncode, r.stdout, r.stderr[-2000:])


def test_labels_outside_the_range_raise_value_error():
    g = gtn.Graph()
    g.add_node(True)
    g.add_node(False, True)
    for bad in (2 ** 63, 2 ** 64 + 5, -2):
        with pytest.raises(ValueError, match=r"Graph\.add_arc: labels must lie in \[-1, 2\*\*63 - 1\]"):
            g.add_arc(0, 1, bad)
        with pytest.raises(ValueError, match=r"Graph\.add_arc: labels must lie in .*olabel="):
            g.add_arc(0, 1, 0, bad)
    assert g.num_arcs() == 0
    g.add_arc(0, 1, gtn.max_label)  # the largest label is fine
    assert g.labels_to_list() == [2 ** 63 - 1]
    # from_arrays: uint64 values above int64 and Python ints beyond int64 would wrap
    with pytest.raises(ValueError, match="Graph.from_arrays: ilabel must fit int64"):
        gtn.Graph.from_arrays(2, [0], [1], np.array([2 ** 63], np.uint64))
    with pytest.raises(ValueError, match="Graph.from_arrays: olabel must fit int64"):
        gtn.Graph.from_arrays(2, [0], [1], [0], [2 ** 64])
    with pytest.raises(ValueError, match=r"loadtxt: line 3: labels must lie in \[-1, 2\*\*63 - 1\]"):
        gtn.loadtxt(io.StringIO(f"0\n1\n0 1 {2 ** 63} 0 0.0\n"))
    with pytest.raises(ValueError, match=r"remove: labels must lie in \[-1, 2\*\*63 - 1\]"):
        gtn.remove(g, 2 ** 63)


def test_text_format_keeps_huge_labels_and_binary_format_refuses_them():
    g = gtn.Graph()
    g.add_node(True)
    g.add_node(False, True)
    g.add_arc(0, 1, 2 ** 63 - 1, 2 ** 40, 0.5)
    buf = io.StringIO()
    gtn.savetxt(buf, g)
    assert buf.getvalue() == f"0\n1\n0 1 {2 ** 63 - 1} {2 ** 40} 0.5\n"
    assert gtn.equal(gtn.loadtxt(io.StringIO(buf.getvalue())), g)
    # GTN's binary format stores int32
    with pytest.raises(ValueError, match=r"save: labels must lie in \[-1, 2\*\*31 - 1\]"):
        gtn.save(io.BytesIO(), g)
