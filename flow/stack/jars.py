"""JVM artifacts from Maven Central, resolved once into a project-local cache.

Resolution runs Apache Ivy, the copy that ships inside pyspark (``pyspark/jars/ivy-*.jar``), so no
build tool is needed beyond Java. Each *profile* (the Spark connectors, the Kafka broker) is
retrieved into its own folder with a ``manifest.json`` recording what was asked for and what came
back. While the manifest matches the pinned versions and the files are intact, nothing touches the
network again; ``FLOW_OFFLINE=1`` makes that a rule.

The Spark profile leaves out every module pyspark already ships: Delta's POM, for instance, asks
for jackson 2.13 and hadoop as compile dependencies, and older copies of Spark's own libraries on
the classpath break Spark. Spark's jars always win.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import quoteattr

from flow import versions
from flow.config import StackConfig
from flow.errors import ArtifactResolutionError, DependencyMissingError
from flow.stack.java import find_java

__all__ = [
    "PROFILES",
    "Coordinate",
    "JarProfile",
    "ResolvedJars",
    "ivy_module_xml",
    "parse_ivy_failures",
    "pyspark_jars_dir",
    "resolve",
    "resolve_all",
]

MANIFEST = "manifest.json"
_JAR_NAME = re.compile(r"^(?P<module>.+?)-(?P<version>\d.*)\.jar$")
# The longest prefix before a version (spark-sql-kafka-0-10_2.13-4.1.3.jar: the module
# spark-sql-kafka-0-10_2.13), which _JAR_NAME cuts short; _JAR_NAME stays as it is because the
# Spark profile's cache key holds the pyspark modules it names.
_MODULE = re.compile(r"^(?P<module>.+)-\d[^-]*(?:-[A-Za-z][\w.]*)?\.jar$")


@dataclass(frozen=True, order=True)
class Coordinate:
    """A Maven ``group:artifact:version``."""

    group: str
    artifact: str
    version: str

    @classmethod
    def parse(cls, text: str) -> Coordinate:
        parts = text.split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{text!r} is not a Maven coordinate group:artifact:version")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


@dataclass(frozen=True)
class JarProfile:
    """A set of artifacts resolved together into one folder."""

    name: str
    coordinates: tuple[Coordinate, ...]
    overrides: tuple[Coordinate, ...] = ()
    """Force these versions wherever the module appears in the dependency tree."""
    exclude_spark_provided: bool = False
    """Leave out every module pyspark's own ``jars/`` folder already has."""
    driver_classpath: tuple[str, ...] = ()
    """Artifact names that must also sit on the JVM's system classpath (JDBC drivers)."""
    transitive: bool = True
    """False: the coordinates' own jars only, none of their dependencies."""
    purpose: str = ""
    connectors: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Per connector a job can leave out (flow.engine.CONNECTORS), the modules only it needs:
    :meth:`ResolvedJars.without` drops them. A module no connector names is always kept."""


def _spark(artifact: str, version: str) -> Coordinate:
    return Coordinate("org.apache.spark", f"{artifact}_{versions.SCALA}", version)


PROFILES: dict[str, JarProfile] = {
    profile.name: profile
    for profile in (
        JarProfile(
            name="spark",
            coordinates=(
                _spark("spark-sql-kafka-0-10", versions.SPARK),
                Coordinate(
                    "org.apache.iceberg",
                    f"iceberg-spark-runtime-4.1_{versions.SCALA}",
                    versions.ICEBERG,
                ),
                Coordinate("io.delta", f"delta-spark_4.1_{versions.SCALA}", versions.DELTA),
                Coordinate("org.xerial", "sqlite-jdbc", versions.SQLITE_JDBC),
            ),
            overrides=(_spark("spark-token-provider-kafka-0-10", versions.KAFKA_TOKEN_PROVIDER),),
            exclude_spark_provided=True,
            driver_classpath=("sqlite-jdbc",),
            connectors=(
                (
                    "kafka",
                    (
                        f"spark-sql-kafka-0-10_{versions.SCALA}",
                        f"spark-token-provider-kafka-0-10_{versions.SCALA}",
                        "kafka-clients",
                        "commons-pool2",
                    ),
                ),
                (
                    "delta",
                    (
                        f"delta-spark_4.1_{versions.SCALA}",
                        "delta-storage",
                        "delta-kernel-api",
                        "delta-kernel-defaults",
                        "delta-kernel-unitycatalog",
                        "unitycatalog-client",
                        "unitycatalog-hadoop",
                        # Delta's POM asks for jackson 2.13's; pyspark has its own jackson.
                        "jackson-datatype-jdk8",
                    ),
                ),
            ),
            purpose="Spark connectors: Kafka, Iceberg, Delta, SQLite JDBC",
        ),
        JarProfile(
            name="spark-s3",
            coordinates=(
                Coordinate("org.apache.iceberg", "iceberg-aws-bundle", versions.ICEBERG),
                Coordinate("org.apache.hadoop", "hadoop-aws", versions.HADOOP),
                Coordinate("software.amazon.awssdk", "s3-transfer-manager", versions.AWS_SDK),
            ),
            # The bundle carries the AWS SDK S3A needs; hadoop-aws's POM would add the 600 MB
            # SDK bundle and Hadoop itself, which pyspark has.
            transitive=False,
            purpose="S3: Iceberg's S3FileIO and Hadoop's S3A (checkpoints) for s3:// locations",
        ),
        JarProfile(
            name="kafka",
            coordinates=(
                Coordinate("org.apache.kafka", f"kafka_{versions.SCALA}", versions.KAFKA_BROKER),
                Coordinate("org.apache.logging.log4j", "log4j-slf4j-impl", versions.LOG4J),
            ),
            purpose="the local Kafka broker (KRaft), run in its own JVM",
        ),
    )
}


@dataclass(frozen=True)
class ResolvedJars:
    """The jars of one profile, ready to put on a classpath."""

    profile: str
    folder: Path
    jars: tuple[Path, ...]
    driver_classpath: tuple[Path, ...] = field(default=())

    @property
    def classpath(self) -> str:
        return ":".join(str(p) for p in self.jars)

    def without(self, modules: Iterable[str]) -> ResolvedJars:
        """These jars less those of ``modules`` (artifact names, as in ``kafka-clients``)."""
        left_out = frozenset(modules)
        jars = tuple(p for p in self.jars if _module(p) not in left_out)
        driver = tuple(p for p in self.driver_classpath if _module(p) not in left_out)
        return ResolvedJars(self.profile, self.folder, jars, driver)


def _module(jar: Path) -> str | None:
    found = _MODULE.match(jar.name)
    return found["module"] if found else None


def pyspark_jars_dir() -> Path:
    """The ``jars/`` folder of the installed pyspark, found without importing pyspark."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise DependencyMissingError("pyspark", "spark", "Resolving JVM jars")
    return Path(next(iter(spec.submodule_search_locations))) / "jars"


