"""The Spark side of Primus Flow: the session factory, job launching and the Spark jobs.

Imports ``flow`` (the engine-neutral core), never ``trainers``: the two sides meet only at the
handoff format. Registered with ``flow`` as the ``spark`` engine (entry point
``primus_flow.engines``).
"""

__all__: list[str] = []
