"""The Iceberg catalog from Python (pyiceberg), the same one Spark opens.

For the local stack that is a SQL catalog in a SQLite file: pyiceberg's ``SqlCatalog`` and
Iceberg's Java ``JdbcCatalog`` (``jdbc.schema-version=V1``) read and write the same two tables, so
a table one engine creates the other sees at once. The Java side adds an ``iceberg_type`` column
on first use and treats pyiceberg's rows (where it is NULL) as tables.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog

from flow.config import CatalogConfig

__all__ = ["open_catalog", "pyiceberg_properties"]


def pyiceberg_properties(config: CatalogConfig) -> dict[str, str]:
    """The properties pyiceberg needs to open ``config``."""
    props = dict(config.properties)
    props["warehouse"] = config.warehouse
    if config.type == "sql":
        props["uri"] = f"sqlite:///{config.sqlite_path}"
    else:
        props["type"] = "rest"
        props["uri"] = config.uri
    return props


def open_catalog(config: CatalogConfig) -> Catalog:
    """Open the shared catalog with pyiceberg (creating the SQLite schema on first use)."""
    props = pyiceberg_properties(config)
    if config.type == "sql":
        config.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        if config.warehouse.startswith("file://"):
            Path(urlparse(config.warehouse).path).mkdir(parents=True, exist_ok=True)
        return SqlCatalog(config.name, **props)
    return load_catalog(config.name, **props)
