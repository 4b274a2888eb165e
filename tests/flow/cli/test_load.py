"""``flow load`` / ``flow import criteo`` / ``flow generate criteo`` from the command line."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from flow.cli import main
from flow.config import StackConfig
from flow.stack.iceberg import open_catalog
from tests.support import stack_env_for


def said(output: str) -> str:
    return " ".join(output.split())


def test_a_dry_run_shows_the_schema_and_writes_nothing(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path / "home")
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating,timestamp\n1,10,4.5,1714564800\n")
    args = ["load", str(path), "--table", "movies.ratings", "--timestamp-columns", "timestamp"]
    done = CliRunner().invoke(main, [*args, "--epoch-unit", "s", "--dry-run"], env=env)
    assert done.exit_code == 0, done.output
    out = said(done.output)
    assert "timestamptz" in out
    assert "epoch seconds" in out
    assert "--rename 'userId=user_id'" in out
    assert "dry run: nothing written" in out
    catalog = open_catalog(StackConfig.from_env(env).catalog)
    assert not catalog.table_exists("movies.ratings")


def test_load_then_load_again_says_to_append_or_replace(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path / "home")
    path = tmp_path / "events.jsonl"
    path.write_text('{"id": 1, "ts": "2024-05-01T12:00:00Z"}\n')
    runner = CliRunner()
    done = runner.invoke(main, ["load", str(path), "--table", "mine.events"], env=env)
    assert done.exit_code == 0, done.output
    assert "1 rows into mine.events" in said(done.output)
    again = runner.invoke(main, ["load", str(path), "--table", "mine.events"], env=env)
    assert again.exit_code == 1
    assert "error: table mine.events exists; pass --append" in said(again.output)
    both = ["load", str(path), "--table", "mine.events", "--append", "--replace"]
    assert runner.invoke(main, both, env=env).exit_code == 2


def test_a_generated_criteo_file_imports(tmp_path: Path) -> None:
    env = stack_env_for(tmp_path / "home")
    runner = CliRunner()
    sample = tmp_path / "criteo.txt"
    done = runner.invoke(main, ["generate", "criteo", str(sample), "--rows", "500"], env=env)
    assert done.exit_code == 0, done.output
    args = ["import", "criteo", str(sample), "--table", "criteo.days"]
    when = ["--start", "2024-01-01T00:00:00Z", "--rows-per-second", "1"]
    done = runner.invoke(main, [*args, *when], env=env)
    assert done.exit_code == 0, done.output
    assert "500 rows into criteo.days" in said(done.output)
    assert "(--split-at 0.8): 400 rows train, 100 test" in said(done.output)
    at = ["--split-at", "2024-01-01T00:05:00Z"]
    done = runner.invoke(main, [*args, "--replace", *when, *at], env=env)
    assert done.exit_code == 0, done.output
    assert "300 rows train, 200 test" in said(done.output)
    done = runner.invoke(main, [*args, "--replace", *when, "--split-at", "2"], env=env)
    assert done.exit_code == 1
    assert "between 0 and 1" in done.output
    bad = runner.invoke(
        main, [*args, "--replace", "--start", "yesterday", "--rows-per-second", "1"], env=env
    )
    assert bad.exit_code == 2
    assert "ISO-8601" in bad.output


def test_an_append_with_a_new_column_names_it_and_adds_it_with_add_columns(
    tmp_path: Path,
) -> None:
    env = stack_env_for(tmp_path / "home")
    runner = CliRunner()
    first = tmp_path / "day1.csv"
    first.write_text("id,v\n1,a\n")
    assert runner.invoke(main, ["load", str(first), "--table", "mine.t"], env=env).exit_code == 0
    wider = tmp_path / "day2.csv"
    wider.write_text("id,v,score\n2,b,0.5\n")
    args = ["load", str(wider), "--table", "mine.t", "--append"]
    refused = runner.invoke(main, args, env=env)
    assert refused.exit_code == 1
    assert "the table has no column(s) score (--add-columns adds them" in said(refused.output)
    done = runner.invoke(main, [*args, "--add-columns"], env=env)
    assert done.exit_code == 0, done.output
    assert "adding column(s) score to mine.t (--add-columns)" in said(done.output)
    table = open_catalog(StackConfig.from_env(env).catalog).load_table("mine.t")
    rows = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "v": "a", "score": None}, {"id": 2, "v": "b", "score": 0.5}]
    alone = runner.invoke(main, ["load", str(wider), "--table", "mine.u", "--add-columns"], env=env)
    assert alone.exit_code != 0
    assert "pass it with --append" in said(alone.output)
