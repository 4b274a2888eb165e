"""The project's own Spark operators, compiled once into the jar cache with the JDK's javac."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from flow.errors import JavaNotFoundError
from flow.stack import project_jar as built
from flow.stack.jars import pyspark_jars_dir


def test_the_operators_are_compiled_once_and_the_jar_is_reused(tmp_path: Path) -> None:
    jar = built.project_jar(tmp_path, pyspark_jars_dir())
    with zipfile.ZipFile(jar) as opened:
        assert "flow/spark/ImmediatePositives.class" in opened.namelist()
    made = jar.stat().st_mtime_ns
    assert built.project_jar(tmp_path, pyspark_jars_dir()) == jar
    assert jar.stat().st_mtime_ns == made  # not compiled again
    assert [p.name for p in (tmp_path / built.FOLDER).iterdir()] == [jar.name]  # no leftovers


def test_a_changed_source_makes_a_jar_of_another_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = built.project_jar(tmp_path, pyspark_jars_dir())
    copies = []
    for source in built.sources():
        copy = tmp_path / "src" / source.name
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(source.read_text())
        copies.append(copy)
    with copies[-1].open("a") as changed:
        changed.write("\n// changed\n")
    monkeypatch.setattr(built, "sources", lambda: copies)
    assert built.project_jar(tmp_path, pyspark_jars_dir()) != first


def test_a_runtime_without_javac_is_told_to_install_a_jdk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    java_home = tmp_path / "jre"
    (java_home / "bin").mkdir(parents=True)
    java = java_home / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"17.0.15\" 2025-04-15' >&2\n")
    java.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(JavaNotFoundError, match=r"JDK.*openjdk-17-jdk-headless"):
        built.project_jar(tmp_path, pyspark_jars_dir())


def test_a_source_that_does_not_compile_is_reported_with_javac_s_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "Broken.java"
    broken.write_text("package flow.spark; public final class Broken { int x = ; }\n")
    monkeypatch.setattr(built, "sources", lambda: [broken])
    with pytest.raises(JavaNotFoundError, match=r"(?s)could not compile.*Broken\.java:1: error"):
        built.project_jar(tmp_path, pyspark_jars_dir())
    assert not list((tmp_path / built.FOLDER).glob("*.jar"))
