"""Config validation at the program boundary, config fingerprints, and JSON conversion.

Every error names the offending field by its dotted path (`config.model.num_layers`), so a bad
`--config.x=y` override fails with a message a user can act on.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

_MISSING = object()
_ABSENT = object()  # get_field's default for a field that may be absent (_MISSING there means "required")
Check = type | tuple[type, ...] | Callable[[Any], bool]


def is_int(x: Any) -> bool:
    """A Python int that is not a bool (``True`` as a count is a mistake, not a number)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    """A finite Python int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_fraction(x: Any) -> bool:
    """A number in [0, 1] (``is_number``)."""
    return is_number(x) and 0 <= x <= 1


def _is_dict(x: Any) -> bool:
    return isinstance(x, (Mapping, ml_collections.ConfigDict))


def _is_record(x: Any) -> bool:
    """A parsed, typed settings record (a dataclass or NamedTuple, e.g. ``sera_jax.rl.settings``): fields by name."""
    return (dataclasses.is_dataclass(x) and not isinstance(x, type)) or (isinstance(x, tuple) and hasattr(x, "_fields"))


def has_field(node: Any, key: str) -> bool:
    """Whether a config (or a mapping, or a settings record) has the field ``key``."""
    return key in node if _is_dict(node) else _is_record(node) and hasattr(node, key)


def get_field(config: Any, path: str, default: Any = _MISSING) -> Any:
    """The value at dotted `path` ("optim.lr") of a config, a mapping or a settings record; ValueError naming the
    path if absent and no default."""
    node = config
    parts = path.split(".")
    for i, key in enumerate(parts):
        if not has_field(node, key):
            if default is not _MISSING:
                return default
            where = ".".join(parts[:i]) or "<root>"
            keys = sorted(node.keys()) if _is_dict(node) else []
            close = difflib.get_close_matches(key, keys, n=3)
            hint = f" (did you mean {close}?)" if close else ""
            raise ValueError(f"config.{path} is missing: config.{where} has no field {key!r}{hint}")
        node = node[key] if _is_dict(node) else getattr(node, key)
    return node


def _type_name(check: type | tuple[type, ...]) -> str:
    types = check if isinstance(check, tuple) else (check,)
    return " or ".join(t.__name__ for t in types)


def require(config: Any, path: str, check: Check, message: str = "") -> Any:
    """Returns `config.<path>` after checking it; ValueError naming the field otherwise.

    `check` is a type (or tuple of types; bools are not accepted as numbers) or a predicate.
    """
    value = get_field(config, path)
    if isinstance(check, (type, tuple)):
        types = check if isinstance(check, tuple) else (check,)
        # bool is an int subclass; `True` as a layer count is a mistake, not a number.
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            detail = message or f"expected {_type_name(check)}, got {type(value).__name__}"
            raise ValueError(f"config.{path}={value!r}: {detail}")
    else:
        try:
            ok = bool(check(value))
        except Exception as e:  # A predicate that crashes on the value is a failed check.
            raise ValueError(f"config.{path}={value!r}: {message or 'invalid value'} ({e})") from e
        if not ok:
            raise ValueError(f"config.{path}={value!r}: {message or 'invalid value'}")
    return value


class Rule(NamedTuple):
    """One field's check for :func:`check_fields`: :func:`require`'s arguments. ``optional``: passed over where the
    config lacks the field (one saved before the field existed)."""

    path: str
    check: Check
    message: str = ""
    optional: bool = False


def check_fields(config: Any, rules: Iterable[Rule]) -> None:
    """Checks every rule in order (:func:`require` each): ValueError naming the first field that fails. A program
    states its fields' rules as a list and checks them here in one pass, at its door."""
    for rule in rules:
        if rule.optional and get_field(config, rule.path, _ABSENT) is _ABSENT:
            continue
        require(config, rule.path, rule.check, rule.message)


def unknown_fields(config: Any, reference: Any, prefix: str = "") -> list[tuple[str, list[str]]]:
    """(dotted path, close matches) for every field of `config` that `reference` does not have.

    Recurses into sub-dicts that are dicts in both (ConfigDict turns every dict value into a
    sub-config, so dict-valued fields are checked key by key too).
    """
    found: list[tuple[str, list[str]]] = []
    ref_keys = sorted(reference.keys())
    for key in sorted(config.keys()):
        path = f"{prefix}{key}"
        if key not in reference:
            found.append((path, difflib.get_close_matches(key, ref_keys, n=3)))
        elif _is_dict(config[key]) and _is_dict(reference[key]):
            found.extend(unknown_fields(config[key], reference[key], prefix=f"{path}."))
    return found


