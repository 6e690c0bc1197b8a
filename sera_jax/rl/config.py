"""The RL part of an experiment config: defaults, validation at the boundary, per-method variants.

Every field an RL run reads is here: ``rl`` (steps, batch, optimiser, sampling, memory knobs), ``sera``
(allocation method, estimator, how p is estimated, bounds, loss aggregation), ``eval`` and ``ckpt``.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import ml_collections

import sera_jax.core as core
from sera_jax.train import config_utils
from sera_jax.train.config_utils import Rule, is_fraction, is_number

# epoch_history: the SERA authors' estimator (core.epoch_history): a Beta(epoch_prior) posterior mean of each prompt
# from earlier epochs' rollouts, old evidence x epoch_discount at each epoch boundary, frozen through the epoch; a
# step with any prompt not yet estimated (all of epoch 0) is uniform. history: our decayed tracker, updated every
# visit, with a prior fitted to the prompts seen.
P_ESTIMATES = ("pilot", "history", "epoch_history", "oracle")
HISTORY_ESTIMATES = ("history", "epoch_history")
DATA_ORDERS = ("fixed", "seed")


def default_rl_config() -> ml_collections.ConfigDict:
    """The ``rl``, ``sera``, ``eval`` and ``ckpt`` sub-dicts of an RL experiment config."""
    c = ml_collections.ConfigDict()
    # sample_chunk: rollouts per sampling call (0: the whole step at once); update_microbatches: slices the
    # update accumulates its gradient over; logprob_chunk: response positions projected onto the vocabulary
    # at a time in the update (0: all). They bound device memory at large B x response length x vocabulary;
    # none changes what is estimated (chunked sampling draws other random numbers from the same distribution).
    # share_prompts: the update runs each prompt through the model once and every rollout's response against its
    # prompt's cached keys/values (step.SharedPromptBatch), not B joined copies of the prompt: the same loss
    # and gradient (to float rounding) for B x R + P x T positions instead of B x (T + R).
    # sample_slots: the sampler's decoding slots per call (0: one per rollout of the call); with fewer, a slot
    # takes the next pending rollout when its own ends (slot refill), so a call's cost follows the sum of response
    # lengths rather than rollouts x the longest; a rollout's tokens do not depend on it (eval.sample_slots: the
    # same for evaluation calls).
    # data_order: "fixed" (every seed sees the task's one order of training prompts) or "seed" (each seed its own
    # order, ``task.train_prompts(step, P, order=seed)``; the methods of a seed still see the same prompts).
    c.rl = dict(steps=100, prompts_per_step=16, rollouts_per_step=128, learning_rate=1e-4, b1=0.9, b2=0.999,
                weight_decay=0.0, grad_clip=1.0, temperature=1.0, top_p=1.0, sample_chunk=0, update_microbatches=1,
                logprob_chunk=0, share_prompts=True, data_order="fixed",
                sample_slots=0)
    # use_posterior=False: allocating on the posterior-expected factor measured worse (lower true min, higher CV)
    # than on the posterior mean, for pilots and histories (experiments/imagenet_alignment/p_estimates.py).
    # The peers' own settings (docs/allocators.md), read only by the allocators that use them: keep_per_prompt,
    # the rollouts a prompt trains on (PODS's m, Reinforce-Ada's n); round_size, rollouts a prompt gets in each
    # sampling round (Reinforce-Ada's M); candidate_ratio, candidates fetched from the prompt stream per prompt
    # trained (MoPPS's ts_ratio; GRESO's window); target_rate, the success rate MoPPS selects for.
    # budget="tokens": the step spends at most tokens_per_step sampled response tokens (pilot included), the
    # allocation equalising the factors under sum_i l_i N_i <= tokens_per_step with l_i each prompt's mean pilot
    # length, in at most rl.rollouts_per_step rows (the update's fixed rows; unused rows are padding).
    c.sera = dict(method="sera", estimator="maxrl", p_estimate="pilot", pilot_rollouts=2, n_min=2, n_max=64,
                  correction=True, aggregation="sequence_sum", history_decay=0.5, use_posterior=False,
                  keep_per_prompt=4, round_size=8, candidate_ratio=8, target_rate=0.5,
                  budget="rollouts", tokens_per_step=0, epoch_discount=0.75, epoch_prior=(0.5, 0.5),
                  activation_threshold=0.05,
                  loss_microbatch_rows=0)  # rows a loss micro-batch of aggregation="token_mean_microbatch" (0: all)
    # bootstrap_repeats > 0: evaluations also report the SERA authors' bootstrap pass@k (that many draws of k samples
    # with replacement, NumPy's stream reseeded with bootstrap_seed for every prompt and k) beside the unbiased one.
    c.eval = dict(every=50, samples_per_prompt=32, ks=(1, 2, 4, 8, 16, 32), temperature=1.0, top_p=1.0,
                  max_rollouts_per_call=1024, sample_slots=0, bootstrap_repeats=0, bootstrap_seed=42)
    c.ckpt = dict(every=25, max_to_keep=2)
    return ml_collections.ConfigDict(c)


def method_config(config: ml_collections.ConfigDict, methods: dict[str, dict],
                  method: str) -> ml_collections.ConfigDict:
    """A copy of ``config`` with ``config.sera`` updated as ``methods[method]`` says (an experiment compares
    methods that share everything else); ValueError naming an unknown method. A method's entry may hold an
    ``"rl"`` dict of ``config.rl`` fields it changes too (an arm of a learning-rate sweep, say)."""
    if method not in methods:
        raise ValueError(f"config.methods has unknown method {method!r}; known: {sorted(methods)}")
    sera_fields = dict(methods[method])
    rl_fields = sera_fields.pop("rl", {})
    unknown = sorted(set(rl_fields) - set(config.rl.keys()))
    if unknown:
        raise ValueError(f"method {method!r} changes unknown config.rl fields {unknown}")
    c = copy.deepcopy(config)
    with c.unlocked():
        c.sera.update(sera_fields)
        c.rl.update(rl_fields)
    return c


def method_allocator(c: ml_collections.ConfigDict, allocator: Optional[core.Allocator] = None) -> core.Allocator:
    """``allocator`` when given, else the registered allocator ``c.sera.method`` names (``core.get_allocator``;
    ValueError listing the known ones): this module's one look-up of the registry. Callers that hold the run's
    allocator (``validate_rl_config``'s result, the trainer's ``RLContext.allocator``) pass it on instead."""
    return core.get_allocator(c.sera.method) if allocator is None else allocator


def validate_rl_config(c: ml_collections.ConfigDict, *, endless: bool, knows_success_rates: bool,
                       num_shards: int = 1, extra_rows: Optional[dict[str, int]] = None,
                       num_train_prompts: Optional[int] = None,
                       max_new_tokens: Optional[int] = None) -> core.Allocator:
    """Fails with a message naming the field for configs the trainer cannot run on a task (``endless``: no
    fixed training set, so no history tracker; ``knows_success_rates``: can give the true p;
    ``num_train_prompts``: its training set's size, when known; ``max_new_tokens``: its response cap) with its
    rows split over ``num_shards`` data shards (``extra_rows``: the experiment's own calls, see check_rows_split).

    In three passes: the names (estimator, allocator, estimate of p), every field's own rule (``field_rules``, one
    ``config_utils.check_fields``), then the rules that tie fields together. Returns the allocator ``sera.method``
    names, looked up once here and handed to every check that reads it (the trainer keeps it in its ``RLContext``)."""
    allocator = resolve_allocator(c)
    config_utils.check_fields(c, field_rules(c) + allocator_rules(allocator))
    check_peer_settings(c, allocator, endless=endless, num_train_prompts=num_train_prompts)
    check_token_budget(c, allocator, max_new_tokens)
    check_cross_fields(c, allocator, endless=endless, knows_success_rates=knows_success_rates)
    check_history_recurs(c, allocator, num_train_prompts)
    check_rows_split(c, num_shards, extra_rows, allocator)
    return allocator


def resolve_allocator(c: ml_collections.ConfigDict) -> core.Allocator:
    """The allocator ``sera.method`` names, checked against the estimator and the estimate of p it reads."""
    estimator = core.get_estimator(c.sera.estimator)
    try:
        allocator = method_allocator(c)
        allocator.check_estimator(estimator)
    except ValueError as e:
        raise ValueError(f"config.sera.method={c.sera.method!r} (config.sera.estimator={c.sera.estimator!r}): {e}") from e
    if c.sera.p_estimate not in P_ESTIMATES:
        raise ValueError(f"config.sera.p_estimate={c.sera.p_estimate!r}: must be one of {list(P_ESTIMATES)}")
    if allocator.needs_estimate and c.sera.p_estimate not in allocator.p_estimates:
        raise ValueError(f"config.sera.p_estimate={c.sera.p_estimate!r}: allocator {c.sera.method!r} is defined "
                         f"for p_estimate in {list(allocator.p_estimates)}")
    # The allocator says so too, but only once a step runs
    if c.sera.n_min < estimator.min_rollouts:
        raise ValueError(f"config.sera.n_min={c.sera.n_min} is too small for config.sera.estimator="
                         f"{c.sera.estimator!r}: it needs at least {estimator.min_rollouts} rollouts a prompt to "
                         "give a gradient")
    return allocator


def field_rules(c: ml_collections.ConfigDict) -> list[Rule]:
    """Each RL field's own rule (``config_utils.Rule``), in the order they are checked."""
    B = c.rl.rollouts_per_step
    rows = f"must be an int >= 0 dividing config.rl.rollouts_per_step={B}"
    return [
        Rule("rl.steps", lambda v: isinstance(v, int) and v >= 0, "must be an int >= 0"),
        Rule("rl.prompts_per_step", lambda v: isinstance(v, int) and v >= 1, "must be >= 1"),
        # The history tracker multiplies a prompt's old counts by the decay at each visit (MoPPS's lambda too)
        Rule("sera.history_decay", lambda v: is_number(v) and 0 < v <= 1,
             "must be in (0, 1]: the share of a prompt's earlier counts kept at each visit"),
        Rule("sera.budget", lambda v: v in BUDGETS, f"must be one of {list(BUDGETS)}"),
        # The released SERA's activation_useful_threshold: the least mixed-group chance of a prompt it samples.
        Rule("sera.activation_threshold", is_fraction,
             "must be in [0, 1]: the least chance of a mixed group for a prompt the released SERA samples"),
        Rule("sera.epoch_discount", is_fraction,
             "must be in [0, 1]: the share of old evidence kept at each epoch boundary"),
        Rule("sera.epoch_prior", lambda v: isinstance(v, (tuple, list)) and len(v) == 2
             and all(is_number(x) and x > 0 for x in v),
             "must be two finite numbers > 0: the Beta prior (alpha, beta) of epoch_history"),
        Rule("rl.sample_chunk", lambda v: isinstance(v, int) and v >= 0,
             "must be an int >= 0 (0: sample the whole step in one call)"),
        Rule("rl.update_microbatches", lambda v: isinstance(v, int) and v >= 1 and B % v == 0,
             f"must be an int >= 1 that divides rl.rollouts_per_step={B}"),
        Rule("rl.logprob_chunk", lambda v: isinstance(v, int) and v >= 0,
             "must be an int >= 0 (0: all response positions at once)"),
        Rule("rl.share_prompts", lambda v: isinstance(v, bool), "must be True or False"),
        *(Rule(field, lambda v: isinstance(v, int) and v >= 0,
               "must be an int >= 0 (0: one decoding slot per rollout of a call)")
          for field in ("rl.sample_slots", "eval.sample_slots")),
        Rule("rl.data_order", lambda v: v in DATA_ORDERS, f"must be one of {list(DATA_ORDERS)}"),
        *sampling_rules(),
        *eval_rules(c),
        *optimizer_rules("rl"),
        *schedule_rules(),
        Rule("sera.aggregation", lambda v: v in core.AGGREGATIONS, f"must be one of {list(core.AGGREGATIONS)}"),
        Rule("sera.loss_microbatch_rows",
             lambda v: config_utils.is_int(v) and v >= 0 and (v == 0 or B % v == 0), rows),
    ]


def allocator_rules(allocator: core.Allocator) -> list[Rule]:
    """The rules of the settings a peer allocator reads (``sera.keep_per_prompt``, ``round_size``,
    ``candidate_ratio``, ``target_rate``), for the allocators that read them."""
    positive_int = _int_at_least(1)
    rules = []
    if allocator.keep_fn is not None:
        rules.append(Rule("sera.keep_per_prompt", *positive_int))
    if allocator.round_fn is not None:
        rules.append(Rule("sera.round_size", *positive_int))
    if allocator.select_fn is not None:
        rules += [Rule("sera.candidate_ratio", *positive_int),
                  Rule("sera.target_rate", lambda v: is_number(v) and 0 < v < 1, "must be in (0, 1)")]
    return rules


def check_cross_fields(c: ml_collections.ConfigDict, allocator: core.Allocator, *, endless: bool,
                       knows_success_rates: bool) -> None:
    """The rules that tie fields to each other and to the task's kind (checked fields: ``field_rules``)."""
    P, B = c.rl.prompts_per_step, c.rl.rollouts_per_step
    if not P * c.sera.n_min <= B <= P * c.sera.n_max:
        raise ValueError(
            f"config.rl.rollouts_per_step={B} is infeasible for prompts_per_step={P} with "
            f"n_min={c.sera.n_min}, n_max={c.sera.n_max}")
    if uses_pilot(c, allocator):
        n0 = c.sera.pilot_rollouts
        if not 1 <= n0 or P * n0 >= B:
            raise ValueError(f"config.sera.pilot_rollouts={n0} must be >= 1 with P * n0 < rollouts_per_step ({B})")
    if c.sera.p_estimate in HISTORY_ESTIMATES and endless:
        raise ValueError(f"config.sera.p_estimate={c.sera.p_estimate!r} needs a finite training set (the task has "
                         "none)")
    if c.sera.use_posterior and not allocator.accepts_posterior:
        raise ValueError(f"config.sera.use_posterior=True: allocator {c.sera.method!r} allocates on point estimates "
                         f"(those with a posterior form: "
                         f"{sorted(n for n, a in core.ALLOCATORS.items() if a.needs_estimate and a.accepts_posterior)})")
    if c.sera.p_estimate == "oracle" and not knows_success_rates:
        raise ValueError("config.sera.p_estimate='oracle': this task cannot give the true success rates; "
                         "use 'pilot' or 'history'")


def check_peer_settings(c: ml_collections.ConfigDict, allocator: core.Allocator, *, endless: bool,
                        num_train_prompts: Optional[int]) -> None:
    """A peer allocator's sizes against the step (DARS's pilot) and the task (a selection peer's candidates)."""
    if allocator.pilot_fraction:
        check_pilot_fraction_sizes(c)
    if allocator.select_fn is None:
        return
    if endless:
        raise ValueError(f"config.sera.method={c.sera.method!r} selects prompts from their history of earlier "
                         "visits, so it needs a finite training set (this task's stream never revisits a prompt)")
    fetched = c.sera.candidate_ratio * c.rl.prompts_per_step
    if num_train_prompts is not None and fetched > num_train_prompts:
        raise ValueError(f"config.sera.candidate_ratio={c.sera.candidate_ratio}: {fetched} candidates a step "
                         f"(x prompts_per_step={c.rl.prompts_per_step}) exceed the {num_train_prompts} training "
                         "prompts")


def check_pilot_fraction_sizes(c: ml_collections.ConfigDict) -> None:
    """DARS (read on the pilot's success fractions; counts from max(n_min, pilot_rollouts) up, ``core.pilot_allocate``)
    refuses some sizes only when a step runs (``core.dars.check_sizes``: a pilot above 1024 rollouts, n_max >= 2^31,
    shares beyond int32): refused here, naming the fields."""
    n0, n_min, n_max, B = c.sera.pilot_rollouts, c.sera.n_min, c.sera.n_max, c.rl.rollouts_per_step
    try:
        core.dars.check_sizes(c.rl.prompts_per_step, B, n0=n0, n_pilot=max(n_min, n0), n_max=n_max)
    except ValueError as e:
        raise ValueError(f"config.sera.method={c.sera.method!r} with config.sera.pilot_rollouts={n0}, "
                         f"config.sera.n_min={n_min}, config.sera.n_max={n_max}, config.rl.rollouts_per_step={B}: "
                         f"{e}") from e


def check_history_recurs(c: ml_collections.ConfigDict, allocator: core.Allocator,
                         num_train_prompts: Optional[int]) -> None:
    """A method that reads the history of earlier visits (history estimates, or a selection peer) needs a run
    that visits some prompt twice. Tasks pass through their training set in epochs, so a run that fetches at
    most the whole set (steps x prompts fetched a step <= its size) never revisits one: every history
    estimate would stay at its prior, silently (use pilot estimates there, or more steps)."""
    reads_history = allocator.select_fn is not None or (allocator.needs_estimate
                                                        and c.sera.p_estimate in HISTORY_ESTIMATES)
    if not reads_history or num_train_prompts is None or c.rl.steps == 0:
        return
    fetched = prompts_fetched_per_step(c, allocator)
    if c.rl.steps * fetched <= num_train_prompts:
        what = (f"config.sera.method={c.sera.method!r} selects prompts from their history"
                if allocator.select_fn is not None else f"config.sera.p_estimate={c.sera.p_estimate!r}")
        raise ValueError(f"{what}, but the run fetches {c.rl.steps * fetched} prompts (rl.steps={c.rl.steps} x "
                         f"{fetched} a step) from a training set of {num_train_prompts}, so it never revisits a "
                         "prompt and every history estimate stays at its prior; use sera.p_estimate='pilot' or "
                         "more steps")


def prompts_fetched_per_step(config: ml_collections.ConfigDict, allocator: Optional[core.Allocator] = None) -> int:
    """Prompts a step takes from the stream: ``rl.prompts_per_step``, or ``sera.candidate_ratio`` times as many
    for a selection allocator (it keeps P of them; every method reads the same stream). ``allocator``: the one
    ``sera.method`` names, when the caller holds it (else looked up: ``method_allocator``)."""
    if method_allocator(config, allocator).select_fn is None:
        return config.rl.prompts_per_step
    return config.sera.candidate_ratio * config.rl.prompts_per_step


BUDGETS = ("rollouts", "tokens")


def check_token_budget(c: ml_collections.ConfigDict, allocator: core.Allocator,
                       max_new_tokens: Optional[int]) -> None:
    """``sera.budget="tokens"``: an allocator that takes costs (SERA's), lengths measured by a pilot, and a budget
    that every step can meet whatever the lengths (each prompt's minimum of rollouts at the response cap)."""
    if c.sera.budget == "rollouts":
        return
    if not allocator.accepts_costs:
        raise ValueError(f"config.sera.budget='tokens': allocator {c.sera.method!r} has no token-budget form "
                         f"(those that do: {sorted(n for n, a in core.ALLOCATORS.items() if a.accepts_costs)})")
    if c.sera.p_estimate != "pilot":
        raise ValueError("config.sera.budget='tokens' needs config.sera.p_estimate='pilot': the pilot measures each "
                         "prompt's response length")
    floor = c.rl.prompts_per_step * max(c.sera.n_min, c.sera.pilot_rollouts) * (max_new_tokens or 1)
    config_utils.require(c, "sera.tokens_per_step", lambda v: config_utils.is_int(v) and v >= floor,
                         f"must be an int >= {floor} (prompts_per_step x max(n_min, pilot_rollouts) x the "
                         f"{max_new_tokens or 1}-token response cap), so every step can afford its minimum")


def _int_at_least(minimum: int) -> tuple[Callable[[Any], bool], str]:
    """A ``Rule``'s (check, message) for an int (not a bool) >= ``minimum``."""
    return (lambda v: config_utils.is_int(v) and v >= minimum), f"must be an int >= {minimum}"


def sampling_rules() -> list[Rule]:
    """Training samples at temperature 1 without top-p; evaluation at any temperature > 0 and top-p in (0, 1].

    The update's log-probs are the policy's own (temperature 1, the whole vocabulary), so rollouts drawn from
    another distribution would make the gradient off-policy and biased; MaxRL trains at 1 and evaluates at
    0.6 / top-p 0.95. A temperature of 0 is refused everywhere rather than read as greedy decoding.
    """
    why = ("the update trains on the policy's temperature-1, full-vocabulary log-probs, so rollouts sampled "
           "otherwise would be off-policy (MaxRL trains at 1; eval.temperature and eval.top_p may differ)")
    return [Rule("rl.temperature", lambda v: is_number(v) and v == 1, f"must be 1.0: {why}"),
            Rule("rl.top_p", lambda v: is_number(v) and v == 1, f"must be 1.0: {why}"),
            Rule("eval.temperature", lambda v: is_number(v) and v > 0,
                 "must be a finite number > 0 (0 does not mean greedy decoding)"),
            Rule("eval.top_p", lambda v: is_number(v) and 0 < v <= 1, "must be in (0, 1]")]


def eval_rules(c: ml_collections.ConfigDict) -> list[Rule]:
    """An evaluation draws ``eval.samples_per_prompt`` samples a prompt and reports pass@k at each of ``eval.ks``,
    which needs k of them: checked at the door, not when the first evaluation runs (after SFT). Configs saved
    before the bootstrap fields have none (no bootstrap)."""
    n = c.eval.samples_per_prompt
    return [Rule("eval.samples_per_prompt", *_int_at_least(1)),
            Rule("eval.ks", lambda v: isinstance(v, (tuple, list)) and len(v) > 0
                 and all(config_utils.is_int(k) and 1 <= k <= n for k in v) and list(v) == sorted(set(v)),
                 f"must be increasing ints in [1, eval.samples_per_prompt={n}]: pass@k needs k samples a prompt"),
            Rule("eval.bootstrap_repeats", *_int_at_least(0), optional=True),
            Rule("eval.bootstrap_seed", lambda v: config_utils.is_int(v) and 0 <= v <= 2**32 - 1,
                 "must be an int in [0, 2^32 - 1] (a NumPy RandomState seed)", optional=True)]


def optimizer_rules(prefix: str) -> list[Rule]:
    """AdamW's settings under ``prefix`` (``rl`` or ``sft``; fields a config leaves out keep the optimiser's
    defaults): a learning rate <= 0 or NaN would train, silently, the wrong way or not at all."""
    return [Rule(f"{prefix}.learning_rate", lambda v: is_number(v) and v > 0, "must be a finite number > 0"),
            Rule(f"{prefix}.weight_decay", lambda v: is_number(v) and v >= 0, "must be a finite number >= 0",
                 optional=True),
            *(Rule(f"{prefix}.{beta}", lambda v: is_number(v) and 0 <= v < 1, "must be in [0, 1)", optional=True)
              for beta in ("b1", "b2")),
            Rule(f"{prefix}.grad_clip", lambda v: v is None or (is_number(v) and v >= 0),
                 "must be None or 0 (no clipping) or a finite number > 0", optional=True)]


def schedule_rules() -> list[Rule]:
    """How often a run evaluates and saves (``train.loop``: eval.every 0 never evaluates, ckpt.every 0 saves at
    the end only)."""
    is_period, message = _int_at_least(0)
    is_count, count_message = _int_at_least(1)
    return [Rule("eval.every", is_period, f"{message} (0: no evaluation)"),
            Rule("ckpt.every", is_period, f"{message} (0: a checkpoint at the end only)"),
            Rule("ckpt.max_to_keep", lambda v: v is None or is_count(v), f"{count_message}, or None to keep every "
                 "checkpoint")]


def sft_rules(c: ml_collections.ConfigDict) -> list[Rule]:
    """The comparison's SFT start (``config.sft``), checked at the door rather than when SFT begins."""
    rules = [Rule("sft.steps", *_int_at_least(0))]
    if not c.sft.steps:
        return rules
    return rules + [Rule("sft.batch_size", *_int_at_least(1)), Rule("sft.warmup_steps", *_int_at_least(0),
                                                                     optional=True), *optimizer_rules("sft")]


def uses_pilot(c: ml_collections.ConfigDict, allocator: Optional[core.Allocator] = None) -> bool:
    """Whether a step starts with ``sera.pilot_rollouts`` pilot rollouts a prompt: its allocator (``allocator``,
    else the one ``sera.method`` names) needs the success rates (``Allocator.needs_estimate``) and they come from
    a pilot."""
    return method_allocator(c, allocator).needs_estimate and c.sera.p_estimate == "pilot"


def rows_per_call(samples_per_prompt: int, max_rollouts_per_call: int) -> int:
    """Rows of one evaluation-style call: whole prompts' samples, as many as fit in ``max_rollouts_per_call``."""
    return max(1, max_rollouts_per_call // samples_per_prompt) * samples_per_prompt


def check_rows_split(c: ml_collections.ConfigDict, num_shards: int, extra: Optional[dict[str, int]] = None,
                     allocator: Optional[core.Allocator] = None) -> None:
    """Every sampling call and update slice puts its rows on the data shards: each count must split evenly.

    ``extra`` adds an experiment's own calls ({description: rows}); call it at start-up to fail before any work.
    ``allocator``: the one ``sera.method`` names, when the caller holds it (else looked up once here).
    """
    if num_shards == 1:
        return
    P, B = c.rl.prompts_per_step, c.rl.rollouts_per_step
    rows = {"config.rl.rollouts_per_step": B,
            "config.eval.samples_per_prompt (rows per call)": rows_per_call(c.eval.samples_per_prompt,
                                                                            c.eval.max_rollouts_per_call)}
    if isinstance(c.rl.update_microbatches, int) and c.rl.update_microbatches >= 1:  # else validate names it
        rows["config.rl.rollouts_per_step / update_microbatches"] = B // c.rl.update_microbatches
    if c.rl.sample_chunk:
        rows["config.rl.sample_chunk"] = c.rl.sample_chunk
    for field in ("rl", "eval"):
        slots = getattr(c, field).sample_slots
        if isinstance(slots, int) and slots > 0:
            rows[f"config.{field}.sample_slots"] = slots
    allocator = method_allocator(c, allocator)
    if uses_pilot(c, allocator):
        rows["config.sera.pilot_rollouts * prompts_per_step"] = P * c.sera.pilot_rollouts
    if allocator.round_fn is not None:
        rows["config.sera.round_size * prompts_per_step (rows of a sampling round)"] = P * c.sera.round_size
    for field, value in {**rows, **(extra or {})}.items():
        if value % num_shards:
            raise ValueError(f"{field}={value} must be a multiple of the {num_shards} data shards (config.mesh)")
