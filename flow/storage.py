"""Small files on local disk or object storage, through ``pyarrow.fs``.

A location is a local path or a URI pyarrow understands (``file://``, ``s3://``, ``gs://``,
``hdfs://``). Writes go to a temporary name and are renamed into place, so a reader never sees a
half-written file (on object stores a single PUT is already atomic).

An ``s3://`` (or ``s3a://``) location takes its endpoint, region and credentials from the one
S3 configuration (:class:`flow.config.S3Config`: ``FLOW_S3_*`` and the standard AWS variables),
the same that Spark and pyiceberg get; a URI that carries its own options
(``s3://bucket/path?endpoint_override=...``) keeps them.
"""

from __future__ import annotations

import functools
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyarrow import fs as pafs

from flow.config import CatalogConfig, S3Config, StackConfig, is_s3
from flow.errors import ConfigError

__all__ = [
    "CountingHandler",
    "Location",
    "NamespaceLocations",
    "check_storage",
    "check_warehouse",
    "counting_location",
    "location",
    "namespace_locations",
    "s3_filesystem",
    "setting_location",
]


#: How S3 clients say what is wrong (lower case), for an error that names the fix.
_NO_BUCKET = ("nosuchbucket", "bucket does not exist", "not found. to create buckets")
_UNREACHABLE = ("couldn't connect", "could not connect", "resolve host", "connection refused",
                "curlcode: 7", "curlcode: 6", "timed out")  # fmt: skip
_DENIED = ("accessdenied", "access denied", "forbidden", "403", "invalidaccesskeyid",
           "signaturedoesnotmatch")  # fmt: skip


