"""The planned-figures table of docs/scaling.md and docs/experiments.md, from the planner's saved outputs.

    python scripts/plan_table.py            # print the table of every plan under results/plans/
    python scripts/plan_table.py --write    # rewrite the docs' tables from them
    python scripts/plan_table.py --check    # exit 1, naming the doc, when a doc's table differs from them

Each ``results/plans/NAME.txt`` is the stdout of one ``python -m experiments.plan ... --target/--topology`` run (the
plans saved so far record its former spelling, ``python -m sera_jax.train.plan``, which runs the same), headed by its
``command:``, ``commit:`` and ``date:`` and ended by ``exit CODE wall SECONDS s``. A row of the table is
one plan: the peak per device over its calls (and which call), the FLOPs and roofline time of one step per device
(the pilot, rollout and update calls of an RL step; the image experiment's RL step), the MFU that roofline allows
(the calls' model FLOPs over the step's roofline), the roofline time of one evaluation call, and whether every call fits.
A doc carries the table between ``<!-- plans -->`` and ``<!-- end plans -->``; ``<!-- plans: paper -->`` keeps only
the plans whose config's name contains ``paper``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
PLANS = REPO / "results" / "plans"
DOCS = (REPO / "docs" / "scaling.md", REPO / "docs" / "experiments.md")
BLOCK = re.compile(r"(<!-- plans(?:: (?P<only>\S+))? -->\n)(.*?)(<!-- end plans -->)", re.S)
CALLS = ("pilot sampling", "rollout sampling", "evaluation sampling", "update", "sft step", "ce step", "rl step",
         "validation", "analysis forward", "analysis draw chunk")
STEP_CALLS = ("pilot sampling", "rollout sampling", "update")  # one RL step of a decoder experiment
_BYTES = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_ROW = re.compile(r"(?P<name>" + "|".join(CALLS) + r")\s+(?P<peak>[\d.]+) (?P<unit>B|KiB|MiB|GiB)\s+"
                  r"(?P<flops>[\d.e+-]+)(?P<flops_lb>\*?)\s+(?P<bytes>[\d.e+-]+)\*?\s+(?P<roof>[\d.e+-]+) "
                  r"(?P<roof_unit>s|ms|us)\s+(?P<mfu>[\d.]+)%")


@dataclasses.dataclass(frozen=True)
class Call:
    name: str
    peak_bytes: float
    flops: float
    flops_lower_bound: bool
    roofline_seconds: float
    mfu_bound: float


@dataclasses.dataclass(frozen=True)
class Plan:
    config: str  # e.g. "maze gpu"
    target: str  # "h200", "v5p:2x2x2"
    devices: int
    compiler: str
    calls: dict[str, Call]
    exit_code: int
    command: str = ""
    commit: str = ""


def parse_calls(text: str) -> dict[str, Call]:
    """The rows of the planner's target table (``plan.format_target_table``) by call name."""
    calls = {}
    for line in text.splitlines():
        m = _ROW.match(line)
        if m:
            calls[m["name"]] = Call(m["name"], float(m["peak"]) * _BYTES[m["unit"]], float(m["flops"]),
                                    m["flops_lb"] == "*", float(m["roof"]) * _SECONDS[m["roof_unit"]],
                                    float(m["mfu"]) / 100)
    return calls


def parse_plan(text: str, source: str = "plan") -> Plan:
    """One saved plan; ValueError naming ``source`` when its header or exit line is missing."""
    head = re.search(r"^(\S+) on (\d+) device\(s\) of (\S+); (.*)$", text, re.M)
    exit_line = re.search(r"^exit (\d+)", text, re.M)
    if not head or not exit_line:
        raise ValueError(f"{source}: not a saved target plan (no '<config> on N device(s) of T; compiler' line or "
                         f"no 'exit N' line)")
    config = (head[1].replace("experiments/", "").replace("/config.py:", " ").replace("math_reasoning", "math")
              .replace("imagenet_alignment", "imagenet"))
    field = lambda key: (re.search(rf"^{key}: (.*)$", text, re.M) or [None, ""])[1].strip()  # noqa: E731
    if field("overrides"):  # the config as run: e.g. "math full rl.sample_slots=128"
        config += " " + " ".join(f.removeprefix("--config.") for f in field("overrides").split())
    return Plan(config, head[3], int(head[2]), head[4].strip(), parse_calls(text), int(exit_line[1]),
                field("command"), field("commit"))


def step_calls(plan: Plan) -> list[Call]:
    names = ("rl step",) if "rl step" in plan.calls else STEP_CALLS
    return [plan.calls[n] for n in names if n in plan.calls]


def row(plan: Plan) -> str:
    """One plan's line of the table (figures per device)."""
    if not plan.calls:
        return f"| {plan.config} | {plan.target} | {plan.devices} | (no call compiled) | | | | | no |"
    peak = max(plan.calls.values(), key=lambda c: c.peak_bytes)
    step = step_calls(plan)
    flops = sum(c.flops for c in step)
    roofline = sum(c.roofline_seconds for c in step)
    # Each call's MFU bound is its model FLOPs over (its roofline x peak): weighting by roofline sums model FLOPs.
    mfu = sum(c.mfu_bound * c.roofline_seconds for c in step) / roofline if roofline else 0.0
    lower = "*" if any(c.flops_lower_bound for c in step) else ""
    evaluation = plan.calls.get("evaluation sampling") or plan.calls.get("validation")
    evaluation_text = f"{evaluation.roofline_seconds:.3g} s" if evaluation else ""
    fits = "yes" if plan.exit_code == 0 else "**no**"
    return (f"| {plan.config} | {plan.target} | {plan.devices} | {peak.peak_bytes / 2**30:.1f} ({peak.name}) | "
            f"{flops:.3g}{lower} | {roofline:.3g} s | {mfu:.1%} | {evaluation_text} | {fits} |")


def table(plans: list[Plan]) -> str:
    header = ("| config | target | devices | peak GiB per device (call) | FLOPs per step and device | roofline step "
              "| MFU bound | one evaluation call | fits |\n|---|---|---|---|---|---|---|---|---|")
    order = sorted(plans, key=lambda p: (p.config, p.target, p.devices))
    return "\n".join([header, *(row(p) for p in order)]) + "\n"


def load(directory: pathlib.Path = PLANS) -> list[Plan]:
    return [parse_plan(p.read_text(), str(p)) for p in sorted(directory.glob("*.txt"))]


def render(doc: str, plans: list[Plan]) -> str:
    def block(m: re.Match) -> str:
        chosen = [p for p in plans if not m["only"] or m["only"] in p.config]
        return m[1] + table(chosen) + m[4]

    return BLOCK.sub(block, doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the docs' tables from the saved plans")
    parser.add_argument("--check", action="store_true", help="exit 1 when a doc's table is not the saved plans'")
    args = parser.parse_args(argv)
    plans = load()
    if not (args.check or args.write):
        print(table(plans), end="")
    for doc in DOCS:
        text = doc.read_text() if doc.exists() else ""
        if BLOCK.search(text) and render(text, plans) != text:
            if args.check:
                print(f"{doc.relative_to(REPO)}: its plan table differs from results/plans/ (run python "
                      f"scripts/plan_table.py --write)", file=sys.stderr)
                return 1
            if args.write:
                doc.write_text(render(text, plans))
    return 0


if __name__ == "__main__":
    sys.exit(main())
