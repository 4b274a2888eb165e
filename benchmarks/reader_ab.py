"""Paired A/B of handoff reader variants: passes alternate in one process, pair by pair.

    flow bench reader_ab --variant base='{}' --variant noverify='{"verify": false}'
    flow bench reader_ab --variant a='{"root": "/tmp/chan-a"}' --variant b='{"root": "/tmp/chan-b"}'
    flow bench reader_ab --commits 40 --variant p8='{}' --variant p16='{"prefetch": 16}'

On a shared 2-core machine whose speed drifts by up to 2x over minutes, a difference under
~15 % between two runs of ``flow bench handoff`` (or two processes run one after the other)
is noise. Here every round reads once with each variant, back to back, in alternating order,
so both see the same moment of the machine: the median of the per-round ratios, and how many
rounds a variant won, separate 5 % effects that separate runs cannot.

A variant is ``NAME=JSON``: ``ReadOptions`` fields, plus ``root`` (another channel folder, e.g.
one written with other settings). The first variant is the reference. Without ``--data``, a
channel of ``--rows`` Criteo-shaped rows is written to ``$FLOW_HOME/bench/reader-ab`` first.
Results go to ``$FLOW_HOME/bench/reader_ab-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Any

import torch
from _results import save
from handoff import criteo_rows, handoff_reader, timed_pass, write_channel

from flow.config import StackConfig
from flow.console import console

NEEDS_SERVICES = False  # reading files only: Kafka and MLflow would take CPU it measures

out = console()


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    name, sep, spec = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"variant {text!r}: write NAME=JSON, e.g. base='{{}}'")
    try:
        options = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"variant {name!r}: {spec!r} is not JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise argparse.ArgumentTypeError(f"variant {name!r}: give a JSON object, not {spec!r}")
    return name, options


def rate(default_root: Path, options: dict[str, Any], shuffle: bool) -> float:
    extra = dict(options)
    root = Path(extra.pop("root", default_root))
    shuffled = extra.pop("shuffle", shuffle)
    rows, seconds, _ = timed_pass(lambda: iter(handoff_reader(root, "criteo", shuffled, **extra)))
    return rows / seconds


def compare(
    variants: list[tuple[str, dict[str, Any]]], root: Path, rounds: int, shuffle: bool
) -> dict[str, dict[str, Any]]:
    """Per variant: its rates, and per round its ratio to the first variant's."""
    for _, options in variants:  # untimed: page cache, allocator, imports
        rate(root, options, shuffle)
    rates: dict[str, list[float]] = {name: [] for name, _ in variants}
    with out.status("") as status:
        for r in range(rounds):
            status.update(f"round {r + 1}/{rounds}")
            for name, options in variants if r % 2 == 0 else variants[::-1]:
                rates[name].append(rate(root, options, shuffle))
    reference = rates[variants[0][0]]
    return {
        name: {
            "median_rows_per_s": statistics.median(values),
            "paired_ratio": statistics.median(
                v / b for v, b in zip(values, reference, strict=True)
            ),
            "wins": sum(v > b for v, b in zip(values, reference, strict=True)),
            "rows_per_s": values,
        }
        for name, values in rates.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", type=parse_variant, action="append", required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--unshuffled", action="store_true", help="read in order by default")
    parser.add_argument("--data", type=Path, help="a folder holding a channel named 'criteo'")
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument(
        "--commits",
        type=int,
        default=4,
        help="commits the rows are written in (40: 50k-row micro-batches, as streaming writes)",
    )
    args = parser.parse_args()
    if len(args.variant) < 2:
        parser.error("give at least two --variant, the first being the reference")
    torch.set_num_threads(1)  # as in `flow bench handoff`
    root = args.data
    if root is None:
        root = StackConfig.from_env().home / "bench" / "reader-ab"
        out.print(f"writing {args.rows:,} Criteo-shaped rows in {args.commits} commits to {root}")
        shutil.rmtree(root, ignore_errors=True)
        per = args.rows // args.commits
        chunks = (criteo_rows(per, seed=i) for i in range(args.commits))
        write_channel(root, "criteo", chunks, seed=0)
    results = compare(args.variant, root, args.rounds, not args.unshuffled)
    first = args.variant[0][0]
    for name, r in results.items():
        out.print(
            f"{name:16} median {r['median_rows_per_s'] / 1e6:6.2f}M rows/s   "
            f"paired ratio to {first} {r['paired_ratio']:.3f}   "
            f"won {r['wins']}/{args.rounds} rounds"
        )
    settings = {"variants": dict(args.variant), "rounds": args.rounds, "data": str(root)}
    out.print(f"results: {save('reader_ab', {'settings': settings, 'variants': results})}")


if __name__ == "__main__":
    main()
