"""The local Iceberg catalog: no process of its own, just a SQLite file and a warehouse folder."""

from __future__ import annotations

import sqlite3

from flow.config import StackConfig
from flow.stack.service import Progress, ServiceStatus

__all__ = ["CatalogService"]


class CatalogService:
    """``flow services`` for the SQL catalog both engines share."""

    name = "iceberg"

    def __init__(self, stack: StackConfig) -> None:
        self.stack = stack
        self.config = stack.catalog

    @property
    def address(self) -> str:
        if self.config.type == "sql":
            return f"sqlite:{self.config.sqlite_path}"
        return self.config.uri

    def _table_count(self) -> int | None:
        path = self.config.sqlite_path
        if not path.exists():
            return None
        try:
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                row = db.execute(
                    "SELECT count(*) FROM iceberg_tables WHERE catalog_name = ?",
                    (self.config.name,),
                ).fetchone()
        except sqlite3.Error:
            return None
        return int(row[0])

    def status(self) -> ServiceStatus:
        if self.config.type != "sql":
            return ServiceStatus(
                self.name, "external", self.address, detail=f"REST catalog {self.config.name}"
            )
        count = self._table_count()
        if count is None:
            return ServiceStatus(self.name, "stopped", self.address, detail="not initialised")
        return ServiceStatus(
            self.name, "ready", self.address, detail=f"catalog {self.config.name}: {count} table(s)"
        )

    def up(self, progress: Progress) -> ServiceStatus:
        if self.config.type == "sql" and self._table_count() is None:
            from flow.stack.iceberg import open_catalog  # pyiceberg + SQLAlchemy: only when needed

            progress(f"iceberg: creating the SQL catalog {self.address}")
            open_catalog(self.config)
        return self.status()

    def down(self) -> ServiceStatus:
        # Nothing runs; the catalog's files stay, like a stopped broker keeps its topics.
        return self.status()
