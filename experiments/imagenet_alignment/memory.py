"""The jitted calls of the alignment experiment with abstract arguments (``python -m sera_jax.train.plan``).

The CE and RL (dynamics) train steps and the validation call as ``training.compiled_steps`` builds them, and
the analysis's two model programs (``analysis.compiled``): the forward pass over the analysis set and one
chunk of ``analysis.draw_chunk`` cotangents' gradients (the alignment draws), with the config's shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from experiments.imagenet_alignment import analysis, training
from experiments.imagenet_alignment import model as model_lib
from sera_jax.models import resnet
from sera_jax.train import sharding as sh
from sera_jax.train.plan import PlannedCall

# (image shape, classes) of each dataset, without reading it.
DATASET_SHAPES = {"digits": ((8, 8, 1), 10), "cifar10": ((32, 32, 3), 10), "imagenet2012": ((224, 224, 3), 1000)}


def _abstract(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def planned_calls(config: ml_collections.ConfigDict) -> list[PlannedCall]:
    image_shape, num_classes = DATASET_SHAPES[config.data.name]
    mesh = sh.make_mesh(config.mesh)
    data_axes = tuple(a for a in config.mesh.data_axes if a in mesh.axis_names)
    kwargs = dict(model_lib._resnet_kwargs(config, image_shape[-1]))
    with nnx.use_eager_sharding(False):
        module = nnx.eval_shape(lambda: resnet.build_resnet(config.model.name, num_classes,
                                                            nnx.Rngs(jax.random.key(0, impl="rbg")), **kwargs))
    graphdef, params, stats = nnx.split(module, nnx.Param, nnx.BatchStat)
    tx = training.optimizer_from_config(config)
    steps = training.compiled_steps(graphdef, tx, mesh, data_axes, training._rl_static(config))
    rep, rows = steps.replicated, steps.rows
    state = jax.tree.map(lambda x: _abstract(x.shape, x.dtype, rep),
                         jax.eval_shape(lambda p, s: training.init_state(p, s, tx), params, stats))
    n = config.optim.batch_size
    batch = {"image": _abstract((n, *image_shape), jnp.float32, rows), "label": _abstract((n,), jnp.int32, rows)}
    lr = _abstract((), jnp.float32, rep)
    key = jax.eval_shape(lambda: jax.random.key(0))
    key = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=rep)
    m = config.dynamics.rollouts_per_prompt
    e = config.data.eval_batch_size
    calls = [
        PlannedCall("ce step", steps.ce, (state, batch, lr), f"{n} images"),
        PlannedCall("rl step", steps.rl, (state, batch, lr, key, _abstract((), jnp.bool_, rep)),
                    f"{n} images x {m} sampled labels"),
        PlannedCall("validation", steps.eval, (state["params"], state["batch_stats"],
                                               _abstract((e, *image_shape), jnp.float32, rows),
                                               _abstract((e,), jnp.int32, rows)), f"{e} images"),
    ]
    a = config.analysis
    micro = max(1, a.num_prompts // a.microbatch) if a.microbatch else 1
    fns = analysis.compiled(graphdef, mesh, data_axes, a.draw_chunk, micro)
    x = _abstract((a.num_prompts, *image_shape), jnp.float32, fns.rows)
    p, s = state["params"], state["batch_stats"]
    calls.append(PlannedCall("analysis forward", fns.forward, (p, s, x, _abstract((a.num_prompts,), jnp.int32, fns.rows)),
                             f"{a.num_prompts} images in {micro} microbatch(es)"))
    cot = _abstract((a.draw_chunk, a.num_prompts, num_classes), jnp.float32, fns.chunk_rows)
    calls.append(PlannedCall("analysis draw chunk", fns.chunk_grads, (p, s, x, cot, p),
                             f"{a.draw_chunk} cotangents' gradients over {a.num_prompts} images"))
    return calls
