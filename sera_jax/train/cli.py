"""The command line every experiment shares.

    python -m experiments.NAME.main --config=experiments/NAME/config.py:VARIANT --workdir=DIR \
        [--config.rl.learning_rate=3e-4 ...] [--multihost]

``run_main(make_main(run))`` defines nothing per experiment: ``--config`` (an ml_collections config file with a
variant after the colon; fields are overridden with ``--config.a.b=value``), ``--workdir``, ``--multihost`` and
``--stop_after`` (the simulated kill: ``sera_jax.train.loop.StepAllowance``) are defined here once. A list field takes
its items comma-separated, names as numbers (``--config.methods=uniform,sera`` as ``--config.seeds=0,1``; see
``split_comma_lists``). Ctrl-C ends a run with one line saying how to resume it (``interrupted_message``).
Command-line mistakes end with one clear line instead of a traceback:
an unknown flag (absl's message), and an override of a field the config does not have, which
ml_collections reports as a bare ``AttributeError: 'bogus'`` -- here it names the field and close matches.
So do the run's own user errors (``is_user_error``: a bad config value, a missing dataset or model directory,
an unusable workdir): ``FATAL <type>: <message>`` on stderr, exit status 1; ``--pdb_post_mortem`` keeps the
traceback (and the debugger) for them.
"""

from __future__ import annotations

import ast
import importlib.util
import linecache
import pathlib
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags
from ml_collections.config_flags import tuple_parser

from sera_jax.train import config_utils
from sera_jax.train.distributed import maybe_initialize_distributed

# Defined here directly (a module is imported once per process), so absl records this module as theirs and
# each experiment's main can show them in --helpshort with ``flags.adopt_module_key_flags(cli)``.
CONFIG = config_flags.DEFINE_config_file(
    "config", None,
    "experiments/NAME/config.py:VARIANT (variants: tiny, demo, cpu, gpu, full); override fields with "
    "--config.a.b=value", lock_config=True)
WORKDIR = flags.DEFINE_string(
    "workdir", None, "Where checkpoints, metrics, results.json and figures go; a rerun with the same workdir resumes.")
MULTIHOST = flags.DEFINE_bool("multihost", False, "Join a multi-host job (jax.distributed.initialize).")
STOP_AFTER = flags.DEFINE_integer(
    "stop_after", None, "Stop after this many optimizer steps of this invocation, as a kill would (tests); a rerun "
    "resumes.")

_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")


def config_overrides(argv: Sequence[str]) -> list[str]:
    """Dotted field paths of the ``--config.a.b=...`` overrides in ``argv``, in order."""
    return [m.group(1) for arg in argv if (m := _OVERRIDE.match(arg))]


