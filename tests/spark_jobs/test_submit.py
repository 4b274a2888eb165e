from __future__ import annotations

import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from flow.cli import jobs
from flow.cli.jobs import _abbreviated
from flow.config import StackConfig
from flow.console import console as make_console
from flow.errors import ConfigError
from flow.stack import jars
from spark_jobs import session, submit


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StackConfig:
    lib = tmp_path / "lib"
    names = ("iceberg.jar", "sqlite-jdbc-1.jar", *KAFKA_JARS, *DELTA_JARS)
    resolved = jars.ResolvedJars(
        "spark", lib, tuple(lib / n for n in names), (lib / "sqlite-jdbc-1.jar",)
    )
    monkeypatch.setattr(jars, "resolve", lambda _name, _stack: resolved)
    monkeypatch.setattr(session, "project_jar", lambda _cache, _spark_jars: lib / OWN_JAR)
    return StackConfig.from_env({"FLOW_HOME": str(tmp_path)})


KAFKA_JARS = ("spark-sql-kafka-0-10_2.13-4.1.3.jar", "kafka-clients-3.9.1.jar")
DELTA_JARS = ("delta-spark_4.1_2.13-4.4.0.jar", "delta-storage-4.4.0.jar")
OWN_JAR = "primus-flow-0123456789abcdef.jar"
"""The project's operators (flow.stack.project_jar), which every job gets."""


