"""The jitted calls of an RL run, with abstract arguments, for the memory planner (``python -m experiments.plan``,
which compiles them with ``sera_jax.train.plan``).

``planned_rl_calls`` lays the policy's parameters and optimizer state out by the config's mesh and rules
(``jax.eval_shape``: no FLOPs, no weights) and lists the calls a run makes with the shapes it makes them:
the pilot, the step's sampling (``rl.sample_chunk`` rows at a time, ``rl.sample_slots`` decoding slots), the
update (``rl.update_microbatches`` slices inside one call), an evaluation call and an SFT step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from sera_jax.models import flops
from sera_jax.models.decoder import DecoderConfig
from sera_jax.models.sampler import make_sample_fn
from sera_jax.rl import step as step_lib
from sera_jax.rl.config import rows_per_call, uses_pilot
from sera_jax.rl.settings import RunSettings, SftSettings
from sera_jax.rl.sft import sft_optimizer
from sera_jax.rl.trainer import make_rl_optimizer
from sera_jax.train import sharding as sharding_lib
from sera_jax.train.plan import PlannedCall


def _abstract(shape: tuple[int, ...], dtype: Any, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding)


def abstract_tree(tree: Any, placement: sharding_lib.Placement, device: Any) -> Any:
    """``tree`` (abstract) with the shardings ``placement.tree`` would give it (on ``device`` without a mesh)."""
    if placement.mesh is None:
        single = jax.sharding.SingleDeviceSharding(device)
        return jax.tree.map(lambda x: _abstract(x.shape, x.dtype, single), tree)
    shardings = jax.tree.map(sharding_lib.drop_trivial_axes,
                             sharding_lib.state_shardings(tree, placement.mesh, placement.rules))
    return sharding_lib.with_shardings(tree, shardings)


class _ModelCounts:
    """The model's FLOPs and least bytes of a sampling call, per device of ``placement`` (FLOPs split evenly;
    each data-parallel group decodes its share of the rows and reads the weights and caches its model axis
    holds)."""

    def __init__(self, cfg: DecoderConfig, params: Any, placement: sharding_lib.Placement):
        self.cfg = cfg
        mesh = placement.mesh
        self.devices = 1 if mesh is None else mesh.size
        self.model_parallel = 1 if mesh is None else dict(mesh.shape).get("model", 1)
        self.weight_bytes = sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))

    def sampling(self, prompts: int, prompt_len: int, rows: int, slots: int, new_tokens: int) -> dict[str, float]:
        data_parallel = self.devices // self.model_parallel
        group_rows = math.ceil(rows / data_parallel)
        least = flops.decoding_bytes(self.cfg, self.weight_bytes, group_rows, math.ceil(slots / data_parallel),
                                     prompt_len, new_tokens) / self.model_parallel
        return dict(model_flops=flops.sampling_flops(self.cfg, prompts, prompt_len, rows, new_tokens) / self.devices,
                    least_bytes=least)


def planned_rl_calls(build_model: Callable[[], nnx.Module], settings: RunSettings, *,
                     mesh_config: ml_collections.ConfigDict, prompt_len: int, max_new_tokens: int,
                     num_stop_tokens: int = 1, sft: Optional[SftSettings] = None, sft_answer_len: Optional[int] = None,
                     placement: Optional[sharding_lib.Placement] = None,
                     devices: Optional[Sequence[Any]] = None) -> list[PlannedCall]:
    """The calls of one RL run of ``settings`` (parsed: ``settings.parse_run_settings``) on the mesh of
    ``mesh_config``, with prompts of ``prompt_len`` tokens and responses of up to ``max_new_tokens``; ``sft`` and
    ``sft_answer_len`` add the SFT step (answers of that many tokens). ``devices``: where the run's mesh lies
    (default: JAX's devices; the planner passes a GPU's or TPU's compile-only devices)."""
    allocator, rl, sera, e = settings.allocator, settings.rl, settings.sera, settings.eval
    devices = list(jax.devices() if devices is None else devices)
    placement = placement or sharding_lib.make_placement(mesh_config, devices)
    with nnx.use_eager_sharding(False):
        model = nnx.eval_shape(build_model)
        graphdef, params = nnx.split(model)
    params = abstract_tree(params, placement, devices[0])
    counts = _ModelCounts(model.cfg, params, placement)
    if placement.mesh is None:
        rows = replicated = jax.sharding.SingleDeviceSharding(devices[0])
    else:
        rows = sharding_lib.batch_sharding(placement.mesh, placement.data_axes)
        replicated = NamedSharding(placement.mesh, PartitionSpec())
    P, B, T, R = rl.prompts_per_step, rl.rollouts_per_step, prompt_len, max_new_tokens
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)

    def sampling(name: str, num_prompts: int, num_rows: int, top_p: float, slots: int, note: str) -> PlannedCall:
        # "batched": what the sampler's "auto" attention runs on the accelerators planned for (the planner
        # compiles on CPU, where "auto" would pick the loop of "ragged" visits).
        fn = make_sample_fn(graphdef, max_new_tokens=R, top_p=top_p, pad_id=0, num_slots=slots or None,
                            attention="batched")
        args = (params, _abstract((num_prompts, T), jnp.int32, replicated), _abstract((num_prompts,), jnp.int32, replicated),
                _abstract((num_rows,), jnp.int32, rows), key, _abstract((), jnp.float32, replicated),
                _abstract((num_stop_tokens,), jnp.int32, replicated),
                _abstract((num_prompts,), jnp.int32, replicated))  # rank_offset_P: the trainer always passes it
        return PlannedCall(name, fn, args, note, **counts.sampling(num_prompts, T, num_rows, slots or num_rows, R))

    calls = []
    pilot = uses_pilot(settings, allocator)
    main_rows = B - (P * sera.pilot_rollouts if pilot else 0)
    chunk = rl.sample_chunk
    # The sampler caches each of a call's prompts once (T columns) and gives each of its decoding slots
    # (rl/eval.sample_slots, 0: one per row of the call) R response columns.

    def slots_note(rows: int, slots: int) -> str:
        n = min(slots or rows, rows)
        return f"{n} slots" + ("" if n == rows else f" refilled over the {rows} rows")

    rl_slots = rl.sample_slots
    if pilot:
        pilot_rows = P * sera.pilot_rollouts
        pilot_call = min(pilot_rows, chunk or pilot_rows)
        calls.append(sampling("pilot sampling", P, pilot_call, rl.top_p, rl_slots,
                              f"{pilot_call} of {pilot_rows} rows per call; {P} x {T} prompt + "
                              f"{slots_note(pilot_call, rl_slots)} x {R} tokens"))
    per_call = min(main_rows, chunk or main_rows)
    if allocator.round_fn is not None:  # rounds: calls of P x round_size rows each
        per_call = min(P * sera.round_size, chunk or P * sera.round_size)
    calls.append(sampling("rollout sampling", P, per_call, rl.top_p, rl_slots,
                          f"{per_call} of {main_rows} rows per call; {P} x {T} prompt + "
                          f"{slots_note(per_call, rl_slots)} x {R} tokens"))
    eval_rows = rows_per_call(e.samples_per_prompt, e.max_rollouts_per_call)
    eval_prompts = eval_rows // e.samples_per_prompt
    calls.append(sampling("evaluation sampling", eval_prompts, eval_rows, e.top_p, e.sample_slots,
                          f"{eval_rows} rows per call; {eval_prompts} x {T} prompt + "
                          f"{slots_note(eval_rows, e.sample_slots)} x {R} tokens"))

    tx = make_rl_optimizer(settings)
    opt_state = abstract_tree(jax.eval_shape(tx.init, params), placement, devices[0])
    state = step_lib.TrainState(params, opt_state, _abstract((), jnp.int32, replicated))
    m = rl.update_microbatches
    if rl.share_prompts:
        batch = step_lib.SharedPromptBatch(
            _abstract((P, T), jnp.int32, replicated), _abstract((P,), jnp.int32, replicated),
            step_lib.RolloutRows(_abstract((B,), jnp.int32, rows), _abstract((B, R), jnp.int32, rows),
                                 _abstract((B, R), jnp.bool_, rows), _abstract((B, R), jnp.float32, rows)))
        layout = f"{P} prompts of {T} tokens once, {B} responses of {R}"
    else:
        batch = step_lib.SequenceBatch(_abstract((B, T + R), jnp.int32, rows),
                                       _abstract((B, T + R), jnp.bool_, rows), _abstract((B, R), jnp.float32, rows))
        layout = f"{B} rollouts of {T + R} tokens"
    update = step_lib.make_policy_gradient_update(graphdef, tx, m, rl.logprob_chunk)
    update_flops = (flops.shared_prompt_training_flops(counts.cfg, P, T, B, R) if rl.share_prompts
                    else flops.sequence_training_flops(counts.cfg, B, T + R, R))
    calls.append(PlannedCall("update", update, (state, batch, _abstract((B,), jnp.float32, rows)),
                             f"{layout} in {m} slice(s) of {B // m}", model_flops=update_flops / counts.devices))
    if sft_answer_len and sft is not None and sft.steps:
        s = sft
        sft_tx = sft_optimizer(s.learning_rate, s.steps, s.warmup_steps, s.b1, s.b2, s.weight_decay, s.schedule)
        sft_state = step_lib.TrainState(params, abstract_tree(jax.eval_shape(sft_tx.init, params), placement, devices[0]),
                                        _abstract((), jnp.int32, replicated))
        n = s.batch_size
        sft_batch = step_lib.SequenceBatch(_abstract((n, T + sft_answer_len), jnp.int32, rows),
                                           _abstract((n, T + sft_answer_len), jnp.bool_, rows),
                                           _abstract((n, sft_answer_len), jnp.float32, rows))
        sft_flops = flops.sequence_training_flops(counts.cfg, n, T + sft_answer_len, sft_answer_len)
        calls.append(PlannedCall("sft step", step_lib.make_sft_step(graphdef, sft_tx), (sft_state, sft_batch),
                                 f"{n} examples of {T + sft_answer_len} tokens", model_flops=sft_flops / counts.devices))
    return calls
