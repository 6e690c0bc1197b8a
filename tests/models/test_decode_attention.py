"""Decode-time attention over a shared prompt cache + per-slot response rings, against an explicit per-slot
softmax written with NumPy loops (not the module's own dense path), for both implementations and tile sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sera_jax.models import decode_attention as DA

S, P, T, R, M, G, D = 13, 4, 7, 5, 2, 2, 8


def explicit_attention(q, kv, start_P, ids_S, n_valid_S, newest_col, active_S):
    """Slot by slot, head by head: the visible columns listed explicitly, softmax in float64."""
    q, pk, pv, rk, rv = (np.asarray(x, np.float64) for x in (q, *kv))
    out = np.zeros(q.shape)
    for s in range(S):
        p = int(ids_S[s])
        cols_k, cols_v = [], []
        if active_S[s]:
            for t in range(int(start_P[p]), T):
                cols_k.append(pk[p, :, t, :])
                cols_v.append(pv[p, :, t, :])
        for age in range(int(n_valid_S[s])):
            j = (int(newest_col) - age) % R
            cols_k.append(rk[s, :, :, j])
            cols_v.append(rv[s, :, j, :])
        if not cols_k:
            continue
        k = np.stack(cols_k, 1)  # (M, C, D)
        v = np.stack(cols_v, 1)
        for h in range(M * G):
            m = h // G
            scores = k[m] @ q[s, h] / np.sqrt(D)
            w = np.exp(scores - scores.max())
            out[s, h] = (w / w.sum()) @ v[m]
    return out


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)

    def arr(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    kv = DA.SharedKV(arr(P, M, T, D), arr(P, M, T, D), arr(S, M, D, R), arr(S, M, R, D))
    return dict(q=arr(S, M * G, D), kv=kv, start=jnp.asarray([0, 3, 6, 2], jnp.int32),
                ids=jnp.asarray(rng.integers(0, P, S), jnp.int32),
                n_valid=jnp.asarray(rng.integers(0, R + 1, S), jnp.int32),
                active=jnp.asarray(rng.random(S) < 0.8).at[0].set(False))


@pytest.mark.parametrize("implementation", ["ragged", "batched", "dense"])
@pytest.mark.parametrize("tile", [1, 3, 4, 16])
@pytest.mark.parametrize("newest_col", [4, 1])  # 1: the newest columns wrap around the ring
def test_matches_explicit_softmax(problem, implementation, tile, newest_col):
    pr = problem
    expected = explicit_attention(pr["q"], pr["kv"], pr["start"], pr["ids"], pr["n_valid"], newest_col, pr["active"])
    out = DA.step_attention(pr["q"], pr["kv"], pr["start"], pr["ids"], pr["n_valid"], jnp.int32(newest_col),
                            pr["active"], num_prompts=P, tile=tile, implementation=implementation)
    np.testing.assert_allclose(np.asarray(out), expected, atol=1e-5)


def test_bfloat16_inputs(problem):
    pr = problem
    kv16 = DA.SharedKV(*(x.astype(jnp.bfloat16) for x in pr["kv"]))
    q16 = pr["q"].astype(jnp.bfloat16)
    expected = explicit_attention(q16.astype(jnp.float32), DA.SharedKV(*(x.astype(jnp.float32) for x in kv16)),
                                  pr["start"], pr["ids"], pr["n_valid"], 3, pr["active"])
    out = DA.step_attention(q16, kv16, pr["start"], pr["ids"], pr["n_valid"], jnp.int32(3), pr["active"],
                            num_prompts=P, tile=4, implementation="ragged")
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=3e-2)


def test_schedule_groups_active_rows_by_prompt(problem):
    pr = problem
    ids, active = np.asarray(pr["ids"]), np.asarray(pr["active"])
    for tile in (1, 3, 16):
        sch = DA.prompt_schedule(pr["ids"], pr["active"], P, tile)
        counts = np.bincount(ids[active], minlength=P)
        np.testing.assert_array_equal(sch.row_count_P, counts)
        assert int(sch.num_visits) == int(np.sum(-(-counts // tile)))
        assert int(sch.num_visits) <= DA.max_visits(S, P, tile)
        perm = np.asarray(sch.perm_S)
        n_active = int(active.sum())
        assert active[perm[:n_active]].all() and not active[perm[n_active:]].any()
        assert (np.diff(ids[perm[:n_active]]) >= 0).all()
        np.testing.assert_array_equal(np.asarray(sch.inv_perm_S)[perm], np.arange(S))


def test_write_response_writes_one_column():
    rk, rv = jnp.zeros((3, M, D, R)), jnp.zeros((3, M, R, D))
    k, v = jnp.ones((3, M, D)), 2 * jnp.ones((3, M, D))
    rk, rv = DA.write_response(rk, rv, k, v, jnp.int32(2))
    assert float(rk[:, :, :, 2].min()) == 1 and float(jnp.abs(rk).sum()) == 3 * M * D
    assert float(rv[:, :, 2].min()) == 2 and float(jnp.abs(rv).sum()) == 2 * 3 * M * D


def test_ring_valid():
    np.testing.assert_array_equal(DA.ring_valid(jnp.array([0, 2, 5]), jnp.int32(1), 5),
                                  [[0, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(DA.ring_valid(jnp.array([3]), jnp.int32(0), 5), [[1, 0, 0, 1, 1]])


def test_unknown_implementation_raises():
    with pytest.raises(ValueError, match="implementation"):
        DA.resolve_implementation("flash")


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_batched_chunks_match_ragged(problem, chunk):
    """The batched prompt part in chunks of visits (several loop steps) equals the ragged loop's."""
    pr = problem
    sch = DA.prompt_schedule(pr["ids"], pr["active"], P, 2)
    q_sorted = jnp.take(pr["q"].reshape(S, M, G, D), sch.perm_S, axis=0)
    args = (q_sorted, pr["kv"].prompt_k, pr["kv"].prompt_v, pr["start"], sch)
    ragged = DA._prompt_partials_ragged(*args)
    batched = DA._prompt_partials_batched(*args, chunk=chunk)
    seen = np.asarray(ragged.l) > 0
    np.testing.assert_array_equal(seen, np.asarray(batched.l) > 0)
    for a, b in zip(ragged, batched):
        np.testing.assert_allclose(np.where(seen[..., None] if a.ndim == 4 else seen, a, 0),
                                   np.where(seen[..., None] if b.ndim == 4 else seen, b, 0), atol=1e-5)


def test_auto_resolves_for_the_platform_lowered_for():
    from sera_jax.models import attention as A

    assert DA.resolve_implementation("auto") == "ragged"  # this CPU machine
    for platform in ("tpu", "cuda"):
        with A.lowering_for(platform):
            assert DA.resolve_implementation("auto") == "batched"
    assert DA.resolve_implementation("auto", backend="tpu") == "batched"
