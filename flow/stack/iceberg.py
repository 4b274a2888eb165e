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

from flow.config import CatalogConfig, S3Config, is_s3
from flow.storage import check_warehouse

__all__ = ["open_catalog", "pyiceberg_properties", "s3_properties"]


def s3_properties(s3: S3Config, *, java: bool) -> dict[str, str]:
    """Iceberg's FileIO properties for the stack's S3 settings: pyiceberg's (``java=False``) or
    the Java S3FileIO's, which name the region and addressing otherwise."""
    props = {"client.region" if java else "s3.region": s3.region}
    if java:
        props["s3.path-style-access"] = str(s3.path_style).lower()
    else:
        props["s3.force-virtual-addressing"] = str(not s3.path_style).lower()
    if s3.endpoint:
        props["s3.endpoint"] = s3.endpoint
    if s3.access_key and s3.secret_key:
        props["s3.access-key-id"] = s3.access_key
        props["s3.secret-access-key"] = s3.secret_key
        if s3.session_token:
            props["s3.session-token"] = s3.session_token
    return props


def pyiceberg_properties(config: CatalogConfig) -> dict[str, str]:
    """The properties pyiceberg needs to open ``config`` (on an S3 warehouse with the stack's
    S3 settings; FLOW_CATALOG_PROPERTIES wins)."""
    props = s3_properties(config.s3, java=False) if is_s3(config.warehouse) else {}
    props.update(config.properties)
    props["warehouse"] = config.warehouse
    if config.type == "sql":
        props["uri"] = f"sqlite:///{config.sqlite_path}"
    else:
        props["type"] = "rest"
        props["uri"] = config.uri
    return props


def open_catalog(config: CatalogConfig) -> Catalog:
    """Open the shared catalog with pyiceberg (creating the SQLite schema on first use); a
    warehouse in S3 is probed first (:func:`flow.storage.check_warehouse`)."""
    check_warehouse(config)
    props = pyiceberg_properties(config)
    if config.type == "sql":
        config.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        if config.warehouse.startswith("file://"):
            Path(urlparse(config.warehouse).path).mkdir(parents=True, exist_ok=True)
        return SqlCatalog(config.name, **props)
    return load_catalog(config.name, **props)
