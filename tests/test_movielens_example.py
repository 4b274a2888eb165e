"""examples/movielens: the preparation joins each rating with its user and movie in time order,
the pipeline builds, with every genre of a movie as one sequence feature, and docs/trainers.md's
commands for it parse as printed."""

from __future__ import annotations

import runpy
import zipfile
from pathlib import Path

from flow.pipeline import Derived, HashedSequence
from flow.training import parse_args
from tests.support import REPO, doc_commands, flow_command

EXAMPLE = REPO / "examples" / "movielens"
MEASURED = "### Measured: defaults, tuned and the baselines"
FILES = {
    "inter": "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
    "2\t20\t4\t300\n1\t10\t5\t100\n1\t20\t2\t300\n",
    "user": "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
    "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n",
    "item": "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    "10\tToy Story\t1995\tAnimation Children's Comedy\n20\tHeat\t1995\t\n",
}


def test_ratings_are_joined_with_users_and_movies_in_time_order(tmp_path: Path) -> None:
    prepare = runpy.run_path(str(EXAMPLE / "prepare.py"))
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for suffix, text in FILES.items():
            out.writestr(f"{prepare['FOLDER']}.{suffix}", text)

    rows = prepare["ratings"](wheel)

    # In time order; the two ratings at 300 keep the file's order.
    assert [(r["userId"], r["movieId"]) for r in rows] == [("1", "10"), ("2", "20"), ("1", "20")]
    first = rows[0]
    assert first == {
        "userId": "1", "movieId": "10", "rating": "5", "timestamp": "100", "age": "24",
        "gender": "M", "occupation": "technician", "year": "1995", "genre": "Animation",
        "genres": "Animation|Children's|Comedy",
    }  # fmt: skip
    assert (rows[1]["genre"], rows[1]["genres"]) == ("", "")  # a movie with no genre
    assert set(first) == set(prepare["COLUMNS"])


def test_the_pipeline_reads_every_genre_as_one_sequence() -> None:
    pipeline = runpy.run_path(str(EXAMPLE / "pipeline.py"))["pipeline"]()
    stage = next(s for s in pipeline.stages if s.name == "backfill")
    assert Derived("genre_list", "split(genres, '[|]')", type="array<string>") in stage.derive
    sequences = [f for f in stage.features.features if isinstance(f, HashedSequence)]
    assert [f.column for f in sequences] == ["genre_list"]
    assert {s.channel for s in pipeline.stages} == {"ratings", "test"}  # train and held out


def test_the_trainers_page_s_movielens_commands_parse_as_printed() -> None:
    """Each line of docs/trainers.md's reproduction, through the real parsers: nothing runs."""
    commands = doc_commands(REPO / "docs" / "trainers.md", MEASURED)
    ran = []
    for words in commands:
        if words[0] == ".venv/bin/python" and words[1] == "-m":
            assert words[2:4] == ["trainers", "train"], words
            config = parse_args(words[4:], prog="python -m trainers train")
            assert config.namespace in ("movies", "movies_ids"), words
            assert config.channels == ("ratings",)
            ran.append(f"train {config.namespace}")
        elif words[0] == ".venv/bin/python":
            assert (REPO / words[1]).is_file(), words
            ran.append(Path(words[1]).name)
        else:
            assert words[0] == ".venv/bin/flow", words
            command, params = flow_command(words[1:])
            if command.name == "run":
                assert (REPO / params["argv"][-1]).is_file(), params
            ran.append(str(command.name))
    assert ran == ["prepare.py", "load", "run", "train movies", "run", "train movies_ids", "tune"]


def test_the_pipeline_gives_each_rating_its_users_and_movies_history() -> None:
    pipeline = runpy.run_path(str(EXAMPLE / "pipeline.py"))["pipeline"]()
    for stage in pipeline.stages:  # the holdout too: it reads the training rows as context
        assert {(h.key, h.stat) for h in stage.history} == {
            (key, stat) for key in ("user_id", "movie_id") for stat in ("count", "mean")
        }
        assert set(pipeline.spark_only[stage.name]) >= {h.name for h in stage.history}


def test_the_ids_baseline_is_the_same_split_with_only_the_two_ids() -> None:
    ids = runpy.run_path(str(EXAMPLE / "ids.py"))["pipeline"]()
    full = runpy.run_path(str(EXAMPLE / "pipeline.py"))["pipeline"]()
    assert ids.namespace == "movies_ids"
    assert ids.sources == full.sources  # the same rows, the same time split
    for stage in ids.stages:
        assert [f.column for f in stage.features.features] == ["user_id", "movie_id"]
        assert (stage.history, stage.derive) == ((), ())
