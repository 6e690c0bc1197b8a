"""Math reasoning as an ``RLTask``: a fixed problem set, chat prompts left-padded for the sampler, rewards
from the math grader on decoded responses; plus the experiment's data and tokenizer sources.

Sources (``config.data.source``):

- ``arithmetic``: procedural word problems (``sera_jax.envs.arithmetic``) with worked solutions for SFT and a
  BPE tokenizer trained on their text; nothing to download (the offline default).
- ``gsm8k``: GSM8K train from ``config.data.dir``, evaluated on GSM8K-Platinum from ``config.data.eval_dir``.
- ``polaris``: POLARIS-53K from ``config.data.dir``, evaluated on MATH-500 from ``config.data.eval_dir``.
- ``verl``: training rows the SERA authors prepared in verl's parquet layout (their SimpleRL-Zoo MATH level 3-5
  rows, their POLARIS; ``math_data.load_verl``) from ``config.data.dir`` (the file or its folder): each row's chat
  turns are the prompt as they stored them (their instruction inside), so no suffix is added.

``config.data.eval_sets`` (the ``paper_*`` variants), when given, replaces the source's evaluation set: the named
sets of ``math_data.EVAL_SETS``, each from its own ``config.data.eval_dirs.<name>`` (a folder or the file; the
pinned source file or the authors' prepared one), pooled into one held-out set (each record keeps its set's name
in ``source``). Their answers are graded under ``config.grading.eval_truncation`` when it is set (the authors'
evaluation zeroes every response that reaches the cap; some of their training scripts grade cut responses).

The training set is fixed and visited in epochs (a fresh permutation each epoch), so every prompt comes back
and the ``history`` success-rate tracker, keyed by the dataset index, can estimate p before sampling.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any, Optional, Sequence

import ml_collections
import numpy as np
from absl import logging

from sera_jax.data import math_data
from sera_jax.data import tokenizer as tok_lib
from sera_jax.envs import arithmetic, math_grading
from sera_jax.rl.sft import SFTBatch
from sera_jax.rl.task import PromptBatch, SampleOutput
from sera_jax.train.distributed import host_array

Record = dict[str, Any]
SOURCES = ("arithmetic", "gsm8k", "polaris", "verl")
# Which responses score 0 for their length (``config.grading.truncation``): "no_stop" those without a stop
# token within the cap; "at_cap" every response that fills the cap, stop token or not (MaxRL's GSM8K script:
# ``zero_reward_on_max_response_length``, the length counting the stop token); "graded" none (MaxRL's POLARIS
# script grades a cut response like any other).
TRUNCATION_RULES = ("no_stop", "at_cap", "graded")


class EvalReference(str):
    """A held-out problem's reference answer (a ``str``): marks the rows ``MathTask.rewards`` grades under the
    evaluation's length rule (``config.grading.eval_truncation``) rather than training's."""


# Difficulty ladders of the arithmetic source. "default": arithmetic.LEVELS (up to 4 steps on two-digit
# numbers). "one_digit": every operand has one digit and level k takes k steps, so difficulty grows by
# compounding steps; a decoder small enough to train on a CPU in minutes learns it well enough that the
# per-prompt success rates spread out (the default ladder leaves it near 0 on most prompts).
_ONE_DIGIT_OPS = {1: ("add", "sub"), 2: ("add", "sub"), 3: ("add", "sub", "mul"), 4: ("add", "sub", "mul", "div"),
                  5: ("add", "sub", "mul", "div")}
LADDERS = {
    "default": arithmetic.LEVELS,
    "one_digit": {k: arithmetic.Difficulty(level=k, num_steps=k, max_digits=1, ops=ops)
                  for k, ops in _ONE_DIGIT_OPS.items()},
}


def _expand(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(path))


def require_dir(path: str, field: str, what: str, hf_repo: str = "", repo_type: str = "dataset") -> str:
    """The expanded ``path``; FileNotFoundError naming ``field`` and what to download when it is missing."""
    path = _expand(path)
    if not path or not os.path.isdir(path):
        how = (f" On a machine with network access run `huggingface-cli download {hf_repo} --repo-type {repo_type} "
               f"--local-dir DIR`, copy DIR here and pass --{field}=DIR." if hf_repo else f" Set --{field}=DIR.")
        raise FileNotFoundError(
            f"{field}={path!r} is not a directory: it must hold {what} (nothing is downloaded at run time).{how}")
    return path


def require_path(path: str, field: str, what: str, hf_repo: str = "") -> str:
    """The expanded ``path`` (a file or a folder); FileNotFoundError naming ``field``, what it must hold and where
    it comes from when it is neither."""
    path = _expand(path)
    if not path or not os.path.exists(path):
        how = (f" On a machine with network access run `huggingface-cli download {hf_repo} --repo-type dataset "
               f"--local-dir DIR`, copy DIR here and pass --{field}=DIR." if hf_repo else f" Pass --{field}=PATH.")
        raise FileNotFoundError(f"{field}={path!r} does not exist: it must be {what} (nothing is downloaded at "
                                f"run time).{how}")
    return path


# ------------------------------------------------------------------------------------------ data sources


def load_eval_sets(data: ml_collections.ConfigDict) -> list[Record]:
    """The records of ``config.data.eval_sets``, each set from ``config.data.eval_dirs.<name>`` (its first
    ``config.data.num_eval`` problems; 0: all), in that order."""
    records: list[Record] = []
    for name in data.eval_sets:
        spec = math_data.DATASETS[name]
        path = require_path(data.eval_dirs.get(name, ""), f"config.data.eval_dirs.{name}",
                            f"the {name} evaluation set, a file or a folder with one of "
                            f"{[p.format(split='test') for p in spec.patterns]} ({spec.layout})", spec.hf_repo)
        records += math_data.load_eval_set(name, path, limit=data.num_eval or None)
    return records


def load_records(data: ml_collections.ConfigDict) -> tuple[list[Record], list[Record], list[Record]]:
    """(train, eval, sft) records of ``config.data``; each record has question, answer (and, for the
    arithmetic source, solution and level). The SFT pool is disjoint from the train and eval questions."""
    if data.source not in SOURCES:
        raise ValueError(f"config.data.source={data.source!r}: must be one of {list(SOURCES)}")
    if data.source == "arithmetic":
        if data.ladder not in LADDERS:
            raise ValueError(f"config.data.ladder={data.ladder!r}: must be one of {sorted(LADDERS)}")
        unknown = [lv for lv in data.levels if lv not in LADDERS[data.ladder]]
        if unknown:
            raise ValueError(f"config.data.levels has {unknown}, not in ladder {data.ladder!r}")
        kw = dict(levels={lv: LADDERS[data.ladder][lv] for lv in data.levels},
                  level_weights=None if not data.level_weights else tuple(data.level_weights),
                  test_fraction=data.test_fraction)
        train = [p.to_record() for p in
                 arithmetic.generate_problems(data.num_train, seed=data.seed, split="train", **kw)]
        evals = [p.to_record() for p in
                 arithmetic.generate_problems(data.num_eval, seed=data.seed, split="test", **kw)]
        taken = {r["question"] for r in train}
        # The SFT pool comes from another seed's stream, minus the RL training questions.
        pool = arithmetic.generate_problems(data.num_sft + len(train), seed=data.seed + 1, split="train", **kw)
        sft = [p.to_record() for p in pool if p.question not in taken][: data.num_sft]
        return train, evals, sft
    limit = data.num_train or None
    eval_limit = data.num_eval or None
    eval_sets = tuple(data.get("eval_sets", ()))
    if data.source == "gsm8k":
        train_dir = require_dir(data.dir, "config.data.dir", "GSM8K (config main)", "openai/gsm8k")
        train = math_data.load_gsm8k(train_dir, "train", limit=limit)
        if eval_sets:
            return train, load_eval_sets(data), []
        eval_dir = require_dir(data.eval_dir, "config.data.eval_dir", "GSM8K-Platinum",
                               "madrylab/gsm8k-platinum")
        return train, math_data.load_gsm8k_platinum(eval_dir, "test", limit=eval_limit), []
    if data.source == "verl":
        train_path = require_path(data.dir, "config.data.dir",
                                  f"the SERA authors' prepared training rows, a .parquet file or a folder with "
                                  f"train.parquet ({math_data.PREPARED_LAYOUT})")
        if not eval_sets:
            raise ValueError("config.data.source='verl' evaluates on config.data.eval_sets, which is empty")
        return math_data.load_verl(train_path, "train", limit=limit), load_eval_sets(data), []
    train_dir = require_dir(data.dir, "config.data.dir", "POLARIS-53K", "POLARIS-Project/Polaris-Dataset-53K")
    train = math_data.load_polaris(train_dir, "train", limit=limit)
    if eval_sets:
        return train, load_eval_sets(data), []
    eval_dir = require_dir(data.eval_dir, "config.data.eval_dir", "MATH-500", "HuggingFaceH4/MATH-500")
    return train, math_data.load_math500(eval_dir, "test", limit=eval_limit), []


def build_tokenizer(config: ml_collections.ConfigDict,
                    workdir: Optional[pathlib.Path] = None) -> tok_lib.TextTokenizer:
    """The arithmetic source's BPE (trained on generated problems, saved to and reloaded from
    ``WORKDIR/tokenizer`` so a resumed run tokenises identically), or the pretrained model's tokenizer
    from ``config.model.dir``."""
    if config.model.source == "pretrained":
        model_dir = require_dir(config.model.dir, "config.model.dir",
                                 f"the Hugging Face model files of {config.model.hf_repo} (tokenizer.json, "
                                 "tokenizer_config.json, config.json, *.safetensors)", config.model.hf_repo, "model")
        return tok_lib.load_tokenizer(model_dir)
    if config.data.source != "arithmetic":
        raise ValueError(f"config.model.source='scratch' trains its tokenizer on arithmetic problems; "
                         f"config.data.source={config.data.source!r} needs model.source='pretrained'")
    saved = None if workdir is None else workdir / "tokenizer"
    if saved is not None and (saved / tok_lib.TOKENIZER_FILE).is_file():
        return tok_lib.load_tokenizer(saved)
    texts = arithmetic.corpus(config.data.tokenizer_corpus, seed=config.data.seed + 2,
                              extra_texts=[config.data.prompt_suffix])
    tokenizer = tok_lib.train_tokenizer(texts, vocab_size=config.data.vocab_size)
    if saved is not None:
        tokenizer.save(saved)
    return tokenizer


# ------------------------------------------------------------------------------------------------ task


@dataclasses.dataclass(frozen=True)
class EncodedSet:
    """Problems with their prompts encoded and left-padded to the task's common length T."""

    records: list[Record]
    tokens_PxT: np.ndarray  # int32, left-padded
    lengths_P: np.ndarray  # int32
    answers: list[str]

    @property
    def levels(self) -> np.ndarray:
        """Difficulty level per problem (arithmetic), -1 where the source has none."""
        return np.array([int(r.get("level", -1)) for r in self.records], np.int32)


