from __future__ import annotations

from pathlib import Path

import pytest

from flow.errors import JavaNotFoundError
from flow.stack.java import MIN_JAVA, _major_version, find_java


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_392"', 8),
        ("no version here", None),
    ],
)
def test_java_versions_are_read_from_java_version_output(text: str, major: int | None) -> None:
    assert _major_version(text) == major


def test_the_java_on_this_machine_is_new_enough() -> None:
    assert find_java().major >= MIN_JAVA


def test_a_missing_java_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match=r"no 'java' on PATH.*openjdk-17"):
        find_java()


def test_a_wrong_java_home_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match=f"JAVA_HOME={tmp_path} has no bin/java"):
        find_java()


def test_an_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'java version \"1.8.0_392\"' >&2\n")
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaNotFoundError, match="is Java 8, older than 17"):
        find_java()
