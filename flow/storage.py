"""Small files on local disk or object storage, through ``pyarrow.fs``.

A location is a local path or a URI pyarrow understands (``file://``, ``s3://``, ``gs://``,
``hdfs://``). Writes go to a temporary name and are renamed into place, so a reader never sees a
half-written file (on object stores a single PUT is already atomic).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyarrow import fs as pafs

from flow.errors import ConfigError

if TYPE_CHECKING:
    from flow.config import StackConfig

__all__ = ["Location", "NamespaceLocations", "location", "namespace_locations"]


class Location:
    """A folder on some filesystem."""

    def __init__(self, filesystem: pafs.FileSystem, path: str, uri: str) -> None:
        self.fs = filesystem
        self.path = path.rstrip("/")
        base, sep, query = uri.partition("?")
        self.uri = f"{base.rstrip('/')}{sep}{query}"

    def child(self, *parts: str) -> Location:
        suffix = "/".join(parts)
        # A URI may carry options after "?" (s3://b/p?endpoint_override=...): path goes before.
        base, sep, query = self.uri.partition("?")
        return Location(
            self.fs, f"{self.path}/{suffix}", f"{base.rstrip('/')}/{suffix}{sep}{query}"
        )

    def _local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def write_bytes(self, name: str, data: bytes | pa.Buffer) -> str:
        """Write ``name`` in this folder atomically; returns its path."""
        self.fs.create_dir(self.path, recursive=True)
        target = f"{self.path}/{name}"
        if not self._local():
            with self.fs.open_output_stream(target) as out:
                out.write(data)
            return target
        temporary = f"{self.path}/.{name}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(temporary) as out:
            out.write(data)
        self.fs.move(temporary, target)
        return target

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
            reason = " ".join(str(exc).split()) or type(exc).__name__
            # A URI may carry credentials (s3://key:secret@bucket/...): not into a message.
            shown = re.sub(r"://[^/@]*@", "://", self.uri)
            raise ConfigError(
                f"{setting}: cannot write to {shown} ({reason}); set {setting} to a location "
                "this process can write, or fix its permissions"
            ) from exc

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


def location(uri_or_path: str) -> Location:
    """The folder at ``uri_or_path`` (a local path or a filesystem URI)."""
    if "://" not in uri_or_path:
        path = str(Path(uri_or_path).expanduser().resolve())
        return Location(pafs.LocalFileSystem(), path, path)
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
    return NamespaceLocations(
        handoff=location(stack.handoff).child(namespace),
        checkpoints=location(str(stack.checkpoints)).child(namespace),
        feature_state=location(stack.feature_state).child(namespace),
    )
