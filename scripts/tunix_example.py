"""SERA inside tunix: a runnable example on CPU (about a minute; needs ``pip install -e '.[tunix]'``).

    python scripts/tunix_example.py --steps=4 --allocator=sera

A tiny Qwen2 of tunix's own model code (random weights), tunix's vanilla rollout engine and its RL cluster; the only
SERA-specific lines are the ``SeraConfig`` and ``SeraLearner`` below. The toy task rewards a completion whose first
character is in a prompt-specific set, so prompts range from easy to nearly impossible and SERA's pilot gives the
hard ones more of the budget. Each step prints the rollouts every prompt got and its pilot estimate.
"""

from __future__ import annotations

import argparse
import tempfile

import jax
import numpy as np
import optax
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout

from sera_jax.integrations import tunix as sera_tunix
from sera_jax.integrations import tunix_models
from sera_jax.models.decoder import Decoder, DecoderConfig

PROMPTS = np.array(["1+1=", "2+3=", "4+4=", "9?", "7+1=", "3+3=", "5+2=", "8?"])
ACCEPT = np.array(["0123456789+=? ", "0123456789", "012", "9", "01234567", "6", "0123", "8"])


class CharTokenizer:
    """A character vocabulary with the methods tunix's TokenizerAdapter asks for (pad 0, bos 1, eos 2; ``pad=2``
    pads with EOS, as Hugging Face tokenizers without a pad token do in tunix)."""

    chars = "0123456789+=? "

    def __init__(self, pad: int = 0):
        self.pad = pad
        self.ids = {c: i + 3 for i, c in enumerate(self.chars)}
        self.chars_of = {i: c for c, i in self.ids.items()}

    def encode(self, text, **kwargs):
        return [self.ids[c] for c in text]

    def decode(self, ids, **kwargs):
        return "".join(self.chars_of.get(int(i), "") for i in ids)

    def pad_id(self):
        return self.pad

    def bos_id(self):
        return 1

    def eos_id(self):
        return 2


def first_char_reward(prompts, completions, accept, **kwargs):
    """1 when the completion starts with one of the prompt's accepted characters (the ``accept`` column)."""
    return [float(len(c) > 0 and c[0] in a) for c, a in zip(completions, accept)]


def build_learner(allocator: str, steps: int, learning_rate: float, workdir: str,
                  learner_cls=sera_tunix.SeraLearner) -> sera_tunix.SeraLearner:
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    # Any tunix model works; here a sera_jax decoder's random weights, loaded by tunix's safetensors loader.
    decoder_cfg = DecoderConfig(vocab_size=20, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                                ffn_dim=64, qkv_bias=True, init_std=0.3)
    with jax.set_mesh(mesh):
        model = tunix_models.to_tunix_qwen2(decoder_cfg, Decoder(decoder_cfg, rngs=nnx.Rngs(0)), workdir)
    cluster = rl_cluster_lib.RLCluster(
        actor=model, reference=model, tokenizer=CharTokenizer(),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={role: mesh for role in (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
                                                  rl_cluster_lib.Role.ROLLOUT)},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(actor_optimizer=optax.adamw(learning_rate),
                                                            eval_every_n_steps=1000, max_steps=steps),
            rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=3, max_prompt_length=8,
                                                      kv_cache_size=16, temperature=1.0)))
    # SERA's side: 8 rollouts a prompt on average, a pilot of 2, every prompt between 2 and 24.
    config = sera_tunix.SeraConfig(num_generations=8, allocator=allocator, n_min=2, n_max=24, pilot_rollouts=2)
    return learner_cls(rl_cluster=cluster, algo_config=config, reward_fns=first_char_reward)


class PrintingLearner(sera_tunix.SeraLearner):
    def _generate_and_compute_advantage(self, training_input, mode=rl_cluster_lib.Mode.TRAIN):
        example = super()._generate_and_compute_advantage(training_input, mode)
        a = self.last_allocation
        print(f"step {self.rl_cluster.global_steps}: rollouts {a['counts_P'].tolist()}  "
              f"p_hat {np.round(a['p_hat_P'], 2).tolist()}  reward {a['rewards_B'].mean():.3f}", flush=True)
        return example


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--allocator", default="sera", choices=sera_tunix.counts_allocators())
    parser.add_argument("--learning_rate", type=float, default=1e-2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        learner = build_learner(args.allocator, args.steps, args.learning_rate, workdir, PrintingLearner)
        learner.train([dict(prompts=PROMPTS, accept=ACCEPT)] * args.steps)
    print(f"done: {learner.rl_cluster.actor_trainer.train_steps} tunix steps with SeraLearner({args.allocator!r})")


if __name__ == "__main__":
    main()
