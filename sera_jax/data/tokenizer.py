"""Tokenizers for the math experiment: a small BPE trained on task text, or a Hugging Face one from disk.

Both kinds end up as a ``TextTokenizer`` read from (or written to) the Hugging Face layout:
``tokenizer.json`` (the `tokenizers` model) plus ``tokenizer_config.json`` (special tokens and a Jinja2
chat template). Nothing here downloads anything.

Batch layout for the sampler: ``encode_prompts`` returns ``tokens_PxT`` (int32) and ``lengths_P`` (int32,
the number of real tokens per prompt). The default is RIGHT padding: prompt ``i`` occupies
``tokens_PxT[i, :lengths_P[i]]`` at positions ``0..lengths_P[i]-1`` and generation continues at position
``lengths_P[i]``; ``padding_side="left"`` instead right-aligns every prompt at column ``T``. In both cases
``lengths_P`` counts real tokens and pads hold ``pad_id``.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import tokenizers
from tokenizers import Regex, decoders, models, pre_tokenizers, trainers

PaddingSide = Literal["left", "right"]
Message = Mapping[str, str]

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
ROLE_TOKENS: tuple[str, ...] = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, *ROLE_TOKENS)

# Chat template of the trained tokenizer: one marker per turn, eos closes assistant turns (the SFT target
# ends with it, so the sampler's stop token is eos). Rendered by the same code path as HF templates.
SIMPLE_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

# GPT-2's split rule, except that each digit is its own pre-token (a leading space may stick to it):
# a small model then does column arithmetic on digits instead of memorising multi-digit tokens.
_SPLIT_PATTERN = r"'(?:s|t|re|ve|m|ll|d)| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class TextTokenizer:
    """A `tokenizers.Tokenizer` with its special-token ids, stop ids and chat template."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        eos_token: str,
        bos_token: str | None = None,
        pad_token: str | None = None,
        chat_template: str | None = None,
        extra_stop_tokens: Sequence[str] = (),
        extra_stop_ids: Sequence[int] = (),
        config: Mapping[str, Any] | None = None,
    ):
        """``pad_token=None`` reuses eos as pad (it is never attended to, so any id works)."""
        self.tokenizer = tokenizer
        self.eos_token, self.bos_token = eos_token, bos_token
        self.pad_token = pad_token if pad_token is not None else eos_token
        self.eos_id = _token_id(tokenizer, eos_token, "eos_token")
        self.bos_id = None if bos_token is None else _token_id(tokenizer, bos_token, "bos_token")
        self.pad_id = _token_id(tokenizer, self.pad_token, "pad_token")
        self.chat_template = chat_template
        stops = [self.eos_id, *(_token_id(tokenizer, t, "stop_tokens") for t in extra_stop_tokens)]
        stops += [int(i) for i in extra_stop_ids]
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys(stops))
        self._config = dict(config or {})

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the embedding needs at least this many rows)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` runs the tokenizer's post-processor (e.g. BOS)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def special_tokens_map(self) -> dict[str, str]:
        """Template variables for the special tokens that are set."""
        names = {"bos_token": self.bos_token, "eos_token": self.eos_token, "pad_token": self.pad_token}
        return {k: v for k, v in names.items() if v is not None}

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = False,
        **template_vars: Any,
    ) -> str:
        """Renders ``messages`` ([{"role", "content"}, ...]) with this tokenizer's Jinja2 chat template."""
        if self.chat_template is None:
            raise ValueError("chat_template: this tokenizer has none (tokenizer_config.json lacks it)")
        variables = {**self.special_tokens_map(), **template_vars}
        return render_chat_template(
            self.chat_template, messages, add_generation_prompt=add_generation_prompt, **variables
        )

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Writes tokenizer.json and tokenizer_config.json (loadable by ``load_tokenizer``)."""
        os.makedirs(directory, exist_ok=True)
        self.tokenizer.save(os.path.join(directory, TOKENIZER_FILE))
        config = {
            **self._config,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "chat_template": self.chat_template,
        }
        with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)


def _token_id(tokenizer: tokenizers.Tokenizer, token: str, field: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"{field}: token {token!r} is not in the vocabulary")
    return token_id


# ----------------------------------------------------------------------------------------------- training


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 512,
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    chat_template: str = SIMPLE_CHAT_TEMPLATE,
) -> TextTokenizer:
    """Trains a byte-level BPE on ``texts`` (e.g. ``envs.arithmetic.corpus()``).

    Byte-level means any text encodes and decodes exactly (no unknown token); merges only ever join
    letters or punctuation, never two digits. Training stops early once every pre-token is one token, so
    ``vocab_size`` is an upper bound. ``special_tokens`` must contain pad, bos and eos (first three).
    """
    if len(special_tokens) < 3:
        raise ValueError(f"special_tokens must start with pad, bos, eos; got {list(special_tokens)}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(special_tokens):
        raise ValueError(f"vocab_size must be >= {len(alphabet) + len(special_tokens)}, got {vocab_size}")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    pad, bos, eos = special_tokens[:3]
    return TextTokenizer(tok, eos_token=eos, bos_token=bos, pad_token=pad, chat_template=chat_template)


# ------------------------------------------------------------------------------------------------ loading


def load_tokenizer(
    directory: str | os.PathLike[str],
    *,
    stop_tokens: Sequence[str] = (),
) -> TextTokenizer:
    """Loads a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json).

    Special tokens come from tokenizer_config.json (strings or {"content": ...}); a missing pad token
    reuses eos. The chat template comes from its "chat_template" field (a string, or a list of named
    templates, of which "default" is used) or from chat_template.jinja. Stop ids are eos, the ids in
    generation_config.json's "eos_token_id" when that file exists, and ``stop_tokens``.
    """
    directory = os.fspath(directory)
    tokenizer_path = os.path.join(directory, TOKENIZER_FILE)
    if not os.path.isfile(tokenizer_path):
        raise FileNotFoundError(
            f"No {TOKENIZER_FILE} in {directory!r}: expected {TOKENIZER_FILE} and {CONFIG_FILE} as saved by "
            "Hugging Face (e.g. the model repo's files, copied from a machine with network access); "
            "sentencepiece-only tokenizer.model directories are not supported."
        )
    tok = tokenizers.Tokenizer.from_file(tokenizer_path)
    config = _read_json(os.path.join(directory, CONFIG_FILE))
    bos, eos, pad = (_token_content(config.get(k)) for k in ("bos_token", "eos_token", "pad_token"))
    if eos is None:
        raise ValueError(f"eos_token: missing from {os.path.join(directory, CONFIG_FILE)}")
    generation = _read_json(os.path.join(directory, GENERATION_CONFIG_FILE))
    extra_ids = generation.get("eos_token_id", [])
    extra_ids = [extra_ids] if isinstance(extra_ids, int) else list(extra_ids or [])
    return TextTokenizer(
        tok,
        eos_token=eos,
        bos_token=bos,
        pad_token=pad,
        chat_template=_chat_template(directory, config),
        extra_stop_tokens=stop_tokens,
        extra_stop_ids=extra_ids,
        config={k: v for k, v in config.items() if k == "model_max_length"},
    )


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _token_content(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, an AddedToken dict, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and "content" in value:
        return value["content"]
    raise ValueError(f"special token: cannot read {value!r}")


def _chat_template(directory: str, config: Mapping[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t["name"]: t["template"] for t in template}
        template = named.get("default")
    if template is None and os.path.isfile(os.path.join(directory, CHAT_TEMPLATE_FILE)):
        with open(os.path.join(directory, CHAT_TEMPLATE_FILE), encoding="utf-8") as f:
            template = f.read()
    return template


# ----------------------------------------------------------------------------------------- chat templates


@functools.lru_cache(maxsize=16)
def _compile_template(template: str) -> Any:
    """Jinja2 environment configured like Hugging Face's chat-template renderer."""
    try:
        import jinja2
        from jinja2 import ext, sandbox
    except ImportError as e:  # pragma: no cover - jinja2 is a declared dependency
        raise ImportError("chat templates need jinja2: pip install 'jinja2>=3.1'") from e

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(fmt)

    env = sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def render_chat_template(
    template: str,
    messages: Sequence[Message],
    *,
    add_generation_prompt: bool = False,
    **variables: Any,
) -> str:
    """Renders a Hugging Face chat template (Jinja2, sandboxed) for ``messages``.

    ``variables`` are passed to the template as-is (``bos_token``, ``eos_token``, ``enable_thinking``...).
    """
    for i, message in enumerate(messages):
        if "role" not in message or "content" not in message:
            raise ValueError(f"messages[{i}] needs 'role' and 'content', got keys {sorted(message)}")
    return _compile_template(template).render(
        messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables
    )


# ------------------------------------------------------------------------------------------ batch layout


def pad_sequences(
    seqs: Sequence[Sequence[int]],
    pad_id: int,
    *,
    length: int | None = None,
    padding_side: PaddingSide = "right",
) -> tuple[np.ndarray, np.ndarray]:
    """Packs token lists into ``(tokens_PxT int32, lengths_P int32)``.

    ``length`` fixes T (a static shape for jit); by default T is the longest sequence. A sequence longer
    than ``length`` is an error rather than silently cut, since a cut prompt changes the task.
    """
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    lengths_P = np.array([len(s) for s in seqs], dtype=np.int32)
    longest = int(lengths_P.max(initial=0))
    if length is None:
        length = longest
    elif longest > length:
        raise ValueError(f"length: sequence {int(lengths_P.argmax())} has {longest} tokens > length={length}")
    tokens_PxT = np.full((len(seqs), length), pad_id, dtype=np.int32)
    for i, s in enumerate(seqs):
        if len(s):
            if padding_side == "right":
                tokens_PxT[i, : len(s)] = s
            else:
                tokens_PxT[i, length - len(s) :] = s
    return tokens_PxT, lengths_P


def encode_prompts(
    tokenizer: TextTokenizer,
    prompts: Sequence[str],
    *,
    length: int | None = None,
    padding_side: PaddingSide = "right",
    add_special_tokens: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Encodes already-rendered prompt strings into ``(tokens_PxT, lengths_P)`` (see module docstring).

    Prompts rendered by a chat template already carry their special tokens, hence
    ``add_special_tokens=False`` by default.
    """
    encodings = tokenizer.tokenizer.encode_batch(list(prompts), add_special_tokens=add_special_tokens)
    seqs = [e.ids for e in encodings]
    empty = [i for i, s in enumerate(seqs) if not s]
    if empty:
        raise ValueError(f"prompts: prompt(s) {empty} encode to no tokens")
    return pad_sequences(seqs, tokenizer.pad_id, length=length, padding_side=padding_side)


def encode_chat_prompts(
    tokenizer: TextTokenizer,
    user_texts: Sequence[str],
    *,
    system: str | None = None,
    length: int | None = None,
    padding_side: PaddingSide = "right",
    **template_vars: Any,
) -> tuple[np.ndarray, np.ndarray]:
    """One user turn per prompt, rendered with the chat template plus the generation prompt, then encoded."""
    rendered = []
    for text in user_texts:
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": text}
        ]
        rendered.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **template_vars))
    return encode_prompts(tokenizer, rendered, length=length, padding_side=padding_side)


def find_stop(
    tokens_BxR: np.ndarray,
    stop_ids: Sequence[int],
    lengths_B: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row: number of tokens before the first stop token, and whether a stop token was found.

    Rows are B sampled responses of R tokens. Only the first ``lengths_B[b]`` tokens of row b count (all R
    if None); a row without a stop token in that range was cut by the length limit, i.e. truncated.
    """
    tokens_BxR = np.asarray(tokens_BxR)
    if tokens_BxR.ndim != 2:
        raise ValueError(f"tokens_BxR must be 2-D, got shape {tokens_BxR.shape}")
    num_rows, num_cols = tokens_BxR.shape
    valid_BxR = np.ones((num_rows, num_cols), dtype=bool)
    if lengths_B is not None:
        valid_BxR = np.arange(num_cols)[None, :] < np.asarray(lengths_B)[:, None]
    is_stop_BxR = np.isin(tokens_BxR, np.asarray(list(stop_ids))) & valid_BxR
    finished_B = is_stop_BxR.any(axis=1)
    cut_B = np.where(finished_B, is_stop_BxR.argmax(axis=1), valid_BxR.sum(axis=1))
    return cut_B.astype(np.int32), finished_B


def decode_responses(
    tokenizer: TextTokenizer,
    tokens_BxR: np.ndarray,
    *,
    lengths_B: np.ndarray | None = None,
    stop_ids: Sequence[int] | None = None,
    skip_special_tokens: bool = True,
) -> tuple[list[str], np.ndarray]:
    """Decodes sampled response rows (response tokens only, no prompt) up to their first stop token.

    Returns the texts and ``truncated_B`` (True where no stop token occurred: graders score those 0).
    """
    cut_B, finished_B = find_stop(tokens_BxR, tokenizer.stop_ids if stop_ids is None else stop_ids, lengths_B)
    rows = np.asarray(tokens_BxR)
    texts = tokenizer.tokenizer.decode_batch(
        [rows[b, : cut_B[b]].tolist() for b in range(rows.shape[0])], skip_special_tokens=skip_special_tokens
    )
    return texts, ~finished_B
