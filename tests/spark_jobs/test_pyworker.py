"""The lean PySpark worker daemon: archives dropped only when safe, invalidation only on change."""

from __future__ import annotations

import sys
import zipfile
import zipimport
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_jobs import pyworker


def _package(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")


def _zip(path: Path, modules: dict[str, str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, source in modules.items():
            archive.writestr(f"{name}.py", source)
    return path


def test_archives_inside_an_installed_pyspark_leave_the_path_and_others_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _package(site, "pyspark")
    _package(site, "py4j")
    inside = _zip(site / "pyspark" / "python" / "lib" / "pyspark.zip", {"x": ""})
    jar = _zip(site / "pyspark" / "jars" / "spark-core.jar", {"y": ""})
    elsewhere = _zip(tmp_path / "user" / "deps.zip", {"z": ""})
    monkeypatch.setattr(sys, "path", [str(inside), str(jar), str(elsewhere), str(site)])

    assert pyworker.prefer_installed_pyspark() == [str(inside), str(jar)]
    assert sys.path == [str(elsewhere), str(site)]


def test_without_an_installed_pyspark_and_py4j_the_archives_are_the_only_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    _package(site, "pyspark")  # no py4j beside it: the zip inside is still needed
    inside = _zip(site / "pyspark" / "python" / "lib" / "py4j-src.zip", {"py4j": ""})
    monkeypatch.setattr(sys, "path", [str(inside), str(site)])

    assert pyworker.prefer_installed_pyspark() == []
    assert sys.path == [str(inside), str(site)]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="invalidation is lazy from 3.12 on")
def test_an_unchanged_archive_is_not_read_again_and_a_changed_one_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        zipimport.zipimporter, "invalidate_caches", zipimport.zipimporter.invalidate_caches
    )
    reads: list[str] = []
    read_directory = zipimport._read_directory  # type: ignore[attr-defined]

    def counted(archive: str) -> object:
        reads.append(archive)
        return read_directory(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counted)
    archive = _zip(tmp_path / "deps.zip", {"first": "A = 1"})
    importer = zipimport.zipimporter(str(archive))
    pyworker.install()

    importer.invalidate_caches()  # made before install: first invalidation reads once
    importer.invalidate_caches()
    importer.invalidate_caches()
    assert len(reads) == 2  # construction, then the one stamped read
    assert importer.find_spec("second") is None

    _zip(archive, {"first": "A = 1", "second": "B = 2"})
    importer.invalidate_caches()
    assert len(reads) == 3
    assert importer.find_spec("second") is not None


@pytest.mark.integration
def test_local_python_tasks_run_under_it(spark: SparkSession) -> None:
    def where(_: Iterable[object]) -> Iterator[tuple[str, int, bool]]:
        import gc

        import pyspark

        archives = any(p.endswith((".zip", ".jar")) and "pyspark" in p for p in sys.path)
        yield (pyspark.__file__ or "", gc.get_freeze_count(), archives)

    for origin, frozen, archives in (
        spark.range(4, numPartitions=2).rdd.mapPartitions(where).collect()
    ):
        assert not archives  # pyspark's own files, with their bytecode
        assert ".zip" not in origin
        assert frozen > 10_000  # the daemon's imports are exempt from each task's collection
