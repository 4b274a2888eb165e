"""Write Criteo-shaped rows as the flat Parquet layout the baselines read.

    .venv/bin/python benchmarks/baselines/sample_parquet.py .flow/bench/criteo-1m --rows 1000000

For trying the baselines on their own; the handoff benchmark writes its own copy of the data it
feeds our reader, in the layout described in ``envs.py``. Runs in the project venv (pyarrow).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DENSE", "SPARSE", "criteo_table", "write_sample"]

DENSE = 13
SPARSE = 26


def criteo_table(rows: int, seed: int) -> pa.Table:
    """``label`` float32, ``d0``..``d12`` float32, ``c0``..``c25`` int64: flat scalar columns,
    which is what Petastorm's batch reader and Ray Data read fastest."""
    rng = np.random.default_rng(seed)
    columns: dict[str, np.ndarray] = {"label": (rng.random(rows) < 0.25).astype(np.float32)}
    for i in range(DENSE):
        columns[f"d{i}"] = rng.standard_normal(rows, dtype=np.float32)
    for i in range(SPARSE):
        columns[f"c{i}"] = rng.integers(0, 1 << 20, rows, dtype=np.int64)
    return pa.table(columns)


def write_sample(
    out: Path, rows: int, *, files: int = 8, row_group_rows: int = 65_536, seed: int = 0
) -> Path:
    """Split ``rows`` over ``files`` Parquet files of ``row_group_rows``-row groups.

    Several files and row groups give both readers units to spread over their workers, as a
    Spark write of a real table would.
    """
    if files < 1 or rows < files:
        raise ValueError(f"need 1 <= files <= rows, got files={files}, rows={rows}")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.parquet"):
        old.unlink()
    per_file = -(-rows // files)
    for index, start in enumerate(range(0, rows, per_file)):
        table = criteo_table(min(per_file, rows - start), seed + index)
        pq.write_table(table, out / f"part-{index:05d}.parquet", row_group_size=row_group_rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--row-group-rows", type=int, default=65_536)
    args = parser.parse_args()
    path = write_sample(args.out, args.rows, files=args.files, row_group_rows=args.row_group_rows)
    print(f"wrote {args.rows} rows to {path}")


if __name__ == "__main__":
    main()
