"""``python -m trainers COMMAND``: the trainers' entry point.

    torchrun --nproc-per-node 2 -m trainers train --namespace ctr --channel backfill --epochs 2
    python -m trainers train --channel live --follow --export-every 1000 --register-as ctr
    python -m trainers doctor [--require-gpu] [--json]

``train --help`` lists every option (model, optimizer, mixing, checkpoints, tracking).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

COMMANDS = ("train", "doctor")


def _train(argv: list[str]) -> int:
    from flow.config import StackConfig
    from flow.errors import FlowError
    from trainers.config import parse, parser
    from trainers.train import train

    stack = StackConfig.from_env()
    try:
        config = parse(argv, stack)
        result = train(config, tracking_uri=stack.mlflow.tracking_uri)
    except FlowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    summary = {
        **asdict(result),
        "samples_per_s": result.samples_per_s,
        "data_stall_fraction": result.stall_fraction,
        "freshness_s": {
            name: {"p50": result.freshness(0.5, name), "p99": result.freshness(0.99, name)}
            for name in result.freshness_s
        },
    }
    target = parser().parse_known_args(argv)[0].result_file
    if target is not None and result.leader:
        target.write_text(json.dumps(summary, indent=2, default=str))
    if result.leader:
        print("trainer: " + json.dumps(summary, default=str))
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m trainers {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    if argv[0] == "train":
        return _train(argv[1:])
    from trainers.doctor import main as doctor

    return doctor(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
