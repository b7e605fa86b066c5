"""JAX on 4 host devices: shard_map, pmap, data-parallel training, device placement.

``XLA_FLAGS=--xla_force_host_platform_device_count=4`` must be set before JAX
is imported, so the one test collected in a normal run re-runs this module in
a fresh interpreter with the flag (and ``DUOLOSS_JAX_MULTIDEVICE=1``), under a
timeout; there the real tests below run.  References are single-device runs
of the same functions on the full batch.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

CHILD = os.environ.get("DUOLOSS_JAX_MULTIDEVICE") == "1"
ROOT = Path(__file__).resolve().parents[1]

if not CHILD:
    def test_multidevice_suite_in_a_subprocess():
        env = dict(os.environ, DUOLOSS_JAX_MULTIDEVICE="1", JAX_PLATFORMS="cpu",
                   XLA_FLAGS="--xla_force_host_platform_device_count=4")
        cmd = [sys.executable, "-m", "pytest", str(Path(__file__)), "-q", "-x",
               "-p", "no:cacheprovider"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        out = proc.stdout[-6000:] + proc.stderr[-3000:]
        assert proc.returncode == 0, out
        assert " passed" in proc.stdout and "skipped" not in proc.stdout, out

else:
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import duoloss.jax as dj
    from test_jax_transforms import make_cases

    NDEV = 4
    assert len(jax.devices()) == NDEV, jax.devices()
    NB = 8  # global batch: 2 sequences per device
    CASES = make_cases(seed=3, n=NB, graphs_per_shard=NB // NDEV)
    IDS = [c.name for c in CASES]

    def explicit_mesh():
        return jax.make_mesh((NDEV,), ("d",), axis_types=(AxisType.Explicit,))

    def auto_mesh():
        return jax.make_mesh((NDEV,), ("d",), axis_types=(AxisType.Auto,))

    def specs(case):
        floats = tuple(P() if sh else P(None, "d") for sh in case.shared)
        return floats + (P("d"),) * len(case.ints)

    def arrays(case):
        return (tuple(jnp.asarray(a, jnp.float32) for a in case.args)
                + tuple(jnp.asarray(i) for i in case.ints))

    def close(a, b, rtol=2e-6, atol=2e-6):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)

    @pytest.mark.parametrize("mesh_kind", ["explicit", "auto"])
    @pytest.mark.parametrize("case", CASES, ids=IDS)
    def test_shard_map_losses_and_grads_equal_single_device(case, mesh_kind):
        """Default check_vma=True: per-shard losses equal the single-device ones; the
        per-sequence gradients too, and a replicated input's gradient is the psum."""
        nf = len(case.args)
        args = arrays(case)
        argnums = tuple(range(nf))

        def losses(*a):
            return case.call_ints(*a, reduction="none")

        def grads(*a):
            return jax.grad(lambda *f: losses(*f, *a[nf:]).sum(), argnums=argnums)(*a[:nf])

        ref_losses = losses(*args)
        ref_grads = grads(*args)
        mesh = explicit_mesh() if mesh_kind == "explicit" else auto_mesh()
        in_specs = specs(case)
        if mesh_kind == "explicit":  # explicit meshes want the inputs laid out as declared
            args = tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(args, in_specs))
        sm = jax.jit(jax.shard_map(losses, mesh=mesh, in_specs=in_specs, out_specs=P("d")))
        close(sm(*args), ref_losses)
        sg = jax.jit(jax.shard_map(grads, mesh=mesh, in_specs=in_specs,
                                   out_specs=in_specs[:nf]))
        for g, r in zip(sg(*args), ref_grads):
            close(g, r, 2e-5, 2e-6)
            assert float(jnp.abs(r).max()) > 0

    @pytest.mark.parametrize("case", CASES, ids=IDS)
    def test_plain_jit_on_an_explicitly_sharded_batch(case):
        """No shard_map in user code: explicit mesh types (jax.make_mesh's default) work,
        with one callback per shard; gradients come back sharded like their inputs."""
        nf = len(case.args)
        args = arrays(case)
        mesh = explicit_mesh()
        f = jax.value_and_grad(lambda *a: case.call_ints(*a, reduction="sum"),
                               argnums=tuple(range(nf)))
        rv, rg = f(*args)
        sharded = tuple(jax.device_put(a, NamedSharding(mesh, s))
                        for a, s in zip(args, specs(case)))
        import dataclasses
        import importlib
        mod = importlib.import_module(case.module)
        kernel = getattr(mod, case.kernel_attr)
        sizes = []

        def run(arrs, want, **static):  # record each host call's batch size
            sizes.append(int(arrs[0].shape[kernel.batch_axes[0]]))
            return kernel.run(arrs, want, **static)
        mp = pytest.MonkeyPatch()
        mp.setattr(mod, case.kernel_attr, dataclasses.replace(kernel, run=run))
        try:
            v, g = jax.jit(f)(*sharded)
            jax.block_until_ready((v, g))
        finally:
            mp.undo()
        assert sizes == [NB // NDEV] * NDEV  # one callback per shard, on its own shard
        close(v, rv, 1e-5, 1e-5)
        for x, gx, r in zip(sharded, g, rg):
            close(gx, r, 2e-5, 2e-6)
            assert gx.sharding.is_equivalent_to(x.sharding, gx.ndim)

    def test_plain_jit_sharded_along_time_gathers_and_matches():
        """Sharding that is not along the batch: gathered before the loss, same numbers."""
        case = CASES[0]
        args = arrays(case)
        mesh = explicit_mesh()
        f = jax.value_and_grad(lambda *a: case.call_ints(*a, reduction="sum"))
        x8, tg, il, tl = args[0][:8], args[1], jnp.minimum(args[2], 8), args[3]  # T % 4 == 0
        rv, rg = f(x8, tg, il, tl)
        x = jax.device_put(x8, NamedSharding(mesh, P("d", None, None)))
        v, g = jax.jit(f)(x, tg, il, tl)
        close(v, rv, 1e-5, 1e-5)
        close(g, rg, 2e-5, 2e-6)
        assert g.sharding.is_equivalent_to(x.sharding, g.ndim)

    @pytest.mark.parametrize("case", CASES, ids=IDS)
    def test_pmap_equals_single_device(case):
        nf = len(case.args)
        args = arrays(case)

        def per_device(a, batch_axis):
            return jnp.moveaxis(a.reshape(a.shape[:batch_axis] + (NDEV, -1)
                                          + a.shape[batch_axis + 1:]), batch_axis, 0)

        in_axes = tuple(None if sh else 0 for sh in case.shared) + (0,) * len(case.ints)
        pargs = tuple(a if ax is None else per_device(a, 1 if i < nf else 0)
                      for i, (a, ax) in enumerate(zip(args, in_axes)))
        vg = jax.pmap(jax.value_and_grad(lambda *a: case.call_ints(*a, reduction="sum"),
                                         argnums=tuple(range(nf))), in_axes=in_axes)
        values, grads = vg(*pargs)
        for d in range(NDEV):  # each device against the single-device run on its slice
            local = tuple(a if ax is None else a[d] for a, ax in zip(pargs, in_axes))
            rv, rg = jax.value_and_grad(lambda *a: case.call_ints(*a, reduction="sum"),
                                        argnums=tuple(range(nf)))(*local)
            close(values[d], rv)
            for g, r in zip(grads, rg):
                close(g[d], r, 2e-5, 2e-6)
        assert values.devices() == set(jax.devices())

    @pytest.mark.parametrize("case", CASES, ids=IDS)
    def test_outputs_come_back_on_the_input_device(case):
        dev = jax.devices()[2]
        nf = len(case.args)
        args = tuple(jax.device_put(a, dev) for a in arrays(case))
        f = jax.value_and_grad(lambda *a: case.call_ints(*a, reduction="sum"),
                               argnums=tuple(range(nf)))
        for fn in (f, jax.jit(f)):
            v, g = fn(*args)
            assert v.devices() == {dev}
            assert all(x.devices() == {dev} for x in g)

    # -- a data-parallel training step ------------------------------------------------

    FEAT, NCLS = 6, 5

    def _train_data():
        rng = np.random.default_rng(7)
        case = CASES[0]
        tg, il, tl = case.ints
        x = rng.standard_normal((case.args[0].shape[0], NB, FEAT)).astype(np.float32)
        params = {"w": jnp.asarray(rng.standard_normal((FEAT, NCLS)) * 0.3, jnp.float32),
                  "b": jnp.zeros(NCLS, jnp.float32)}
        return params, (jnp.asarray(x), jnp.asarray(tg), jnp.asarray(il), jnp.asarray(tl))

    def _loss_sum(params, x, tg, il, tl):
        logits = x @ params["w"] + params["b"]
        return dj.ctc_loss(jax.nn.log_softmax(logits), tg, il, tl, reduction="sum")

    OPT = optax.adam(0.05)

    def _apply(params, opt_state, grads):
        updates, opt_state = OPT.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def _reference_steps(params, batch, steps):
        opt_state = OPT.init(params)

        @jax.jit
        def step(params, opt_state, batch):
            loss, grads = jax.value_and_grad(lambda p: _loss_sum(p, *batch) / NB)(params)
            return (*_apply(params, opt_state, grads), loss)
        losses = []
        for _ in range(steps):
            params, opt_state, loss = step(params, opt_state, batch)
            losses.append(float(loss))
        return params, losses

    def test_data_parallel_step_shard_map_equals_single_device():
        """Batch split over 4 devices, per-shard gradients psum'd: same parameters."""
        params, batch = _train_data()
        ref, ref_losses = _reference_steps(params, batch, 3)
        mesh = explicit_mesh()
        bspecs = (P(None, "d"), P("d"), P("d"), P("d"))
        batch = tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(batch, bspecs))
        opt_state = OPT.init(params)

        def shard_grads(params, *b):
            loss, grads = jax.value_and_grad(lambda p: _loss_sum(p, *b))(params)
            return jax.lax.psum(loss, "d") / NB, jax.tree.map(lambda g: g / NB, grads)

        @jax.jit
        def step(params, opt_state, batch):
            # params are replicated (invariant): their gradient comes back psum'd
            loss, grads = jax.shard_map(shard_grads, mesh=mesh, in_specs=(P(),) + bspecs,
                                        out_specs=(P(), P()))(params, *batch)
            return (*_apply(params, opt_state, grads), loss)

        losses = []
        for _ in range(3):
            params, opt_state, loss = step(params, opt_state, batch)
            losses.append(float(loss))
        close(losses, ref_losses, 1e-5, 1e-6)
        assert losses[-1] < losses[0]
        for k in ref:
            close(params[k], ref[k], 1e-5, 1e-6)

    def test_data_parallel_step_jit_with_sharded_batch_equals_single_device():
        """Plain jit on a batch sharded over 4 devices (auto mesh, replicated params)."""
        params, batch = _train_data()
        ref, ref_losses = _reference_steps(params, batch, 2)
        mesh = auto_mesh()
        bspecs = (P(None, "d"), P("d"), P("d"), P("d"))
        batch = tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(batch, bspecs))
        params = jax.device_put(params, NamedSharding(mesh, P()))
        got, losses = _reference_steps(params, batch, 2)
        close(losses, ref_losses, 1e-5, 1e-6)
        for k in ref:
            close(got[k], ref[k], 1e-5, 1e-6)