class Location:
    """A folder on some filesystem."""

    def __init__(
        self, filesystem: pafs.FileSystem, path: str, uri: str, s3: S3Config | None = None
    ) -> None:
        self.fs = filesystem
        self.s3 = s3
        """The S3 settings an ``s3://`` location was opened with (None: its URI's own)."""
        self.path = path.rstrip("/")
        base, sep, query = uri.partition("?")
        self.uri = f"{base.rstrip('/')}{sep}{query}"

    def child(self, *parts: str) -> Location:
        suffix = "/".join(parts)
        # A URI may carry options after "?" (s3://b/p?endpoint_override=...): path goes before.
        base, sep, query = self.uri.partition("?")
        return Location(
            self.fs, f"{self.path}/{suffix}", f"{base.rstrip('/')}/{suffix}{sep}{query}", self.s3
        )

    @property
    def name(self) -> str:
        """The folder's own name (the last part of its path)."""
        return self.path.rsplit("/", 1)[-1]

    def parent(self) -> Location:
        """The folder holding this one (a URI's options kept)."""
        base, sep, query = self.uri.partition("?")
        head = base.rstrip("/").rsplit("/", 1)[0]
        return Location(self.fs, self.path.rsplit("/", 1)[0], f"{head}{sep}{query}", self.s3)

    def _local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def _object_store(self) -> bool:
        """Whether folders are only key prefixes here (S3, GCS, Azure), so a write needs no
        folder made first: pyarrow's ``create_dir`` costs an object store a HEAD or a marker
        PUT per level, on every commit's three writes (``flow bench commits --store moto``)."""
        fs = self.fs
        if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, CountingHandler):
            fs = fs.handler.inner
        return isinstance(fs, (pafs.S3FileSystem, pafs.GcsFileSystem, pafs.AzureFileSystem))

    @property
    def hadoop_uri(self) -> str:
        """This folder as Spark's Hadoop file systems name it (a streaming checkpoint's
        location): a local path, or ``s3a://bucket/path`` read with the stack's S3 settings."""
        if self._local():
            return self.path
        if isinstance(self.fs, pafs.S3FileSystem):
            if _own_options(self.uri):
                raise ConfigError(
                    f"{_shown(self.uri)}: Spark cannot read S3 options or credentials written in "
                    "a URI; give the plain s3://bucket/path and set FLOW_S3_ENDPOINT, "
                    "FLOW_S3_REGION and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY instead"
                )
            return f"s3a://{self.path}"
        return self.uri

    def write_bytes(self, name: str, data: bytes | pa.Buffer) -> str:
        """Write ``name`` in this folder atomically; returns its path."""
        if self._local():
            with self.writing(name) as out:
                out.write(data)
        else:  # one PUT of the whole: an object store shows all of it or nothing
            if not self._object_store():
                self.fs.create_dir(self.path, recursive=True)
            with self.fs.open_output_stream(f"{self.path}/{name}") as out:
                out.write(data)
        return f"{self.path}/{name}"

    @contextmanager
    def writing(self, name: str) -> Iterator[pa.NativeFile]:
        """A stream that becomes ``name`` in this folder, whole, when the block ends, and never
        when it raises: it writes a temporary file (object) moved into place at the end."""
        self.fs.create_dir(self.path, recursive=True)
        temporary = f".{name}.{uuid.uuid4().hex}.tmp"
        try:
            with self.fs.open_output_stream(f"{self.path}/{temporary}") as out:
                yield out
            self.fs.move(f"{self.path}/{temporary}", f"{self.path}/{name}")
        except BaseException:
            self.delete(temporary)
            raise

    def reading(self, name: str) -> pa.NativeFile:
        """``name`` in this folder, open for random access (close it, or use ``with``)."""
        return self.fs.open_input_file(f"{self.path}/{name}")

    def delete(self, name: str) -> None:
        """Delete the file ``name`` in this folder; nothing happens if it does not exist."""
        if self.exists(name):
            self.fs.delete_file(f"{self.path}/{name}")

    def check_writable(self, setting: str) -> None:
        """Raise a ConfigError naming ``setting`` unless files can be written here.

        Creates the folder, writes a small probe file and deletes it (on an object store: a PUT
        and a DELETE), so that a stage or a trainer finds an unwritable location before it
        reads or fits anything, not after. The probe's name starts with "." (see :meth:`list`).
        """
        probe = f"{self.path}/.flow-probe-{uuid.uuid4().hex}"
        try:
            self.fs.create_dir(self.path, recursive=True)
            with self.fs.open_output_stream(probe) as out:
                out.write(b"probe")
            self.fs.delete_file(probe)
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(
                f"{setting}: cannot write to {_shown(self.uri)}{self._why(exc, setting)}"
            ) from exc

    def _why(self, exc: BaseException, setting: str) -> str:
        """What a failed probe means, and what to change, in one line."""
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if not isinstance(self.fs, pafs.S3FileSystem):
            return (
                f" ({reason}); set {setting} to a location this process can write, or fix its "
                "permissions"
            )
        bucket = self.path.split("/", 1)[0]
        endpoint = (self.s3.endpoint if self.s3 else None) or "AWS S3"
        lowered = reason.lower()
        if any(sign in lowered for sign in _NO_BUCKET):
            return (
                f": bucket {bucket!r} does not exist at {endpoint}; create it "
                f"(aws s3 mb s3://{bucket}) or set {setting} to a bucket that exists"
            )
        if any(sign in lowered for sign in _UNREACHABLE):
            return (
                f": the S3 endpoint {endpoint} cannot be reached; check FLOW_S3_ENDPOINT "
                f"(or AWS_ENDPOINT_URL) and that the server runs ({reason})"
            )
        if any(sign in lowered for sign in _DENIED):
            return (
                f": access to bucket {bucket!r} at {endpoint} is denied; check "
                f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket's policy ({reason})"
            )
        return f" ({reason}); check FLOW_S3_ENDPOINT, FLOW_S3_REGION and the AWS credentials"

    def check_readable(self, setting: str) -> None:
        """Raise a ConfigError naming ``setting`` unless this folder can be listed (it may not
        exist yet, but its bucket must): for readers, which need not be allowed to write."""
        try:
            self.fs.get_file_info(self.path)
            # S3 answers "not found" for a key in a bucket that does not exist, as for a
            # folder not made yet: a reader would wait for channels that can never appear.
            bucket = self.path.split("/", 1)[0]
            missing = (
                isinstance(self.fs, pafs.S3FileSystem)
                and self.fs.get_file_info(bucket).type == pafs.FileType.NotFound
            )
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(
                f"{setting}: cannot read {_shown(self.uri)}{self._why(exc, setting)}"
            ) from exc
        if missing:
            raise ConfigError(
                f"{setting}: cannot read {_shown(self.uri)}"
                + self._why(OSError(f"NoSuchBucket: {bucket}"), setting)
            )

    def check_checkpoint(self, setting: str) -> None:
        """:meth:`check_writable`, and that Spark can use this folder as a streaming query's
        checkpoint (:attr:`hadoop_uri`): both found before any work, naming ``setting``."""
        try:
            self.hadoop_uri  # noqa: B018 (the check is its raising)
        except ConfigError as exc:
            raise ConfigError(f"{setting}: {exc}") from None
        self.check_writable(setting)

    def read_bytes(self, name: str) -> bytes:
        with self.fs.open_input_stream(f"{self.path}/{name}") as src:
            return bytes(src.read())

    def exists(self, name: str = "") -> bool:
        path = f"{self.path}/{name}" if name else self.path
        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def remove(self) -> None:
        """Delete this folder and everything in it; nothing happens if it does not exist."""
        if self.exists():
            self.fs.delete_dir(self.path)

    def list(self, suffix: str = "", *, folders: bool = False) -> list[str]:
        """Names in this folder ending with ``suffix``, sorted; [] if the folder does not exist.

        Files, or with ``folders`` the sub-folders. Names starting with "." are left out: they
        are files being written (see :meth:`write_bytes`) or not ours.
        """
        if not self.exists():
            return []
        wanted = pafs.FileType.Directory if folders else pafs.FileType.File
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=False))
        return sorted(
            i.base_name
            for i in infos
            if i.type == wanted and i.base_name.endswith(suffix) and not i.base_name.startswith(".")
        )

    def __str__(self) -> str:
        return self.uri