def _spark_provided_modules() -> list[str]:
    names = set()
    for jar in pyspark_jars_dir().glob("*.jar"):
        match = _JAR_NAME.match(jar.name)
        if match:
            names.add(match.group("module"))
    return sorted(names)


def _ivy_jar() -> Path:
    candidates = sorted(pyspark_jars_dir().glob("ivy-*.jar"))
    if not candidates:
        raise ArtifactResolutionError(
            f"pyspark's jars folder {pyspark_jars_dir()} has no ivy-*.jar; reinstall pyspark "
            f"{versions.SPARK} (pip install --force-reinstall pyspark=={versions.SPARK})"
        )
    return candidates[-1]


def ivy_module_xml(profile: JarProfile, provided: Iterable[str] = ()) -> str:
    """The Ivy module descriptor that resolves ``profile``.

    Test jars are excluded everywhere: spark-sql-kafka's POM names its token provider twice, once
    as a test-jar, and Ivy would otherwise fetch that unpublished ``-tests.jar``.
    """
    lines = [
        '<ivy-module version="2.0">',
        f'  <info organisation="primus-flow" module={quoteattr(profile.name)}/>',
        '  <configurations><conf name="default"/></configurations>',
        "  <dependencies>",
    ]
    for c in profile.coordinates:
        lines.append(
            f"    <dependency org={quoteattr(c.group)} name={quoteattr(c.artifact)} "
            f'rev={quoteattr(c.version)} conf="default->default"'
            + ("" if profile.transitive else ' transitive="false"')
            + "/>"
        )
    # Ivy's schema wants every <exclude> before any <override>.
    lines.append('    <exclude org="*" module="*" type="test-jar"/>')
    lines.extend(f'    <exclude org="*" module={quoteattr(m)}/>' for m in provided)
    for c in profile.overrides:
        lines.append(
            f"    <override org={quoteattr(c.group)} module={quoteattr(c.artifact)} "
            f"rev={quoteattr(c.version)}/>"
        )
    lines += ["  </dependencies>", "</ivy-module>", ""]
    return "\n".join(lines)


