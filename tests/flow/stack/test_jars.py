from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from flow import versions
from flow.config import StackConfig
from flow.errors import ArtifactResolutionError
from flow.stack import jars
from tests.support import stack_env_for


def _stack(tmp_path: Path, **env: str) -> StackConfig:
    return StackConfig.from_env({"FLOW_HOME": str(tmp_path), **env})


def test_coordinates_parse_and_print_back() -> None:
    c = jars.Coordinate.parse("org.apache.kafka:kafka_2.13:4.1.2")
    assert (c.group, c.artifact, c.version) == ("org.apache.kafka", "kafka_2.13", "4.1.2")
    assert str(c) == "org.apache.kafka:kafka_2.13:4.1.2"
    with pytest.raises(ValueError, match="group:artifact:version"):
        jars.Coordinate.parse("kafka_2.13:4.1.2")


def test_the_spark_profile_pins_the_versions_of_flow_versions() -> None:
    names = {str(c) for c in jars.PROFILES["spark"].coordinates}
    assert f"org.apache.spark:spark-sql-kafka-0-10_2.13:{versions.SPARK}" in names
    assert f"org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:{versions.ICEBERG}" in names
    assert f"io.delta:delta-spark_4.1_2.13:{versions.DELTA}" in names
    assert f"org.xerial:sqlite-jdbc:{versions.SQLITE_JDBC}" in names


def test_ivy_module_excludes_test_jars_and_spark_modules_before_overrides() -> None:
    xml = jars.ivy_module_xml(jars.PROFILES["spark"], ["jackson-databind", "spark-core_2.13"])
    assert '<exclude org="*" module="*" type="test-jar"/>' in xml
    assert '<exclude org="*" module="jackson-databind"/>' in xml
    # Ivy's schema rejects an <override> before an <exclude>.
    assert xml.rindex("<exclude") < xml.index("<override")
    assert re.search(r'<override org="org.apache.spark" module="spark-token-provider', xml)


def test_ivy_failures_are_parsed_into_coordinates() -> None:
    output = """
        :::::::::::::::::::::::::::::::::::::::::::::
        ::          UNRESOLVED DEPENDENCIES         ::
        :::::::::::::::::::::::::::::::::::::::::::::
        :: org.apache.spark#spark-token-provider-kafka-0-10_2.13;4.1.3: not found
        :::::::::::::::::::::::::::::::::::::::::::::
        ::              FAILED DOWNLOADS            ::
        :: ^ see resolution messages for details  ^ ::
        :::::::::::::::::::::::::::::::::::::::::::::
        :: org.apache.kafka#kafka_2.13;4.1.2!kafka_2.13.jar
    """
    assert jars.parse_ivy_failures(output) == [
        ("org.apache.spark:spark-token-provider-kafka-0-10_2.13:4.1.3", "not found"),
        ("org.apache.kafka:kafka_2.13:4.1.2", "download of kafka_2.13.jar failed"),
    ]


def test_offline_without_a_cache_says_how_to_fetch(tmp_path: Path) -> None:
    with pytest.raises(ArtifactResolutionError, match=r"FLOW_OFFLINE=1.*flow jars fetch"):
        jars.resolve("kafka", _stack(tmp_path, FLOW_OFFLINE="1"))


def test_an_unknown_profile_lists_the_profiles(tmp_path: Path) -> None:
    with pytest.raises(ArtifactResolutionError, match="profiles: spark, spark-s3, kafka"):
        jars.resolve("hadoop", _stack(tmp_path))


def _copy_cached(profile: str, home: Path) -> Path:
    """A private copy of the shared jar cache (resolved into it first if need be)."""
    shared = StackConfig.from_env(
        {"FLOW_HOME": str(home / "shared"), "FLOW_JAR_CACHE": stack_env_for(home)["FLOW_JAR_CACHE"]}
    )
    source = jars.resolve(profile, shared).folder
    shutil.copytree(source, home / "jars" / profile)
    return home / "jars" / profile


def test_a_current_cache_is_reused_offline_and_a_truncated_jar_is_not(tmp_path: Path) -> None:
    folder = _copy_cached("kafka", tmp_path)
    stack = _stack(tmp_path, FLOW_OFFLINE="1")
    resolved = jars.resolve("kafka", stack, verify=True)
    assert any(p.name == f"kafka_2.13-{versions.KAFKA_BROKER}.jar" for p in resolved.jars)

    manifest = json.loads((folder / jars.MANIFEST).read_text())
    victim = folder / manifest["jars"][0]["file"]
    victim.write_bytes(victim.read_bytes()[:100])
    with pytest.raises(ArtifactResolutionError, match="FLOW_OFFLINE=1"):
        jars.resolve("kafka", stack)


@pytest.mark.integration
def test_a_missing_artifact_is_named_in_the_error(tmp_path: Path) -> None:
    empty_repo = tmp_path / "empty-repo"
    empty_repo.mkdir()
    stack = _stack(tmp_path, FLOW_MAVEN_REPO=empty_repo.as_uri())
    with pytest.raises(ArtifactResolutionError) as caught:
        jars.resolve("kafka", stack)
    message = str(caught.value)
    assert f"org.apache.kafka:kafka_2.13:{versions.KAFKA_BROKER}" in message
    assert "FLOW_MAVEN_REPO" in message
    assert f"org.apache.kafka:kafka_2.13:{versions.KAFKA_BROKER}" in caught.value.artifacts
    assert not (stack.jar_cache / "kafka" / jars.MANIFEST).exists()


@pytest.mark.integration
def test_profiles_resolved_at_once_lock_their_shared_cache_and_fail_in_the_order_asked(
    tmp_path: Path,
) -> None:
    """``flow jars fetch`` resolves its profiles at the same time into one Ivy cache: a lock per
    download keeps the two JVMs from writing the same file, and the error is the first profile's."""
    empty_repo = tmp_path / "empty-repo"
    empty_repo.mkdir()
    stack = _stack(tmp_path, FLOW_MAVEN_REPO=empty_repo.as_uri())
    with pytest.raises(ArtifactResolutionError) as caught:
        jars.resolve_all(["kafka", "spark"], stack)
    assert f"org.apache.kafka:kafka_2.13:{versions.KAFKA_BROKER}" in caught.value.artifacts
    for profile in ("kafka", "spark"):
        settings = (stack.jar_cache / f"{profile}.staging" / "ivysettings.xml").read_text()
        assert 'lockStrategy="artifact-lock-nio"' in settings  # without it: no lock at all
        assert (stack.jar_cache / f"{profile}.staging" / "ivy.log").exists()  # both ran
        assert not (stack.jar_cache / profile / jars.MANIFEST).exists()


def test_profiles_resolved_at_once_come_back_in_the_order_asked(tmp_path: Path) -> None:
    _copy_cached("kafka", tmp_path)
    _copy_cached("spark", tmp_path)
    stack = _stack(tmp_path, FLOW_OFFLINE="1")
    found = jars.resolve_all(["spark", "kafka", "spark"], stack)
    assert [resolved.profile for resolved, _ in found] == ["spark", "kafka"]
    assert all(seconds >= 0 for _, seconds in found)