def _own_options(uri: str) -> bool:
    """Whether ``uri`` carries its own options or credentials (``s3://k:s@b/p?region=...``)."""
    return "?" in uri or "@" in uri.partition("://")[2].partition("/")[0]


def _shown(uri: str) -> str:
    """``uri`` without credentials (``s3://key:secret@bucket/...``): fit for a message."""
    return re.sub(r"://[^/@]*@", "://", uri)


_S3_VARIABLES = ("FLOW_S3_", "AWS_")


def _s3_config() -> S3Config:
    """The S3 configuration of this process's environment (an executor's too)."""
    return _s3_config_of(
        tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_S3_VARIABLES)))
    )


@functools.lru_cache(maxsize=8)
def _s3_config_of(items: tuple[tuple[str, str], ...]) -> S3Config:
    return S3Config.from_env(dict(items))


@functools.lru_cache(maxsize=8)
def s3_filesystem(config: S3Config, *, connect_timeout: float = 5.0) -> pafs.S3FileSystem:
    """pyarrow's S3 client for ``config``: one per configuration, shared by every location."""
    options: dict[str, object] = {
        "region": config.region,
        "scheme": config.scheme,
        "force_virtual_addressing": not config.path_style and config.endpoint is not None,
        "connect_timeout": connect_timeout,
    }
    if config.endpoint_host:
        options["endpoint_override"] = config.endpoint_host
    if config.access_key and config.secret_key:
        options.update(access_key=config.access_key, secret_key=config.secret_key)
        if config.session_token:
            options["session_token"] = config.session_token
    return pafs.S3FileSystem(**options)