def _ivy_settings_xml(repo: str, cache: Path) -> str:
    return "\n".join(
        [
            "<ivysettings>",
            '  <settings defaultResolver="maven"/>',
            # Profiles resolve at once (resolve_all) into one cache: a file lock per download.
            f'  <caches defaultCacheDir={quoteattr(str(cache))} lockStrategy="artifact-lock-nio"/>',
            "  <resolvers>",
            f'    <ibiblio name="maven" m2compatible="true" root={quoteattr(repo)}/>',
            "  </resolvers>",
            "</ivysettings>",
            "",
        ]
    )


_UNRESOLVED = re.compile(
    r"^\s*::\s+(?P<org>[^#\s]+)#(?P<name>[^;\s]+);(?P<rev>[^:\s]+):\s*(?P<why>.+)$"
)
_FAILED = re.compile(r"^\s*::\s+(?P<org>[^#\s]+)#(?P<name>[^;\s]+);(?P<rev>[^!\s]+)!(?P<file>\S+)")


def parse_ivy_failures(output: str) -> list[tuple[str, str]]:
    """``(group:artifact:version, reason)`` for each artifact Ivy reports it could not get."""
    failures: list[tuple[str, str]] = []
    section = ""
    for line in output.splitlines():
        if "UNRESOLVED DEPENDENCIES" in line:
            section = "unresolved"
        elif "FAILED DOWNLOADS" in line:
            section = "failed"
        elif section == "unresolved" and (m := _UNRESOLVED.match(line)):
            failures.append((f"{m['org']}:{m['name']}:{m['rev']}", m["why"].strip()))
        elif section == "failed" and (m := _FAILED.match(line)):
            failures.append(
                (f"{m['org']}:{m['name']}:{m['rev']}", f"download of {m['file']} failed")
            )
    return failures


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _request(profile: JarProfile, provided: list[str]) -> dict[str, object]:
    """What a manifest must match for its jars to be reused."""
    request: dict[str, object] = {
        "coordinates": [str(c) for c in profile.coordinates],
        "overrides": [str(c) for c in profile.overrides],
        "excluded_spark_modules": hashlib.sha256("\n".join(provided).encode()).hexdigest(),
    }
    if not profile.transitive:  # (the key only when set: caches made before it stay valid)
        request["transitive"] = False
    return request


def _load_current(folder: Path, request: dict[str, object], verify: bool) -> list[Path] | None:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("request") != request:
        return None
    jars = []
    for entry in manifest.get("jars", []):
        path = folder / entry["file"]
        if not path.is_file() or path.stat().st_size != entry["size"]:
            return None
        if verify and _sha256(path) != entry["sha256"]:
            return None
        jars.append(path)
    return jars or None


def _result(profile: JarProfile, folder: Path, jars: list[Path]) -> ResolvedJars:
    driver = tuple(
        p
        for p in jars
        if (m := _JAR_NAME.match(p.name)) and m["module"] in profile.driver_classpath
    )
    return ResolvedJars(profile.name, folder, tuple(sorted(jars)), driver)