def check_no_unknown_fields(config: Any, reference: Any) -> None:
    """Raises ValueError listing every unknown field of `config` with close matches in `reference`."""
    found = unknown_fields(config, reference)
    if found:
        lines = [f"config.{path}" + (f" (did you mean {', '.join(close)}?)" if close else "")
                 for path, close in found]
        raise ValueError("unknown config field(s): " + "; ".join(lines))


def to_jsonable(x: Any, path: str = "") -> Any:
    """Converts configs, numpy/jax scalars and arrays (recursively) into JSON-serialisable values.

    Tuples become lists; arrays become nested lists; non-finite floats stay floats (Python's json
    writes them as NaN/Infinity). Anything else unknown raises ValueError naming where it was.
    """
    if isinstance(x, ml_collections.ConfigDict):
        x = x.to_dict()  # resolves FieldReferences
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v, f"{path}[{i}]") for i, v in enumerate(x)]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    if isinstance(x, np.dtype):
        return x.name
    if isinstance(x, type):  # jnp.float32, jnp.bfloat16 given as config values
        try:
            dtype = np.dtype(x)
        except TypeError:
            dtype = np.dtype(object)
        if dtype != np.dtype(object):
            return dtype.name
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(dataclasses.asdict(x), path)
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        arr = np.asarray(jax.device_get(x))
        if jnp.issubdtype(arr.dtype, jnp.floating):
            arr = arr.astype(np.float64)  # bfloat16/float16 -> Python floats
        elif jnp.issubdtype(arr.dtype, jnp.complexfloating):
            raise ValueError(f"{path or 'value'}: complex values cannot be written to JSON")
        return arr.tolist()
    raise ValueError(f"{path or 'value'}: cannot convert {type(x).__name__} to JSON")


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-able dict of the whole config (for results.json and checkpoint metadata)."""
    return to_jsonable(config)


def _leaves(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key in value:
            out.update(_leaves(value[key], f"{path}.{key}"))
        return out
    return {path: value}


def fingerprint(config: Any, fields: Sequence[str], exclude: Sequence[str] = ()) -> dict[str, Any]:
    """{dotted field: JSON value} of the fields that change shapes or semantics of saved state.

    A field that is a sub-config contributes each of its leaves ("model" -> "model.d_model", ...), so a
    mismatch names the leaf that changed; leaves at or under a path in ``exclude`` ("rl.steps") are left
    out. Checkpoints store it; restoring under a config with a different fingerprint is refused with the
    differing fields named (see `diff_fingerprints`).
    """
    found: dict[str, Any] = {}
    for path in sorted(set(fields)):
        found.update(_leaves(to_jsonable(get_field(config, path), path), path))
    dropped = tuple(exclude)
    return {k: v for k, v in sorted(found.items())
            if not any(k == e or k.startswith(e + ".") for e in dropped)}


def fingerprint_digest(fp: Mapping[str, Any]) -> str:
    """A short, stable hash of a fingerprint (key order and tuple/list spelling do not matter)."""
    canonical = json.dumps(to_jsonable(fp), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _same(a: Any, b: Any) -> bool:
    """Equality of JSON values where NaN equals NaN (a NaN field should not look changed)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _show(value: Any) -> str:
    return "<absent>" if value is _MISSING else json.dumps(value)


# Fields added after runs were saved, with the value that reproduces what those runs did: a saved fingerprint
# without one matches a current config holding that value (so a run saved before the field existed resumes).
ADDED_FIELDS = {"maze.num_train": 0, "sera.epoch_discount": 0.75, "sera.epoch_prior": [0.5, 0.5],
                "sera.activation_threshold": 0.05, "sera.loss_microbatch_rows": 0, "optim.max_grad_norm": 0.0,
                "eval.bootstrap_repeats": 0, "eval.bootstrap_seed": 42}


def diff_fingerprints(
    saved: Mapping[str, Any], current: Mapping[str, Any], names: tuple[str, str] = ("checkpoint", "current")
) -> list[str]:
    """Human-readable lines 'field: checkpoint=X, current=Y' for every field that differs."""
    saved, current = to_jsonable(saved), to_jsonable(current)
    lines = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key, _MISSING), current.get(key, _MISSING)
        if a is _MISSING and key in ADDED_FIELDS and b is not _MISSING and _same(b, to_jsonable(ADDED_FIELDS[key])):
            continue
        if a is _MISSING or b is _MISSING or not _same(a, b):
            lines.append(f"{key}: {names[0]}={_show(a)}, {names[1]}={_show(b)}")
    return lines

