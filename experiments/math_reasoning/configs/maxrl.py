"""MaxRL's settings (``gpu``: its GSM8K run; ``full``: its POLARIS run on Qwen3): what each changes in the shared
base (``config.base_config``). The differences from MaxRL's released scripts, with their reasons, are in
``config.py``'s docstring."""

from __future__ import annotations

import ml_collections

from sera_jax.data.math_data import PROMPT_SUFFIX

# MaxRL's POLARIS (and MATH-500 / AIME25) instruction, character for character: a plain string in
# examples/maxrl_data_preprocess/polaris.py, so its "{{}}" reaches the prompt doubled. Appended with no separator.
POLARIS_PROMPT_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def gpu(c: ml_collections.ConfigDict) -> None:
    """MaxRL's GSM8K setting: SmolLM2-360M-Instruct, 256 prompts x 128 rollouts, 1,500 steps, on one H200."""
    # Local copies of the Hugging Face repositories (nothing is downloaded at run time).
    c.sft.steps = 0  # RL starts from the pretrained model, as in MaxRL
    c.log.profile_samples = 0
    # MaxRL's grader (verl's math_verify.py) and its GSM8K length rule (0 at the 2,048-token cap, EOS or not).
    c.grading.update(backend="math_verify", workers=16, truncation="at_cap")
    c.model = dict(source="pretrained", dir="~/models/SmolLM2-360M-Instruct",
                   hf_repo="HuggingFaceTB/SmolLM2-360M-Instruct", dtype="bfloat16", param_dtype="float32",
                   attention="auto", remat="block", scan_layers=True)
    # The paper's prompt: the question then "Let's think step by step and output the final answer within
    # \boxed{}.", in the model's chat template.
    c.data.update(source="gsm8k", dir="~/data/gsm8k", eval_dir="~/data/gsm8k-platinum", num_train=0,
                  num_eval=0, num_sft=0, prompt_suffix=PROMPT_SUFFIX, max_prompt_tokens=512, max_new_tokens=2048)
    # 32,768 rollouts x up to 2,560 tokens per step on one 141 GiB H200 (`python -m sera_jax.train.plan
    # --config=experiments/math_reasoning/config.py:gpu` prints each call's bytes): sampled in one call per
    # step through 512 decoding slots, each taking the next rollout when its own ends (the 256 prompts
    # prefilled and cached once a step, each slot a 2,048-column response cache: 54 GiB; chunks of 512
    # rows planned 53 GiB but prefilled all 256 prompts for each of 64 chunks), the update accumulated over
    # 256 slices of 128 rollouts (slices of 256 planned at 151 GiB) with remat over scanned layers and the
    # 49k-token vocabulary projected 128 positions at a time. Joined sequences, not shared prompts: with 2,048-token
    # responses sharing saves a fifth of the positions but holds the prompts' keys/values, their cotangents
    # and each slice's gathered copy (planned 144 GiB against 80 GiB joined; 209 against 67 GiB for `full`).
    c.rl.update(steps=1500, prompts_per_step=256, rollouts_per_step=256 * 128, learning_rate=1e-5,
                temperature=1.0, weight_decay=0.01, sample_slots=512, update_microbatches=256, logprob_chunk=128,
                share_prompts=False)
    c.sera.update(n_min=2, n_max=1024, history_decay=0.5)
    c.eval.update(every=250, samples_per_prompt=1024, ks=tuple(2**i for i in range(11)), temperature=0.6,
                  top_p=0.95, max_rollouts_per_call=1024)
    c.ckpt.update(every=50)
    # FSDP: parameters split over all devices on "fsdp"; the flat rollout axis over ("data", "fsdp").
    c.mesh.shape = (1, -1, 1)


def full(c: ml_collections.ConfigDict) -> None:
    """``gpu`` on Qwen3-1.7B-Base and POLARIS-53K: 256 x 16, lr 1e-6, 1,000 steps, evaluated on MATH-500."""
    gpu(c)
    c.model.update(dir="~/models/Qwen3-1.7B-Base", hf_repo="Qwen/Qwen3-1.7B-Base")
    # docs/method.md gives no response length or evaluation set for this setting: 4096 tokens and MATH-500
    # (MaxRL's Qwen3 evaluations include it) are this config's choices.
    c.data.update(source="polaris", dir="~/data/polaris-53k", eval_dir="~/data/math-500",
                  max_prompt_tokens=1024, max_new_tokens=4096, prompt_suffix=POLARIS_PROMPT_SUFFIX,
                  prompt_separator="")
    c.grading.truncation = "graded"  # MaxRL's POLARIS script grades truncated responses
    # Sized for 8 x H200 (141 GiB each; FSDP over all 8): planned with --devices=8 (sampling: 1,024
    # slots over the step's 4,096 rollouts in one call, 115 GiB per device; every device holds all 256
    # prompts' keys/values).
    c.rl.update(steps=1000, prompts_per_step=256, rollouts_per_step=256 * 16, learning_rate=1e-6,
                grad_clip=0.3, sample_slots=1024, update_microbatches=64, logprob_chunk=256)
    c.sera.update(n_max=128)
    c.eval.update(every=100, samples_per_prompt=256, ks=tuple(2**i for i in range(9)),
                  max_rollouts_per_call=1024)


VARIANTS = {"gpu": gpu, "full": full}