class MathTask:
    """RL on a fixed set of math problems: prompts are the chat-formatted question plus the paper's suffix (a
    record with ``messages``, a row the SERA authors prepared, is rendered from its own chat turns), responses are
    graded (``grader``, a ``math_grading.Grader``: MaxRL's whole-response rule by default) after
    decoding up to the first stop token; which responses score 0 for their length is ``truncation``'s rule
    (``TRUNCATION_RULES``; by default one the sampler cut at the limit, ``finished_B`` False), on the held-out
    set ``eval_truncation``'s when given. ``max_prompt_tokens`` drops longer training prompts (0: none),
    ``eval_max_prompt_tokens`` longer held-out ones (0: the training limit); ``strip_question=False`` appends the
    suffix to the question as it is, surrounding whitespace included (the SERA authors' prompts).
    ``grading_timeouts`` / ``grading_errors`` count the grading calls that hit the grader's time limit / failed;
    when more than ``max_grading_error_frac`` of a step's calls fail, ``rewards`` raises
    ``math_grading.GradingError`` (``config.grading.max_error_frac``)."""

    knows_success_rates = False  # p under the policy is unknown: sera.p_estimate="oracle" is refused

    def __init__(self, tokenizer: tok_lib.TextTokenizer, train: Sequence[Record], evals: Sequence[Record],
                 sft: Sequence[Record] = (), *, max_new_tokens: int, prompt_suffix: str = math_data.PROMPT_SUFFIX,
                 use_chat_template: bool = True, system: str = "", max_prompt_tokens: int = 0, seed: int = 0,
                 grader: Optional[math_grading.Grader] = None, truncation: str = "no_stop",
                 max_grading_error_frac: float = 0.1, prompt_separator: str = " ", strip_question: bool = True,
                 eval_truncation: str = "", eval_max_prompt_tokens: int = 0):
        if max_new_tokens < 1:
            raise ValueError(f"config.data.max_new_tokens={max_new_tokens}: must be >= 1")
        if truncation not in TRUNCATION_RULES:
            raise ValueError(f"config.grading.truncation={truncation!r}: must be one of {list(TRUNCATION_RULES)}")
        if eval_truncation and eval_truncation not in TRUNCATION_RULES:
            raise ValueError(f"config.grading.eval_truncation={eval_truncation!r}: must be '' (as in training) or "
                             f"one of {list(TRUNCATION_RULES)}")
        for field, value in (("max_prompt_tokens", max_prompt_tokens),
                             ("eval_max_prompt_tokens", eval_max_prompt_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"config.data.{field}={value!r}: must be an int >= 0 (0: no limit)")
        if not isinstance(strip_question, bool):
            raise ValueError(f"config.data.strip_question={strip_question!r}: must be True or False")
        if not 0.0 <= max_grading_error_frac <= 1.0:
            raise ValueError(f"config.grading.max_error_frac={max_grading_error_frac!r}: must be in [0, 1]")
        self.tokenizer = tokenizer
        self.grader = grader if grader is not None else math_grading.Grader()
        self.truncation, self.max_grading_error_frac = truncation, max_grading_error_frac
        self.eval_truncation = eval_truncation or truncation
        self.grading_timeouts = self.grading_errors = 0
        self._step_counts = math_grading.GradingCounts()  # since the trainer's last reward_metrics()
        self.stop_tokens = tuple(tokenizer.stop_ids)
        self.pad_id = tokenizer.pad_id
        self.max_new_tokens = max_new_tokens
        self.prompt_suffix, self.use_chat_template, self.system = prompt_suffix, use_chat_template, system
        self.prompt_separator, self.strip_question = prompt_separator, strip_question
        self.seed = seed
        encoded = {name: self._encode(list(records)) for name, records in
                   (("train", train), ("eval", evals), ("sft", sft))}
        limits = {"train": max_prompt_tokens, "sft": max_prompt_tokens,
                  "eval": eval_max_prompt_tokens or max_prompt_tokens}
        encoded = {name: self._drop_long(name, *enc, limits[name]) if limits[name] else enc
                   for name, enc in encoded.items()}
        for name in ("train", "eval"):
            if not encoded[name][0]:
                raise ValueError(f"the {name} set is empty (config.data.num_{name}, config.data.max_prompt_tokens"
                                 + (", config.data.eval_max_prompt_tokens)" if name == "eval" else ")"))
        self.prompt_len = max(len(x) for _, ids in encoded.values() for x in ids)
        self.train, self.sft = self._pack(*encoded["train"]), self._pack(*encoded["sft"])
        self.eval = self._pack(*encoded["eval"], reference=EvalReference)
        self.num_train_prompts = len(self.train.records)
        self._sft_answers = self._encode_answers(self.sft.records) if self.sft.records else None
        self._epoch_cache: tuple[int, int, int, np.ndarray] | None = None  # (epoch, num, order, permutation)

    # -- prompts -------------------------------------------------------------------------------------

    def render(self, question: str) -> str:
        """The prompt text: the chat template's user turn and generation prompt, or the plain prompt."""
        if self.use_chat_template:
            messages = math_data.to_messages(question, self.prompt_suffix, separator=self.prompt_separator,
                                             system=self.system or None, strip=self.strip_question)
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return math_data.format_prompt(question, self.prompt_suffix, self.prompt_separator, strip=self.strip_question)

    def render_record(self, record: Record) -> str:
        """``render`` of the record's question, or, for a prepared row (``messages``), its own chat turns (a
        ``system`` turn first when the task has one and the row none) through the chat template, or their
        contents joined without one."""
        if "messages" not in record:
            return self.render(record["question"])
        messages = list(record["messages"])
        if self.system and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.system}, *messages]
        if self.use_chat_template:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return "".join(m["content"] for m in messages)

    def _encode(self, records: list[Record]) -> tuple[list[Record], list[list[int]]]:
        if not records:
            return [], []
        texts = [self.render_record(r) for r in records]
        encodings = self.tokenizer.tokenizer.encode_batch(texts, add_special_tokens=not self.use_chat_template)
        return records, [e.ids for e in encodings]

    @staticmethod
    def _drop_long(name: str, records: list[Record], ids: list[list[int]], limit: int):
        keep = [i for i, x in enumerate(ids) if len(x) <= limit]
        if len(keep) < len(records):
            logging.warning("%s set: dropped %d of %d prompts longer than config.data.max_prompt_tokens=%d",
                            name, len(records) - len(keep), len(records), limit)
        return [records[i] for i in keep], [ids[i] for i in keep]

    def _pack(self, records: list[Record], ids: list[list[int]], reference: type = str) -> EncodedSet:
        if not records:
            return EncodedSet([], np.zeros((0, self.prompt_len), np.int32), np.zeros(0, np.int32), [])
        tokens, lengths = tok_lib.pad_sequences(ids, self.pad_id, length=self.prompt_len, padding_side="left")
        return EncodedSet(records, tokens, lengths, [reference(str(r["answer"])) for r in records])

    def prompt_batch(self, split: EncodedSet, keys_P: np.ndarray) -> PromptBatch:
        return PromptBatch(keys_P, split.tokens_PxT[keys_P], split.lengths_P[keys_P],
                           [split.answers[k] for k in keys_P])

    def epoch_order(self, epoch: int, order: int = 0) -> np.ndarray:
        """The permutation of the training set used in ``epoch`` of data order ``order`` (deterministic in the
        seed; 0: the task's own order)."""
        if not isinstance(order, (int, np.integer)) or order < 0:
            raise ValueError(f"order={order!r}: must be an int >= 0")
        entropy = [self.seed, 0x5EA, epoch] + ([int(order)] if order else [])
        return np.random.default_rng(entropy).permutation(self.num_train_prompts)

    def train_prompts(self, step: int, num: int, order: int = 0) -> PromptBatch:
        """Step ``step``'s ``num`` distinct prompts: epoch ``step // (M // num)`` of a per-epoch permutation
        (its last ``M % num`` prompts skipped; ``order`` picks the permutations), so each epoch visits the
        training set once."""
        if not 1 <= num <= self.num_train_prompts:
            raise ValueError(f"config.rl.prompts_per_step={num} must be in [1, {self.num_train_prompts}] "
                             "(the training set size)")
        epoch, pos = divmod(step, self.num_train_prompts // num)
        if self._epoch_cache is None or self._epoch_cache[:3] != (epoch, num, order):
            self._epoch_cache = (epoch, num, order, self.epoch_order(epoch, order))
        return self.prompt_batch(self.train, self._epoch_cache[3][pos * num:(pos + 1) * num])

    def eval_prompts(self) -> PromptBatch:
        return self.prompt_batch(self.eval, np.arange(len(self.eval.records)))

    # -- rewards -------------------------------------------------------------------------------------

    def responses(self, sample: SampleOutput) -> tuple[list[str], np.ndarray]:
        """Decoded response texts (up to the first stop token) and ``truncated_B``: the sampler's own verdict
        (``~finished_B``: no stop token within ``max_new_tokens``); multi-host, every host gathers and decodes
        all rows."""
        texts, no_stop_B = tok_lib.decode_responses(self.tokenizer, host_array(sample.tokens_BxR),
                                                    lengths_B=host_array(sample.lengths_B), stop_ids=self.stop_tokens)
        return texts, ~host_array(sample.finished_B).astype(bool) | no_stop_B

    def zeroed_for_length(self, sample: SampleOutput, no_stop_B: np.ndarray, rule: Optional[str] = None) -> np.ndarray:
        """Rows that score 0 for their length under ``rule`` (``TRUNCATION_RULES``; default ``self.truncation``)."""
        rule = rule or self.truncation
        if rule == "graded":
            return np.zeros_like(no_stop_B)
        if rule == "at_cap":
            return no_stop_B | (host_array(sample.lengths_B) >= self.max_new_tokens)
        return no_stop_B

    def rewards(self, prompts: PromptBatch, prompt_ids_B: np.ndarray, sample: SampleOutput) -> np.ndarray:
        """The grader's reward per rollout against its own prompt's answer (0 for the rows the length rule
        zeroes: ``eval_truncation``'s for held-out references, ``truncation``'s for the others); GradingError when
        this step's failed calls pass ``max_grading_error_frac``."""
        texts, no_stop_B = self.responses(sample)
        references = [prompts.payload[i] for i in host_array(prompt_ids_B)]
        zeroed_B = self.zeroed_for_length(sample, no_stop_B)
        if self.eval_truncation != self.truncation:
            held_out_B = np.array([isinstance(r, EvalReference) for r in references], bool)
            if held_out_B.any():
                zeroed_B = np.where(held_out_B, self.zeroed_for_length(sample, no_stop_B, self.eval_truncation),
                                    zeroed_B)
        rewards, counts = self.grader.grade_batch(texts, [str(r) for r in references], zeroed_B)
        self.grading_timeouts += counts.timeouts
        self.grading_errors += counts.errors
        self._step_counts += counts
        math_grading.check_error_rate(self._step_counts, self.max_grading_error_frac, "config.grading.max_error_frac")
        return rewards

    def reward_metrics(self) -> dict[str, int]:
        """Grading calls, timeouts and errors since the last call (the trainer reads them once per step)."""
        counts, self._step_counts = self._step_counts, math_grading.GradingCounts()
        return {"grading_calls": counts.calls, "grading_timeouts": counts.timeouts, "grading_errors": counts.errors}

    # -- SFT -----------------------------------------------------------------------------------------

    def _encode_answers(self, records: list[Record]) -> tuple[np.ndarray, np.ndarray]:
        """Worked solutions then the end-of-sequence token (the stop token), right-padded."""
        missing = [i for i, r in enumerate(records) if not r.get("solution")]
        if missing:
            raise ValueError(f"SFT records {missing[:5]} have no 'solution' (set config.sft.steps=0 for this source)")
        ids = [e.ids + [self.tokenizer.eos_id] for e in
               self.tokenizer.tokenizer.encode_batch([r["solution"] for r in records], add_special_tokens=False)]
        longest = max(len(x) for x in ids)
        if longest > self.max_new_tokens:
            raise ValueError(f"config.data.max_new_tokens={self.max_new_tokens} is shorter than the longest SFT "
                             f"solution ({longest} tokens with the stop token)")
        return tok_lib.pad_sequences(ids, self.pad_id, length=longest)

    def sft_batch(self, step: int, batch_size: int) -> SFTBatch:
        """Step ``step``'s SFT batch: ``batch_size`` problems of the SFT pool, by epochs of a permutation."""
        if self._sft_answers is None:
            raise ValueError("config.sft.steps > 0 needs a source with worked solutions (config.data.source="
                             "'arithmetic' and config.data.num_sft > 0)")
        n = len(self.sft.records)
        if batch_size > n:
            raise ValueError(f"config.sft.batch_size={batch_size} exceeds the SFT pool (config.data.num_sft={n})")
        epoch, pos = divmod(step, n // batch_size)
        idx = np.random.default_rng([self.seed, 0x5F7, epoch]).permutation(n)[pos * batch_size:(pos + 1) * batch_size]
        answers, answer_lengths = self._sft_answers
        return SFTBatch(self.sft.tokens_PxT[idx], self.sft.lengths_P[idx], answers[idx], answer_lengths[idx])


def make_grader(config: ml_collections.ConfigDict) -> math_grading.Grader:
    """The grader ``config.grading`` describes (ValueError naming a bad rule or backend)."""
    g = config.grading
    if not (isinstance(g.timeout_s, (int, float)) and g.timeout_s > 0):
        raise ValueError(f"config.grading.timeout_s={g.timeout_s!r}: must be a number of seconds > 0")
    if not (isinstance(g.workers, int) and g.workers >= 1):
        raise ValueError(f"config.grading.workers={g.workers!r}: must be an int >= 1")
    if not (isinstance(g.max_error_frac, (int, float)) and 0.0 <= g.max_error_frac <= 1.0):
        raise ValueError(f"config.grading.max_error_frac={g.max_error_frac!r}: must be a fraction in [0, 1]")
    try:
        return math_grading.Grader(rule=g.rule, backend=g.backend, timeout_s=float(g.timeout_s),
                                   num_workers=g.workers)
    except ValueError as e:
        raise ValueError(f"config.grading: {e}") from e


def make_task(config: ml_collections.ConfigDict, tokenizer: tok_lib.TextTokenizer) -> MathTask:
    """The task of ``config.data`` with ``tokenizer``, graded as ``config.grading`` says."""
    train, evals, sft = load_records(config.data)
    if config.sft.steps == 0:
        sft = []
    d = config.data
    return MathTask(tokenizer, train, evals, sft, max_new_tokens=d.max_new_tokens, prompt_suffix=d.prompt_suffix,
                    use_chat_template=d.use_chat_template, system=d.system, max_prompt_tokens=d.max_prompt_tokens,
                    seed=d.seed, grader=make_grader(config), truncation=config.grading.truncation,
                    max_grading_error_frac=config.grading.max_error_frac, prompt_separator=d.prompt_separator,
                    strip_question=d.get("strip_question", True),
                    eval_truncation=config.grading.get("eval_truncation", ""),
                    eval_max_prompt_tokens=d.get("eval_max_prompt_tokens", 0))
