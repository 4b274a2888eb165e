"""Checkpoints: the model, the optimizer, the step and every rank's reader cursor.

    <dir>/step-000000001200/model.pt        rank 0: model, optimizer, step, configs
    <dir>/step-000000001200/cursor-3.pt     each rank: its reader's cursor after that step
    <dir>/latest                            the step of the newest complete checkpoint
    <dir>/best/model.pt                     with --early-stop: the best model evaluated

The folder is a path or a URI (``s3://bucket/checkpoints/...``, through :mod:`flow.storage`):
the ranks of a multi-node run share it. A checkpoint becomes the latest only once every rank's
cursor is written (rank 0 writes ``latest`` after a barrier), so a trainer killed while saving
restarts from the previous one. Files are written whole or not at all (a temporary name moved
into place): a half-written file is never loaded.

A checkpoint belongs to its run: ``model.pt`` records the run's settings
(``TrainConfig.identity``), the channels it read (each one's creation time) and the feature
layout, and :func:`differences` lists what a run about to resume it does otherwise.

A run with another number of ranks resumes too: each of its ranks loads every old rank's
cursor (:func:`flow.handoff.every_rank`), and the readers re-cut the epoch in progress so the
new ranks read exactly the rows the old ones had not (see ``flow.handoff.elastic``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from flow.errors import ConfigError
from flow.handoff import every_rank
from flow.storage import Location, location

__all__ = ["Checkpointer", "differences", "load_file", "save_file"]


def save_file(obj: Any, where: Location, name: str) -> None:
    """``torch.save`` of ``obj`` as ``name`` in ``where``, whole or not at all."""
    with where.writing(name) as out:
        torch.save(obj, out)


def load_file(where: Location, name: str, **options: Any) -> Any:
    """What :func:`save_file` saved (on the CPU unless ``map_location`` says otherwise)."""
    with where.reading(name) as source:
        return torch.load(source, weights_only=False, **{"map_location": "cpu", **options})


class Checkpointer:
    """Saves and finds checkpoints under ``folder``, keeping the newest ``keep``."""

    def __init__(
        self, folder: str | Path | Location, rank: int = 0, world_size: int = 1, keep: int = 3
    ) -> None:
        self.folder = folder if isinstance(folder, Location) else location(str(folder))
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.loaded_from_ranks: int | None = None
        """The number of ranks that wrote the checkpoint :meth:`load` found last."""

    def check_writable(self, setting: str = "--checkpoint-dir") -> None:
        """A ConfigError naming ``setting`` (the one that chose the folder) unless the folder
        can be written: found when the run starts, not at its first checkpoint."""
        self.folder.check_writable(setting)

    def _steps(self) -> list[str]:
        return [name for name in self.folder.list(folders=True) if name.startswith("step-")]

    def clear(self) -> None:
        """Remove every checkpoint in the folder (rank 0; the others wait): ``--fresh``."""
        if self.rank == 0:
            for old in [*self._steps(), "best"]:  # best/: early stopping's best model
                self.folder.child(old).remove()
            self.folder.delete("latest")
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def _step_folder(self, step: int) -> Location:
        return self.folder.child(f"step-{step:012d}")

    def latest(self) -> int | None:
        if not self.folder.exists("latest"):
            return None
        return int(self.folder.read_bytes("latest").decode())

    def save(self, step: int, state: dict[str, Any], cursor: dict[str, Any]) -> Location:
        """Every rank calls this at the same step; ``state`` matters on rank 0 only."""
        target = self._step_folder(step)
        mine = {"cursor": cursor, "world_size": self.world_size}
        save_file(mine, target, f"cursor-{self.rank}.pt")
        if self.rank == 0:
            save_file({**state, "step": step}, target, "model.pt")
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        if self.rank == 0:
            self.folder.write_bytes("latest", str(step).encode())
            self._prune()
        return target

    def load(self, step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(state, this rank's cursor) of ``step`` or the latest; None when there is none.

        Written by another number of ranks, the cursor is :func:`~flow.handoff.every_rank` of
        all of theirs, which a reader (or a mix of them) loads like its own.
        """
        step = self.latest() if step is None else step
        if step is None:
            return None
        target = self._step_folder(step)
        first = self._cursor(target, 0)
        written_by = self.loaded_from_ranks = int(first["world_size"])
        if written_by == self.world_size:
            cursor = first if self.rank == 0 else self._cursor(target, self.rank)
            mine: dict[str, Any] = cursor["cursor"]
        else:
            ranks = [first] + [self._cursor(target, r) for r in range(1, written_by)]
            mine = every_rank([c["cursor"] for c in ranks])
        state: dict[str, Any] = load_file(target, "model.pt")
        return state, mine

    @staticmethod
    def _cursor(target: Location, rank: int) -> dict[str, Any]:
        name = f"cursor-{rank}.pt"
        if not target.exists(name):
            raise ConfigError(
                f"checkpoint {target} has no cursor for rank {rank} (every rank writes one "
                "before a checkpoint is marked the latest): resume from another step"
            )
        cursor: dict[str, Any] = load_file(target, name, map_location=None)
        return cursor

    def _prune(self) -> None:
        for old in self._steps()[: -self.keep]:
            self.folder.child(old).remove()


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    flat: dict[str, Any] = {}
    for key, value in data.items():
        flat |= _flat(value, f"{prefix}.{key}" if prefix else str(key))
    return flat


def differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What ``current`` (a run's identity, channels and layout) does otherwise than the run that
    wrote the checkpoint ``saved``, one ``what: then -> now`` line each; [] when it may resume.

    A channel the checkpoint read that now has another creation time was removed and written
    again: its cursor points into rows that are gone. A channel not there yet when the
    checkpoint was saved (one the run follows later) is no difference."""
    if "identity" not in saved:
        return ["the checkpoint records no run settings (written by an older trainer)"]
    found = []
    then, now = _flat(saved["identity"]), _flat(current["identity"])
    for key in sorted(then.keys() | now.keys()):
        if then.get(key) != now.get(key):
            found.append(f"{key}: {then.get(key)!r} -> {now.get(key)!r}")
    for name, created in sorted(saved.get("channels", {}).items()):
        again = current["channels"].get(name)
        if again is None:
            found.append(f"channel {name}: it no longer exists")
        elif again != created:
            found.append(f"channel {name}: written again (created {created}, now {again})")
    if saved.get("layout") != current["layout"]:
        found.append("the feature layout (the channels were made with another feature state)")
    return found
