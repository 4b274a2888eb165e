"""The fitted feature state applied outside Spark, and the check that it matches Spark's.

    from flow.transform import FeatureTransform
    rows = FeatureTransform(spec, state).apply(raw_table)   # dense, sparse, seq_*

Engine-neutral: numpy and pyarrow only, no JVM (this is what a served model runs).
"""

from flow.transform.apply import FeatureTransform

__all__ = ["FeatureTransform"]
