"""The paper-scale compute dtype: the shared-prompt update and the sampler in bfloat16 against float32.

The `gpu`/`full` configs compute in bfloat16 (parameters float32). The same float32 parameters are run with
``DecoderConfig.dtype`` bfloat16 and float32, and the bfloat16 results must match to bf16's precision.

Tolerance. bfloat16 keeps 8 significand bits: each rounding is a relative error of at most u = 2^-8. A
value of the tiny decoder passes through about k = 35 roundings on its way to a log-prob (the embedding;
per layer the normed input, q/k/v, RoPE's products and sum, the attention output, o_proj, the residual,
the MLP's norm, gate/up, silu * up, down, the residual: ~15 each, 2 layers; the final norm and the head):
independent roundings add up like a random walk, a relative error of about sqrt(k) u, and we allow 3 times
that: 3 sqrt(35) 2^-8 = 0.069 on the log-probs (relative L2 over the batch). The gradient goes back through
the same chain (about 2k roundings): 3 sqrt(70) 2^-8 = 0.098 on the whole gradient (relative L2). Measured
here: 0.004 and 0.02 (scale-0.2 random weights; larger weights amplify the roundings more). A wrong mask
or backward is an O(1) error, far outside either bound.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sera_jax.models import decoder as D
from sera_jax.models import sampler as S
from sera_jax.rl import step as step_lib

VOCAB = 16
U_BF16 = 2.0**-8
ROUNDINGS = 35  # bf16 roundings from token to log-prob in the tiny decoder (module docstring)
LOGP_RTOL = 3 * math.sqrt(ROUNDINGS) * U_BF16  # 0.069
GRAD_RTOL = 3 * math.sqrt(2 * ROUNDINGS) * U_BF16  # 0.098


def _graphdefs_and_params():
    """float32 and bfloat16-compute graphdefs of the tiny decoder, and one set of float32 parameters."""
    graphdef_f32, params = nnx.split(D.random_decoder(D.tiny(VOCAB), seed=0, scale=0.2))
    graphdef_bf16, params_bf16 = nnx.split(D.random_decoder(D.tiny(VOCAB, dtype="bfloat16"), seed=0, scale=0.2))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params_bf16))  # param_dtype stays float32
    return graphdef_f32, graphdef_bf16, params


def _relative_l2(got, want) -> float:
    got, want = (np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(t)])
                 for t in (got, want))
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _shared_batch(rng):
    """4 left-padded prompts (lengths 5, 1, 3, 4), 8 rollouts over 3 of them, responses of lengths 0..6."""
    ids_B = np.array([0, 0, 0, 2, 2, 3, 0, 3], np.int32)
    t, r = 5, 6
    lengths_P = np.array([5, 1, 3, 4], np.int32)
    prompts_PxT = np.where(np.arange(t)[None] >= (t - lengths_P)[:, None], rng.integers(3, VOCAB, (4, t)), 0)
    mask_BxR = np.arange(r)[None] < np.resize(np.arange(r + 1), len(ids_B))[:, None]
    response_BxR = np.where(mask_BxR, rng.integers(3, VOCAB, mask_BxR.shape), 0)
    rows = step_lib.RolloutRows(jnp.asarray(ids_B), jnp.asarray(response_BxR, jnp.int32), jnp.asarray(mask_BxR),
                                jnp.asarray(mask_BxR, jnp.float32))
    return step_lib.SharedPromptBatch(jnp.asarray(prompts_PxT, jnp.int32), jnp.asarray(lengths_P), rows)


def test_shared_prompt_update_in_bfloat16_matches_float32():
    """The shared-prompt update's loss, log-probs and gradient (blockwise attention's own backward, which
    XLA:CPU could not run in bf16: 'DotThunk ... BF16 x BF16 = F32') in bf16 against float32."""
    graphdef_f32, graphdef_bf16, params = _graphdefs_and_params()
    batch = _shared_batch(np.random.default_rng(0))
    coef_BxR = jnp.asarray(np.random.default_rng(1).normal(size=batch.rows.response_BxR.shape), jnp.float32)

    def loss_fn(graphdef):
        def loss(p):
            prefix = step_lib.prompt_prefix(graphdef, p, batch.prompt_tokens_PxT, batch.prompt_lengths_P)
            logp = step_lib.shared_response_logprobs(graphdef, p, prefix, batch.prompt_lengths_P, batch.rows)
            return jnp.sum(coef_BxR * logp), logp
        return jax.jit(jax.value_and_grad(loss, has_aux=True))

    (_, want_logp), want_grads = loss_fn(graphdef_f32)(params)
    (_, got_logp), got_grads = loss_fn(graphdef_bf16)(params)
    assert got_logp.dtype == jnp.float32 and np.all(np.isfinite(got_logp))
    mask = np.asarray(batch.rows.response_mask_BxR)
    assert np.all(np.asarray(got_logp)[~mask] == 0.0)
    assert _relative_l2(got_logp, want_logp) <= LOGP_RTOL
    assert jax.tree.structure(got_grads) == jax.tree.structure(want_grads)
    assert _relative_l2(got_grads, want_grads) <= GRAD_RTOL


def test_sampler_logprobs_in_bfloat16_match_float32_teacher_forcing():
    """The bf16 sampler's policy log-probs of the tokens it drew against float32 teacher forcing of the same
    tokens (fixed tokens: the float32 model is not asked to sample them)."""
    graphdef_f32, graphdef_bf16, params = _graphdefs_and_params()
    prompts_PxT = jnp.array([[3, 4, 5, 6, 7], [0, 0, 8, 9, 10], [0, 0, 0, 0, 11]], jnp.int32)
    lengths_P = jnp.array([5, 3, 1], jnp.int32)
    ids_B = jnp.array([0, 1, 2, 0, 0, 1, 2, 2], jnp.int32)
    sample_fn = S.make_sample_fn(graphdef_bf16, max_new_tokens=6, pad_id=0)
    out = sample_fn(params, prompts_PxT, lengths_P, ids_B, jax.random.key(0), jnp.float32(1.0),
                    jnp.asarray([-1, -1], jnp.int32))
    rows_BxT = np.asarray(prompts_PxT)[np.asarray(ids_B)]
    tokens_BxL = jnp.asarray(np.concatenate([rows_BxT, np.asarray(out.tokens_BxR)], 1))
    valid_BxL = jnp.asarray(np.concatenate([rows_BxT != 0, np.asarray(out.mask_BxR)], 1))

    @jax.jit
    def teacher_forced(p, tokens, valid):
        model = nnx.merge(graphdef_f32, p)
        return D.token_logprobs(model, tokens, D.positions_from_valid(valid), valid)

    want_BxR = np.asarray(teacher_forced(params, tokens_BxL, valid_BxL))[:, prompts_PxT.shape[1]:]
    got_BxR = np.asarray(out.logp_policy_BxR)
    assert np.asarray(out.mask_BxR).all()  # no stop tokens: every slot scored
    assert np.all(np.isfinite(got_BxR)) and np.all(got_BxR < 0)
    assert _relative_l2(got_BxR, want_BxR) <= LOGP_RTOL