def override_values(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(dotted field path, value as typed) of the ``--config.a.b=value`` and ``--config.a.b value`` overrides in
    ``argv``, in order."""
    found = []
    for i, arg in enumerate(argv):
        if m := re.match(r"^--?config\.([^=]+)=(.*)$", arg, re.DOTALL):
            found.append((m.group(1), m.group(2)))
        elif (m := re.match(r"^--?config\.([^=]+)$", arg)) and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            found.append((m.group(1), argv[i + 1]))
    return found


def comma_words(text: str) -> tuple[str, ...] | None:
    """The items of an override typed as comma-separated words (``uniform,sera``), or None for any other value
    (a Python literal such as ``0,1`` or ``('a', 'b')``, which ml_collections reads itself)."""
    if "," not in text:
        return None
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return tuple(word.strip() for word in text.split(",") if word.strip())
    return None


def split_comma_lists(config: Any, argv: Sequence[str]) -> None:
    """Gives each tuple field overridden with comma-separated words in ``argv`` those words as its items:
    ml_collections parses ``--config.seeds=0,1`` as ``(0, 1)`` but ``--config.methods=uniform,sera`` as
    ``("uniform,sera",)``, one name. A field given more than once gets the items of all its overrides."""
    typed: dict[str, list[str]] = {}
    for path, text in override_values(argv):
        typed.setdefault(path, []).append(text)
    for path, texts in typed.items():
        if (not isinstance(config_utils.get_field(config, path, None), tuple)
                or all(comma_words(text) is None for text in texts)):
            continue
        items = []
        for text in texts:
            words = comma_words(text)
            items.extend(tuple_parser.TupleParser().parse(text) if words is None else words)
        *parents, name = path.split(".")
        node = config
        for key in parents:
            node = node[key]
        node[name] = tuple(items)


def load_config_spec(spec: str) -> Any:
    """The config a ``--config=path.py[:variant]`` flag names, loaded the way ml_collections loads it."""
    path, _, variant = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("_sera_cli_config", path)
    if module_spec is None or not pathlib.Path(path).is_file():
        raise ValueError(f"--config={spec}: no config file {path!r}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(variant) if variant else module.get_config()


def explain_override_error(argv: Sequence[str]) -> str | None:
    """The message for the first override in ``argv`` that names no field of the config, if any."""
    spec = next((a.split("=", 1)[1] for a in argv if re.match(r"^--?config=", a)), None)
    if spec is None:
        return "--config.FIELD overrides need --config=path/to/config.py:VARIANT before them"
    try:
        config = load_config_spec(spec)
    except Exception as e:  # the config file itself is broken: let its own message through
        return f"--config={spec} could not be loaded: {e}"
    for path in config_overrides(argv):
        try:
            config_utils.get_field(config, path)
        except ValueError as e:
            return f"--config.{path}: unknown config field ({e})"
    return None


# The project's documented bad-input errors (CONTRIBUTING: a ValueError or FileNotFoundError naming the problem).
USER_ERRORS = (ValueError, FileNotFoundError)
PROJECT_PACKAGES = ("sera_jax", "experiments", "__main__")


def is_user_error(error: BaseException) -> bool:
    """True for an expected user error: a ``USER_ERRORS`` exception that this project's code raised with a
    ``raise`` statement, so its message was written to name the problem. The same types raised inside a library
    (JAX, orbax) or by a builtin failing in our code are more likely bugs and keep their traceback."""
    if not isinstance(error, USER_ERRORS) or error.__traceback__ is None:
        return False
    tb = error.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "")
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip()
    return module.split(".")[0] in PROJECT_PACKAGES and line.startswith("raise ")


def strip_traceback(message: str) -> str:
    """``message`` without a formatted traceback inside it, keeping the traceback's last line (the exception):
    ml_collections puts the config file's whole traceback into its flag error (e.g. for an unknown variant)."""
    head, found, trace = message.partition("Traceback (most recent call last):")
    if not found:
        return message
    lines = [line.strip() for line in trace.splitlines() if line.strip()]
    return " ".join(part for part in (head.strip(), lines[-1] if lines else "") if part)


def _fatal(message: str) -> None:
    sys.stderr.write(f"FATAL Flags parsing error: {strip_traceback(message)}\n"
                     "Pass --helpshort or --helpfull to see help on flags.\n")
    sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
    """``flags.FLAGS(argv)`` with a one-line message (exit status 1) for every command-line mistake."""
    try:
        rest = flags.FLAGS(argv)
        if CONFIG.value is not None:
            split_comma_lists(CONFIG.value, argv)
        return rest
    except flags.Error as e:  # unknown flag, bad value, missing required flag, a config file that raised
        _fatal(str(e))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        # ml_collections parses the overrides while parsing --config; a missing field surfaces as a bare
        # AttributeError/KeyError, a bad config file or value as TypeError/ValueError.
        _fatal(explain_override_error(argv) or f"{type(e).__name__}: {e}")
    raise AssertionError("unreachable")


def rerun_command(argv: Sequence[str], module: str | None = None) -> str:
    """The command line that started this program (``argv``: ``sys.argv``; ``module``: the ``-m`` module it ran
    as, default ``__main__``'s), to be typed again."""
    if module is None:
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None else None
    head = ["python", "-m", module] if module else ["python", argv[0]]
    return shlex.join([*head, *argv[1:]])


def interrupted_message(argv: Sequence[str], workdir: str, module: str | None = None) -> str:
    """The one line a run stopped by Ctrl-C prints: the command that resumes it from its last checkpoint."""
    return (f"Interrupted. The same command with the same --workdir={workdir} resumes from the last checkpoint: "
            f"{rerun_command(argv, module)}")


def run_once(body: Callable[[], Any], *, workdir: str, argv: Sequence[str], post_mortem: bool = False) -> None:
    """Calls ``body()`` (a run in ``workdir``, started by the command ``argv``), ending with one line instead of a
    traceback for Ctrl-C (exit status 130; the command that resumes it) and for a user error (``is_user_error``;
    exit status 1; with ``post_mortem`` the error is raised, for the debugger)."""
    try:
        body()
    except KeyboardInterrupt:
        sys.stderr.write(interrupted_message(argv, workdir) + "\n")
        sys.exit(130)
    except USER_ERRORS as e:
        if not is_user_error(e) or post_mortem:
            raise
        sys.stderr.write(f"FATAL {type(e).__name__}: {e}\n")
        sys.exit(1)


def make_main(run: Callable[..., Any], *, multihost: bool = True) -> Callable[[list[str]], None]:
    """The absl ``main(argv)`` that calls ``run(config, workdir, stop_after=...)`` once the flags are parsed.

    ``multihost=False`` refuses ``--multihost`` for experiments that do not support it.
    """
    def main(argv: list[str]) -> None:
        if len(argv) > 1:
            raise app.UsageError(f"unexpected arguments: {argv[1:]}")
        if CONFIG.value is None or not WORKDIR.value:
            raise app.UsageError("--config=experiments/NAME/config.py:VARIANT and --workdir=DIR are required")
        if MULTIHOST.value and not multihost:
            raise app.UsageError("--multihost: this experiment runs on one host only")
        logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO

        def body() -> None:
            maybe_initialize_distributed(MULTIHOST.value)
            run(CONFIG.value, WORKDIR.value, stop_after=STOP_AFTER.value)

        run_once(body, workdir=WORKDIR.value, argv=sys.argv, post_mortem=flags.FLAGS.pdb_post_mortem)

    return main


def run_main(main: Callable[[list[str]], None]) -> None:
    """``app.run`` with this module's flag parser: a program's ``__main__``."""
    app.run(main, flags_parser=parse_flags)
