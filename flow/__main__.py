"""``python -m flow`` is the ``flow`` command."""

from flow.cli import main

main()
