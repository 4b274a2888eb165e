"""The local session's ``file:`` file systems (spark_jobs.conf.FORKLESS_FILES): the project's,
which do what Hadoop's do without starting a process for each file."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_jobs.jvm import hadoop_conf, jvm

pytestmark = pytest.mark.integration


def _local(spark: SparkSession) -> tuple[Any, Any, Any]:
    """Hadoop's classes, the FileSystem and the FileContext a session opens ``file:`` with."""
    hadoop = jvm(spark).org.apache.hadoop.fs
    conf = hadoop_conf(spark)
    fs = hadoop.FileSystem.get(jvm(spark).java.net.URI("file:///"), conf)
    return hadoop, fs, hadoop.FileContext.getLocalFSFileContext(conf)


def test_a_local_session_writes_checkpoints_through_the_forkless_file_systems(
    spark: SparkSession,
) -> None:
    _, fs, context = _local(spark)
    assert fs.getClass().getName() == "flow.spark.ForklessLocalFileSystem"
    assert fs.getRaw().getClass().getName() == "flow.spark.ForklessRawLocalFileSystem"
    assert context.getDefaultFileSystem().getClass().getName() == "flow.spark.ForklessLocalFs"


def test_files_get_the_permissions_asked_and_renames_replace_as_hadoops_do(
    spark: SparkSession, tmp_path: Path
) -> None:
    hadoop, _, context = _local(spark)
    files = context.getDefaultFileSystem()
    first = hadoop.Path(f"file://{tmp_path}/first")
    second = hadoop.Path(f"file://{tmp_path}/second")
    permission = hadoop.permission.FsPermission.createImmutable(0o640)
    for path, text in ((first, b"one"), (second, b"two")):
        out = context.create(path).permission(permission).build()
        out.write(bytearray(text))
        out.close()
    # (Hadoop's umask, 022 unless fs.permissions.umask-mode says otherwise, leaves 640 alone)
    assert stat.S_IMODE(os.stat(tmp_path / "first").st_mode) == 0o640
    files.renameInternal(first, second, True)  # what Spark's checkpoint commit calls
    assert (tmp_path / "second").read_bytes() == b"one"
    assert not (tmp_path / "first").exists()
    with pytest.raises(Exception, match="FileNotFoundException"):
        files.getFileLinkStatus(first)


def test_a_symbolic_link_is_still_reported_as_one(spark: SparkSession, tmp_path: Path) -> None:
    hadoop, fs, _ = _local(spark)
    (tmp_path / "target").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    plain = fs.getRaw().getFileLinkStatus(hadoop.Path(str(tmp_path / "target")))
    link = fs.getRaw().getFileLinkStatus(hadoop.Path(str(tmp_path / "link")))
    assert not plain.isSymlink()
    assert link.isSymlink()
    assert str(link.getSymlink().toUri().getPath()) == str(tmp_path / "target")