def setting_location(uri_or_path: str, setting: str, s3: S3Config | None = None) -> Location:
    """:func:`location`, with a URI no filesystem here understands (``s3x://``, a typo) a
    ConfigError naming ``setting``, not pyarrow's error from deep inside a run."""
    try:
        return location(uri_or_path, s3)
    except (pa.ArrowException, OSError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ConfigError(
            f"{setting}: {_shown(uri_or_path)} is not a location this process can open "
            f"({reason}); give a local path or an s3:// (gs://, hdfs://) URI"
        ) from exc


def location(uri_or_path: str, s3: S3Config | None = None) -> Location:
    """The folder at ``uri_or_path`` (a local path or a filesystem URI); an ``s3://`` one with
    ``s3`` (default: the S3 settings of this process's environment)."""
    if "://" not in uri_or_path:
        path = str(Path(uri_or_path).expanduser().resolve())
        return Location(pafs.LocalFileSystem(), path, path)
    if is_s3(uri_or_path) and not _own_options(uri_or_path):
        path = uri_or_path.split("://", 1)[1].rstrip("/")
        config = s3 or _s3_config()
        return Location(s3_filesystem(config), path, f"s3://{path}", config)
    filesystem, path = pafs.FileSystem.from_uri(uri_or_path)
    return Location(filesystem, path, uri_or_path)


@dataclass(frozen=True)
class NamespaceLocations:
    """Where a pipeline namespace keeps its data: one folder of each kind."""

    handoff: Location
    """The namespace's handoff location: its channels are folders in it."""
    checkpoints: Location
    """Streaming queries' and trainers' checkpoints."""
    feature_state: Location
    """Fitted feature states (one folder per spec)."""


def namespace_locations(stack: StackConfig, namespace: str) -> NamespaceLocations:
    """The folders of ``namespace`` under the stack's roots.

    The one place a namespace's paths are made: a root may be a URI with options after ``?``
    (``s3://bucket/handoff?endpoint_override=...``), which string concatenation would put the
    namespace after. :meth:`Location.child` puts it in the path.
    """
    if not namespace or "/" in namespace or namespace in (".", ".."):
        raise ConfigError(f"namespace {namespace!r}: give a plain name (letters, digits, _ or -)")

    def root(uri: str, setting: str) -> Location:
        return setting_location(uri, setting, stack.s3).child(namespace)

    return NamespaceLocations(
        handoff=root(stack.handoff, "FLOW_HANDOFF"),
        checkpoints=root(stack.checkpoints, stack.checkpoints_from),
        feature_state=root(stack.feature_state, "FLOW_FEATURE_STATE"),
    )


_checked: set[tuple[str, str]] = set()


def check_storage(stack: StackConfig, *settings: str) -> None:
    """Probe each of the stack's roots in S3 named by ``settings`` (default: all of them) once
    per process, with a PUT and a DELETE: a missing bucket, an endpoint that cannot be reached
    or refused credentials is one line naming the setting and the fix before any work, not an
    ``OSError`` after the read or the fit.

    The warehouse is probed with the stack's S3 settings only where FLOW_CATALOG_PROPERTIES
    gives none of its own (``s3.*``), which Iceberg would then use instead.
    """
    roots = {
        "FLOW_WAREHOUSE": stack.catalog.warehouse,
        "FLOW_HANDOFF": stack.handoff,
        "FLOW_CHECKPOINTS": stack.checkpoints,
        "FLOW_FEATURE_STATE": stack.feature_state,
    }
    for setting in settings or tuple(roots):
        if setting == "FLOW_WAREHOUSE":
            check_warehouse(stack.catalog)
        else:
            _probe_once(setting, roots[setting], stack.s3)


def check_warehouse(catalog: CatalogConfig) -> None:
    """:func:`check_storage` of the catalog's warehouse alone (pyiceberg's ``open_catalog``)."""
    if not any(key.startswith("s3.") for key in catalog.properties):
        _probe_once("FLOW_WAREHOUSE", catalog.warehouse, catalog.s3)


def _probe_once(setting: str, uri: str, s3: S3Config) -> None:
    if is_s3(uri) and (setting, uri) not in _checked:
        location(uri, s3).check_writable(setting)
        _checked.add((setting, uri))


class CountingHandler(pafs.FileSystemHandler):  # type: ignore[misc]
    """A filesystem that counts its calls by kind (``list``, ``info``, ``get``, ``put``,
    ``move``, ``delete``, ``mkdir``) and passes them on: what an object store would bill as
    requests. Tests hold mechanisms to their request counts with it; ``flow bench commits``
    reports them."""

    def __init__(self, inner: pafs.FileSystem | None = None) -> None:
        self.inner = inner or pafs.LocalFileSystem()
        self.calls: dict[str, int] = {}

    def _count(self, kind: str, n: int = 1) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + n

    def total(self) -> int:
        return sum(self.calls.values())

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return id(self)

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        self._count("info", len(paths))
        return list(self.inner.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self._count("list")
        return list(self.inner.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self._count("mkdir")
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self._count("delete")
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._count("delete")
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("a counting filesystem does not delete its root's contents")

    def delete_file(self, path: str) -> None:
        self._count("delete")
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self._count("move")
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self._count("put")
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self._count("get")
        return self.inner.open_input_stream(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        self._count("get")
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: object = None) -> pa.NativeFile:
        self._count("put")
        return self.inner.open_output_stream(path)

    def open_append_stream(self, path: str, metadata: object = None) -> pa.NativeFile:
        self._count("put")
        return self.inner.open_append_stream(path)


def counting_location(where: str | Location) -> tuple[Location, CountingHandler]:
    """The folder ``where`` (a local path, or any :class:`Location`: an S3 bucket's folder)
    through a :class:`CountingHandler`, and the handler."""
    if isinstance(where, str):
        resolved = str(Path(where).expanduser().resolve())
        where = Location(pafs.LocalFileSystem(), resolved, resolved)
    handler = CountingHandler(where.fs)
    return Location(pafs.PyFileSystem(handler), where.path, where.uri, where.s3), handler
