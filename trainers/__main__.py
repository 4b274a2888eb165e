"""``python -m trainers COMMAND``: the trainers' entry point.

python -m trainers doctor [--require-gpu] [--json]
"""

from __future__ import annotations

import sys

COMMANDS = ("doctor",)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m trainers {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
        return 2
    from trainers.doctor import main as doctor

    return doctor(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
