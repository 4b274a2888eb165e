"""``python -m trainers.launch [torchrun options] -m trainers train ...``: torchrun, stopped quietly.

    python -m trainers.launch --standalone --nproc-per-node 2 -m trainers train --channel live

torchrun itself, but a SIGTERM or SIGINT ends it with exit code 128 + the signal and without its
``SignalException`` traceback and shutdown warnings: torchrun passes the signal to its ranks,
and rank 0 says in one line where the trainer stopped (``trainers.lifecycle``). ``flow run
--train`` starts its trainer this way. Everything else (a rank that failed) torchrun reports
as it always does.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["main"]

_SHUTDOWN_SAID = ("death signal, shutting down workers", "closing signal")
"""What torchrun logs as it passes a stop on to its ranks: said by rank 0's line instead."""

_SHUTDOWN_LOGGERS = (
    "torch.distributed.elastic.agent.server.api",
    "torch.distributed.elastic.multiprocessing.api",
)


def _not_shutdown(record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not any(said in message for said in _SHUTDOWN_SAID)


def main(argv: list[str]) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    for name in _SHUTDOWN_LOGGERS:
        logging.getLogger(name).addFilter(_not_shutdown)
    try:
        torchrun(argv)
    except SignalException as stop:
        return 128 + int(stop.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
