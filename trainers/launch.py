"""``python -m trainers.launch [torchrun options] -m trainers train ...``: torchrun, quieter.

    python -m trainers.launch --standalone --nproc-per-node 2 -m trainers train --channel live

torchrun itself, but a SIGTERM or SIGINT ends it with exit code 128 + the signal and without its
``SignalException`` traceback and shutdown warnings: torchrun passes the signal to its ranks,
and rank 0 says in one line where the trainer stopped (``trainers.lifecycle``). ``flow run
--train`` starts its trainer this way. A rank that failed (having said why, ``error: ...``) ends
it with one line that names the rank and its exit code, in place of torchrun's traceback.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["main"]

_SAID_BY_RANKS = ("death signal, shutting down workers", "closing signal", "failed (exitcode")
"""What torchrun logs as it passes a stop on to its ranks, or of a rank that failed: said by the
rank's own line (and, for a failure, the one line here) instead."""

_LOGGERS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
)


def _not_said_by_ranks(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not any(said in message for said in _SAID_BY_RANKS)


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    for name in _LOGGERS:
        logging.getLogger(name).addFilter(_not_said_by_ranks)
    try:
        torchrun(argv)
    except SignalException as stop:
        return 128 + int(stop.sigval)
    except ChildFailedError as failed:
        # The rank said why itself (``error: ...``); torchrun's table of it adds a traceback.
        rank, failure = failed.get_first_failure()
        how = (
            f"was killed by {failure.signal_name()}"
            if failure.exitcode < 0
            else f"exited with code {failure.exitcode}"
        )
        print(f"trainer failed: rank {rank} {how}; its error is above", file=sys.stderr)
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
