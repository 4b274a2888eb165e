"""MovieLens 100K as one CSV of ratings with the users' and movies' attributes, for `flow load`.

The data set comes from the ``recbole`` 1.2.1 wheel on PyPI (``recbole/dataset_example/ml-100k``),
which is downloaded here without its dependencies. GroupLens' licence does not allow
redistributing MovieLens, so neither the wheel nor the CSV is in this repository.

    .venv/bin/python examples/movielens/prepare.py /tmp/movielens/ratings.csv

Columns: ``userId, movieId, rating, timestamp`` (seconds), the user's ``age, gender, occupation``,
the movie's release ``year``, its first ``genre`` and all of its ``genres`` joined by ``|``.
Rows are in time order (ties in the data set's own order).
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

WHEEL = "recbole==1.2.1"
FOLDER = "recbole/dataset_example/ml-100k/ml-100k"
COLUMNS = (
    "userId", "movieId", "rating", "timestamp", "age", "gender", "occupation", "year", "genre",
    "genres",
)  # fmt: skip


def _table(wheel: zipfile.ZipFile, suffix: str) -> Iterator[dict[str, str]]:
    """The rows of one of the data set's atomic files (tab-separated, ``name:type`` headers)."""
    with wheel.open(f"{FOLDER}.{suffix}") as raw:
        lines = io.TextIOWrapper(raw, encoding="utf-8").read().splitlines()
    names = [column.split(":", 1)[0] for column in lines[0].split("\t")]
    for line in lines[1:]:
        if line:
            yield dict(zip(names, line.split("\t"), strict=True))


def ratings(wheel_path: Path) -> list[dict[str, str]]:
    """Every rating joined with its user and its movie, in time order."""
    with zipfile.ZipFile(wheel_path) as wheel:
        users = {u["user_id"]: u for u in _table(wheel, "user")}
        movies = {m["item_id"]: m for m in _table(wheel, "item")}
        rows = []
        for rating in _table(wheel, "inter"):
            user, movie = users[rating["user_id"]], movies[rating["item_id"]]
            genres = movie["class"].split()
            rows.append(
                {
                    "userId": rating["user_id"],
                    "movieId": rating["item_id"],
                    "rating": str(int(float(rating["rating"]))),
                    "timestamp": str(int(float(rating["timestamp"]))),
                    "age": user["age"],
                    "gender": user["gender"],
                    "occupation": user["occupation"],
                    "year": movie["release_year"],
                    "genre": genres[0] if genres else "",
                    "genres": "|".join(genres),
                }
            )
    rows.sort(key=lambda row: int(row["timestamp"]))  # stable: ties keep the file's order
    return rows


def download(into: Path) -> Path:
    """The recbole wheel, from PyPI, without its dependencies."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL, "-d"]
    subprocess.run([*command, str(into)], check=True)
    (wheel,) = into.glob("recbole-*.whl")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the CSV to write")
    parser.add_argument("--wheel", type=Path, help=f"a downloaded {WHEEL} wheel (default: fetch)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = ratings(args.wheel or download(Path(folder)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows):,} ratings in {args.out}")


if __name__ == "__main__":
    main()
