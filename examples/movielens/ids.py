"""The ids-alone baseline of docs/trainers.md: examples/movielens/pipeline.py with only the user
and movie ids as features, into namespace ``movies_ids`` (channels ``ratings`` and ``test``), so
``--model logistic`` on it is a hashed logistic regression of the two ids and nothing else."""

from __future__ import annotations

import dataclasses
import runpy
from pathlib import Path

from flow.pipeline import BackfillStage, Hashed, Pipeline, run_main

IDS = (Hashed("user_id", buckets=1 << 18), Hashed("movie_id", buckets=1 << 16))


def pipeline() -> Pipeline:
    # Run as a file (`flow run examples/movielens/ids.py`), like the pipeline beside it.
    full: Pipeline = runpy.run_path(str(Path(__file__).with_name("pipeline.py")))["pipeline"]()
    stages = []
    for stage in full.stages:
        assert isinstance(stage, BackfillStage)
        spec = dataclasses.replace(stage.features, features=IDS)
        stages.append(dataclasses.replace(stage, features=spec, history=(), derive=()))
    return dataclasses.replace(
        full, name="movielens_ids", namespace="movies_ids", stages=tuple(stages)
    )


if __name__ == "__main__":
    run_main(pipeline())