@pytest.fixture
def app(tmp_path: Path) -> str:
    path = tmp_path / "job.py"
    path.write_text("print('hi')\n")
    return str(path)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_options_before_the_app_go_to_spark_submit_and_the_rest_to_the_app() -> None:
    args = submit.split_submit_argv(
        ["--master", "local[2]", "--verbose", "--conf=spark.x=1", "job.py", "--events", "5"]
    )
    assert args.options == [("--master", "local[2]"), ("--verbose", None), ("--conf", "spark.x=1")]
    assert args.app == "job.py"
    assert args.app_args == ["--events", "5"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--master"], "needs a value"), (["--master", "local"], "no application given")],
)
def test_malformed_command_lines_say_what_is_missing(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        submit.split_submit_argv(argv)


def test_the_stack_settings_are_added_under_the_users(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command(
        [
            "--master",
            "local[1]",
            "--conf",
            "spark.sql.session.timeZone=Europe/Paris",
            "--jars",
            "/opt/extra.jar",
            app,
            "--events",
            "7",
        ],
        stack,
    )
    argv = launch.argv
    assert argv[-3:] == [app, "--events", "7"]
    assert _pairs(argv, "--master") == ["local[1]"]
    confs = _pairs(argv, "--conf")
    assert "spark.sql.session.timeZone=Europe/Paris" in confs
    assert not any(c.startswith("spark.sql.session.timeZone=UTC") for c in confs)
    assert any(c.startswith("spark.sql.catalog.flow.uri=jdbc:sqlite:") for c in confs)
    # spark-submit keeps only the last --jars: the user's jars are merged into the stack's.
    jars_given = _pairs(argv, "--jars")[0].split(",")
    assert jars_given[:2] == [
        f"{stack.home}/lib/iceberg.jar",
        f"{stack.home}/lib/sqlite-jdbc-1.jar",
    ]
    assert jars_given[-1] == "/opt/extra.jar"
    assert len(jars_given) == 2 + len(KAFKA_JARS) + len(DELTA_JARS) + 1 + 1  # every connector's
    assert f"{stack.home}/lib/{OWN_JAR}" in jars_given
    # The JDBC driver registers from the system classpath only; Hadoop finds the project's
    # file systems there (spark_jobs.conf.FORKLESS_FILES).
    assert _pairs(argv, "--driver-class-path") == [
        f"{stack.home}/lib/sqlite-jdbc-1.jar:{stack.home}/lib/{OWN_JAR}"
    ]
    assert launch.env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert launch.env["PYSPARK_PYTHON"]


def test_the_default_master_comes_from_the_stack(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command([app], stack)
    assert _pairs(launch.argv, "--master") == ["local[*]"]
    assert _pairs(launch.argv, "--driver-memory") == ["2g"]


def test_a_cluster_master_gets_no_local_tuning(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command(["--master", "spark://m:7077", app], stack)
    confs = _pairs(launch.argv, "--conf")
    assert not any(c.startswith("spark.driver.bindAddress") for c in confs)
    assert "--driver-memory" not in launch.argv
    assert "SPARK_LOCAL_IP" not in launch.env


@pytest.mark.parametrize("master", ["local[2]", "spark://m:7077"])
def test_a_users_conf_wins_over_the_stacks_codegen_limit(
    stack: StackConfig, app: str, master: str
) -> None:
    ours = submit.submit_command(["--master", master, app], stack)
    assert "spark.sql.codegen.hugeMethodLimit=8000" in _pairs(ours.argv, "--conf")
    given = "spark.sql.codegen.hugeMethodLimit=65535"
    theirs = submit.submit_command(["--master", master, "--conf", given, app], stack)
    limits = [c for c in _pairs(theirs.argv, "--conf") if "hugeMethodLimit" in c]
    assert limits == [given]


def test_spark_submit_runs_the_application_with_this_interpreter(
    stack: StackConfig, app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    env = submit.submit_command([app], stack).env
    assert env["PYSPARK_PYTHON"] == sys.executable
    assert Path(env["SPARK_HOME"], "bin", "spark-class").exists()


def test_a_missing_application_is_named(stack: StackConfig, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.py does not exist"):
        submit.submit_command([str(tmp_path / "nope.py")], stack)


SECRET = "s3cr3t-value=a:b#c"
"""A fake credential, with characters the properties format escapes."""


@pytest.fixture
def secret_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StackConfig:
    lib = tmp_path / "lib"
    resolved = jars.ResolvedJars("spark", lib, (lib / "iceberg.jar",), ())
    monkeypatch.setattr(jars, "resolve", lambda _name, _stack: resolved)
    monkeypatch.setattr(session, "project_jar", lambda _cache, _spark_jars: lib / OWN_JAR)
    return StackConfig.from_env(
        {
            "FLOW_HOME": str(tmp_path / "home"),
            "FLOW_CATALOG_PROPERTIES": f"s3.endpoint=http://h:9000,s3.secret-access-key={SECRET}",
        }
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_secret_goes_to_a_private_properties_file_not_the_command_line(
    secret_stack: StackConfig, app: str
) -> None:
    launch = submit.submit_command(["--conf", "spark.sql.shuffle.partitions=3", app], secret_stack)
    printed = _abbreviated(launch.argv)
    assert not any("s3cr3t" in arg for arg in launch.argv)
    assert "s3cr3t" not in printed
    # What is not secret stays on the command line, to be seen.
    assert "spark.sql.catalog.flow.s3.endpoint=http://h:9000" in _pairs(launch.argv, "--conf")
    assert "spark.sql.shuffle.partitions=3" in _pairs(launch.argv, "--conf")
    (path,) = launch.private_files
    assert _pairs(launch.argv, "--properties-file") == [str(path)]
    assert "--load-spark-defaults" in launch.argv  # spark-defaults.conf still applies, beneath
    assert path.parent == secret_stack.home / "private"
    assert (_mode(path.parent), _mode(path)) == (0o700, 0o600)
    assert "spark.sql.catalog.flow.s3.secret-access-key=s3cr3t-value\\=a\\:b\\#c\n" in (
        path.read_text()
    )


def test_without_secrets_there_is_no_properties_file(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command([app], stack)
    assert launch.private_files == ()
    assert "--properties-file" not in launch.argv
    assert "--load-spark-defaults" not in launch.argv


def test_a_secret_conf_of_the_users_goes_to_the_file_and_wins(
    secret_stack: StackConfig, app: str
) -> None:
    key = "spark.sql.catalog.flow.s3.secret-access-key"
    launch = submit.submit_command(
        ["-c", f"{key}=users-s3cr3t", "--conf", "spark.hadoop.fs.s3a.secret.key=other", app],
        secret_stack,
    )
    assert not any("s3cr3t" in arg or "other" in arg for arg in launch.argv)
    text = launch.private_files[0].read_text()
    assert f"{key}=users-s3cr3t\n" in text
    assert "spark.hadoop.fs.s3a.secret.key=other\n" in text
    assert SECRET.split("=")[0] not in text  # the user's value replaced the stack's


def test_a_properties_file_of_the_users_is_merged_over_the_stacks(
    secret_stack: StackConfig, app: str, tmp_path: Path
) -> None:
    theirs = tmp_path / "mine.conf"
    theirs.write_text("spark.sql.session.timeZone Europe/Paris\n")
    launch = submit.submit_command(
        ["--properties-file", str(theirs), "--conf", "spark.x=1", app], secret_stack
    )
    # Every stack setting is in the file, before the user's lines (the last line of a key
    # wins); the user's --conf stays on the command line, over the file.
    assert _pairs(launch.argv, "--conf") == ["spark.x=1"]
    assert _pairs(launch.argv, "--properties-file") == [str(launch.private_files[0])]
    # As in a plain spark-submit, their file replaces spark-defaults.conf.
    assert "--load-spark-defaults" not in launch.argv
    text = launch.private_files[0].read_text()
    assert text.index("spark.sql.session.timeZone=UTC") < text.index(
        "spark.sql.session.timeZone Europe/Paris"
    )
    assert "s3cr3t" in text


def test_a_missing_properties_file_is_named(secret_stack: StackConfig, app: str) -> None:
    with pytest.raises(ConfigError, match=r"--properties-file nope\.conf does not exist"):
        submit.submit_command(["--properties-file", "nope.conf", app], secret_stack)


def test_spark_args_point_at_a_private_file_instead_of_printing_secrets(
    secret_stack: StackConfig,
) -> None:
    options = submit.submit_options(secret_stack)
    assert not any("s3cr3t" in o for o in options)
    (path,) = _pairs(options, "--properties-file")
    assert Path(path) == secret_stack.home / "private" / submit.SPARK_ARGS_FILE
    assert _mode(Path(path)) == 0o600
    assert "s3cr3t" in Path(path).read_text()
    assert options[-1] == "--load-spark-defaults"


@pytest.mark.parametrize("master", ["spark://10.0.0.5:7077", "yarn", "k8s://https://api:6443"])
def test_spark_args_for_a_cluster_carry_nothing_that_only_fits_one_machine(
    stack: StackConfig, master: str
) -> None:
    options = submit.submit_options(stack, master)
    settings = dict(c.split("=", 1) for c in _pairs(options, "--conf"))
    local_only = (
        "spark.driver.bindAddress",
        "spark.driver.host",
        "spark.sql.shuffle.partitions",
        "spark.python.daemon.module",
        "spark.shuffle.compress",
    )
    assert not [key for key in local_only if key in settings]
    assert "--driver-memory" not in options
    assert settings["spark.sql.session.timeZone"] == "UTC"  # the stack's own settings stay
    assert settings["spark.sql.codegen.hugeMethodLimit"] == "8000"  # HotSpot's limit is portable
    assert "spark.sql.catalog.flow" in settings
    local = dict(c.split("=", 1) for c in _pairs(submit.submit_options(stack), "--conf"))
    assert local["spark.driver.bindAddress"] == "127.0.0.1"


def test_the_properties_format_escapes_what_java_would_misread() -> None:
    text = submit.properties_text({"a key": " v=1:2#3!4\\5\nx"}, "heading")
    assert text == "# heading\na\\ key=\\ v\\=1\\:2\\#3\\!4\\\\5\\nx\n"


def test_flow_submit_prints_no_secret_and_removes_the_file_after_the_job(
    secret_stack: StackConfig,
    app: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seen: list[list[str]] = []

    class Ran:
        def wait(self) -> int:
            return 0

    def start(argv: Sequence[str], env: Mapping[str, str]) -> Any:
        seen.append(list(argv))
        assert Path(_pairs(list(argv), "--properties-file")[0]).exists()  # there while it runs
        return Ran()

    monkeypatch.setattr(jobs, "console", make_console())  # on the captured stderr
    assert jobs.launch([app], secret_stack, start=start) == 0
    printed = capsys.readouterr().err
    assert "spark-submit" in printed
    assert "s3cr3t" not in printed
    assert not Path(_pairs(seen[0], "--properties-file")[0]).exists()


def _java_options(argv: list[str]) -> str:
    found = [c for c in _pairs(argv, "--conf") if c.startswith("spark.driver.extraJavaOptions=")]
    return found[0] if found else ""


def test_a_driver_maps_the_class_archive_the_first_job_made(
    stack: StackConfig, app: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = submit.submit_command([app], stack)
    options = _java_options(first.argv)
    assert "-Dlog4j2.configurationFile=" in options  # ours are kept
    made = Path(options.split("-XX:ArchiveClassesAtExit=")[1].split()[0])
    assert made.parent == stack.home / "jvm"
    made.write_bytes(b"classes")  # what the driver's JVM writes as it exits
    monkeypatch.setattr(subprocess, "call", lambda argv, env: 0)
    (finish,) = first.on_exit
    finish(0)
    (archive,) = (stack.home / "jvm").glob("*.jsa")
    assert not made.exists()
    later = submit.submit_command([app], stack)
    assert f"-XX:SharedArchiveFile={archive}" in _java_options(later.argv)
    assert later.on_exit == ()
    other_jars = submit.submit_command(["--jars", "/opt/udf.jar", app], stack)
    assert "-XX:ArchiveClassesAtExit=" in _java_options(other_jars.argv)  # an archive of its own
    own = submit.submit_command(["--conf", "spark.driver.extraJavaOptions=-Dx=1", app], stack)
    assert _java_options(own.argv) == "spark.driver.extraJavaOptions=-Dx=1"  # theirs, untouched
    off = StackConfig.from_env({"FLOW_HOME": str(stack.home), "FLOW_SPARK_CDS": "0"})
    assert "-XX:" not in _java_options(submit.submit_command([app], off).argv)


def test_a_job_that_wrote_no_archive_leaves_none(stack: StackConfig, app: str) -> None:
    launch = submit.submit_command([app], stack)
    (finish,) = launch.on_exit
    finish(137)  # killed before its JVM could write the archive
    assert list((stack.home / "jvm").iterdir()) == []


def _jar_names(argv: list[str]) -> set[str]:
    return {Path(j).name for j in _pairs(argv, "--jars")[0].split(",")}


def test_a_job_without_kafka_or_delta_gets_neither_their_jars_nor_deltas_catalog(
    stack: StackConfig, app: str
) -> None:
    argv = submit.submit_command([app], stack, frozenset()).argv
    assert _jar_names(argv) == {"iceberg.jar", "sqlite-jdbc-1.jar", OWN_JAR}
    confs = dict(c.split("=", 1) for c in _pairs(argv, "--conf"))
    assert "Delta" not in confs["spark.sql.extensions"]
    assert "spark.sql.catalog.spark_catalog" not in confs
    assert confs["spark.flow.connectors"] == ""  # the session asks for none of theirs either


def test_a_job_gets_the_jars_and_settings_of_the_connectors_it_names(
    stack: StackConfig, app: str
) -> None:
    kafka = submit.submit_command([app], stack, frozenset({"kafka"})).argv
    assert _jar_names(kafka) == {"iceberg.jar", "sqlite-jdbc-1.jar", OWN_JAR, *KAFKA_JARS}
    assert not any("DeltaCatalog" in c for c in _pairs(kafka, "--conf"))
    delta = submit.submit_command([app], stack, frozenset({"delta"})).argv
    assert _jar_names(delta) == {"iceberg.jar", "sqlite-jdbc-1.jar", OWN_JAR, *DELTA_JARS}
    confs = dict(c.split("=", 1) for c in _pairs(delta, "--conf"))
    assert confs["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    assert "DeltaSparkSessionExtension" in confs["spark.sql.extensions"]
    every = submit.submit_command([app], stack).argv  # a script flow knows nothing of: all
    assert _jar_names(every) == {
        "iceberg.jar",
        "sqlite-jdbc-1.jar",
        OWN_JAR,
        *KAFKA_JARS,
        *DELTA_JARS,
    }
    assert not any(c.startswith("spark.flow.connectors=") for c in _pairs(every, "--conf"))


def test_each_jar_set_gets_a_class_archive_of_its_own(stack: StackConfig, app: str) -> None:
    def made(connectors: frozenset[str] | None) -> str:
        options = _java_options(submit.submit_command([app], stack, connectors).argv)
        return Path(options.split("-XX:ArchiveClassesAtExit=")[1].split()[0]).name.split(".")[1]

    assert len({made(None), made(frozenset()), made(frozenset({"kafka"}))}) == 3