def resolve(
    profile_name: str,
    stack: StackConfig,
    *,
    verify: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ResolvedJars:
    """The jars of ``profile_name``, from the cache when current, else from the Maven repository.

    ``verify`` re-checks every jar's SHA-256 against the manifest instead of its size only.
    """
    try:
        profile = PROFILES[profile_name]
    except KeyError:
        raise ArtifactResolutionError(
            f"no jar profile {profile_name!r}; profiles: {', '.join(PROFILES)}"
        ) from None
    provided = _spark_provided_modules() if profile.exclude_spark_provided else []
    request = _request(profile, provided)
    folder = stack.jar_cache / profile.name
    cached = _load_current(folder, request, verify)
    if cached is not None:
        return _result(profile, folder, cached)
    if stack.offline:
        raise ArtifactResolutionError(
            f"the {profile.name} jars ({profile.purpose}) are not in {folder} and FLOW_OFFLINE=1 "
            "forbids downloading them; run `flow jars fetch` once with access to "
            f"{stack.maven_repo}, or unset FLOW_OFFLINE",
            tuple(str(c) for c in profile.coordinates),
        )

    java = find_java()
    staging = folder.with_name(folder.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    (staging / "ivy.xml").write_text(ivy_module_xml(profile, provided))
    (staging / "ivysettings.xml").write_text(
        _ivy_settings_xml(stack.maven_repo, stack.jar_cache / "ivy-cache")
    )
    lib = staging / "lib"
    command = [
        str(java.executable),
        "-jar",
        str(_ivy_jar()),
        "-settings",
        str(staging / "ivysettings.xml"),
        "-ivy",
        str(staging / "ivy.xml"),
        "-confs",
        "default",
        "-types",
        "jar",
        "bundle",
        "-retrieve",
        f"{lib}/[artifact]-[revision](-[classifier]).[ext]",
        "-sync",
    ]
    started = time.monotonic()
    output: list[str] = []
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        for line in proc.stdout or ():
            output.append(line)
            if progress and "[SUCCESSFUL ]" in line:
                progress(line.split("!")[-1].split("(")[0].strip())
    log = "".join(output)
    (staging / "ivy.log").write_text(log)
    failures = parse_ivy_failures(log)
    if proc.returncode != 0 or failures:
        names = tuple(name for name, _ in failures)
        detail = "; ".join(f"{name} ({why})" for name, why in failures) or log.strip()[-2000:]
        raise ArtifactResolutionError(
            f"could not resolve the {profile.name} jars from {stack.maven_repo}: {detail}. "
            "Check that this machine reaches the repository, or point FLOW_MAVEN_REPO at a "
            f"mirror that has these artifacts. Ivy's log: {staging / 'ivy.log'}",
            names,
        )

    jars = sorted(lib.glob("*.jar"))
    manifest = {
        "profile": profile.name,
        "purpose": profile.purpose,
        "repo": stack.maven_repo,
        "request": request,
        "resolved_in_s": round(time.monotonic() - started, 1),
        "jars": [
            {"file": f"lib/{p.name}", "size": p.stat().st_size, "sha256": _sha256(p)} for p in jars
        ],
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return _result(profile, folder, [folder / "lib" / p.name for p in jars])


def resolve_all(
    names: Iterable[str],
    stack: StackConfig,
    *,
    verify: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[tuple[ResolvedJars, float]]:
    """Each profile of ``names`` as :func:`resolve` gives it, with the seconds it took, in order.

    The profiles resolve at the same time, an Ivy JVM each: most of a resolution waits on the
    repository, so two at once took about the time of the longer (55 s) rather than the sum
    (26 s + 55 s) on ``make setup``. Their shared download cache is locked per file (the Ivy
    settings' ``artifact-lock-nio``). The first failure, in ``names``' order, is raised.
    """

    def timed(name: str) -> tuple[ResolvedJars, float]:
        started = time.monotonic()
        resolved = resolve(name, stack, verify=verify, progress=progress)
        return resolved, time.monotonic() - started

    wanted = list(dict.fromkeys(names))
    with ThreadPoolExecutor(max_workers=max(1, len(wanted))) as pool:
        futures = [pool.submit(timed, name) for name in wanted]
        return [future.result() for future in futures]
