"""Models against baselines: every model the trainer builds, on one split, by the trainer itself.

    flow bench models --handoff DIR --channel backfill --eval-channel holdout \\
        --oracle p_click --field item_id                   # synthetic CTR history, time split
    flow bench models --handoff DIR --channel train --eval-channel test --field c1 \\
        --criteo-sample 100000 --criteo-split 86400        # a write_criteo_sample() import
    flow bench models ... --epochs 10 --early-stop 1       # epochs chosen by the eval channel

Each model (DLRM, DeepFM, Wide & Deep, and the baselines: hashed logistic regression and the
popularity of ``--field``'s values) trains with ``trainers.train.train`` on the same channels
with the trainer's default settings, except those given here, and is evaluated on the same
eval channel. The **oracle** is the true click probability of each evaluation row: the
``--oracle`` column of generated data (the trainer reports it over the same rows), or, for a
Criteo-format sample made by ``flow.workflows.criteo.write_criteo_sample``, the sample drawn
again from its seed (its rows from ``--criteo-split`` on are the eval channel's).

Reported per model: eval AUC, log loss and calibration (mean prediction / click rate), the AUC
against the logistic regression's and the oracle's, steps and seconds. With ``--early-stop``
the eval channel chooses each model's epoch, so its figures are a little optimistic for every
model alike (there is no third split). Results print and go to
$FLOW_HOME/bench/models-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _results import save

from flow.console import console
from flow.train_defaults import DEFAULT_BATCH_SIZE
from flow.training import MODEL_NAMES, ModelConfig, TrainConfig
from trainers.metrics import BinaryMetrics
from trainers.train import train

NEEDS_SERVICES = False
NEEDS_SPARK = False
out = console()


def run_model(name: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Train ``name`` with the trainer's defaults (and this benchmark's options); its figures."""
    model = ModelConfig(
        name,  # type: ignore[arg-type]
        field=args.field if name == "popularity" else None,
        max_embedding_rows=args.max_embedding_rows or ModelConfig().max_embedding_rows,
    )
    config = TrainConfig(
        handoff=args.handoff,
        channels=tuple(args.channel),
        eval_channel=args.eval_channel,
        oracle=args.oracle,
        model=model,
        batch_size=args.batch_size,
        epochs=args.epochs,
        early_stop=args.early_stop,
        early_stop_on=args.early_stop_on,
        seed=args.seed,
        device=args.device,
        tracking=False,
        log_every=10**9,
        checkpoint_dir=str(folder / name),
    )
    if args.optim:
        config = replace(config, optim=replace(config.optim, **json.loads(args.optim)))
    started = time.perf_counter()
    result = train(config, say=lambda line: out.print(f"    {line}") if "early" in line else None)
    found = {k: result.metrics[k] for k in ("auc", "logloss", "calibration", "count")}
    for k in ("oracle_auc", "oracle_logloss"):
        if k in result.metrics:
            found[k] = result.metrics[k]
    found |= {"steps": result.steps, "seconds": time.perf_counter() - started}
    if result.best_step is not None:
        found["best_step"] = result.best_step
    return found


def criteo_oracle(rows: int, split: int, seed: int) -> dict[str, float]:
    """The true model's figures on a Criteo-format sample's rows from ``split`` on, the sample
    drawn again from its seed (the same rows and labels as the file imported)."""
    import pyarrow.csv as pcsv

    from flow.workflows.criteo import write_criteo_sample

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sample.txt"
        sample = write_criteo_sample(path, rows, seed=seed)
        options = pcsv.ParseOptions(delimiter="\t")
        read = pcsv.ReadOptions(autogenerate_column_names=True)
        labels = pcsv.read_csv(path, read_options=read, parse_options=options).column(0)
    p = torch.from_numpy(sample.p_click[split:]).clamp(1e-12, 1 - 1e-12)
    label = torch.from_numpy(labels.to_numpy()[split:].astype(np.float32))
    metrics = BinaryMetrics(capacity=len(label))
    metrics.update(torch.log(p / (1 - p)), label)
    found = metrics.compute()
    return {k: found[k] for k in ("auc", "logloss", "calibration", "count")}


def main() -> None:
    parser = argparse.ArgumentParser(description="Models against baselines, one split")
    parser.add_argument("--handoff", required=True, help="the handoff location")
    parser.add_argument("--channel", action="append", required=True, help="training channel(s)")
    parser.add_argument("--eval-channel", required=True)
    parser.add_argument("--oracle", help="the eval rows' true click probability column")
    parser.add_argument("--criteo-sample", type=int, help="rows of the write_criteo_sample file")
    parser.add_argument("--criteo-split", type=int, help="its first row in the eval channel")
    parser.add_argument("--criteo-seed", type=int, default=3)
    parser.add_argument("--field", required=True, help="the popularity baseline's field")
    parser.add_argument("--models", default=",".join(MODEL_NAMES))
    # The figures in docs/trainers.md were measured at 4,096 rows a batch; the trainer's own
    # default derives the size from the rows (flow.train_defaults), so this one is stated.
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--early-stop", type=int, help="patience, in epochs")
    parser.add_argument("--early-stop-on", default="auc", choices=("auc", "logloss"))
    parser.add_argument("--max-embedding-rows", type=int)
    parser.add_argument("--optim", help="OptimConfig changes as JSON, e.g. '{\"lr\": 0.003}'")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-file", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = sorted(set(names) - set(MODEL_NAMES))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {', '.join(MODEL_NAMES)}")
    results: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(),
        "handoff": args.handoff,
        "channels": args.channel,
        "eval_channel": args.eval_channel,
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k in ("batch_size", "epochs", "early_stop", "early_stop_on", "optim", "seed")
        },
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as checkpoints:
        for name in names:
            out.print(f"  {name} ...")
            results["runs"][name] = run_model(name, args, Path(checkpoints))
    oracle = None
    if args.criteo_sample:
        oracle = criteo_oracle(args.criteo_sample, args.criteo_split or 0, args.criteo_seed)
    else:
        found = next((r for r in results["runs"].values() if "oracle_auc" in r), None)
        if found is not None:
            oracle = {"auc": found["oracle_auc"], "logloss": found["oracle_logloss"]}
    results["oracle"] = oracle
    show(results)
    path = save("models", results, also=args.result_file)
    out.print(f"results: {path}")


def show(results: dict[str, Any]) -> None:
    from rich.table import Table

    settings = results["settings"]
    how = f"batch {settings['batch_size']:,}, " + (
        f"up to {settings['epochs']} epochs, early stop {settings['early_stop']}"
        if settings["early_stop"]
        else f"{settings['epochs']} epoch(s)"
    )
    table = Table(title=f"{', '.join(results['channels'])} -> {results['eval_channel']} ({how})")
    columns = ("model", "eval AUC", "log loss", "calibration", "AUC - logistic", "oracle - AUC")
    for column in (*columns, "steps", "s"):
        table.add_column(column, justify="left" if column == "model" else "right")
    oracle = results["oracle"]
    if oracle is not None:
        calibration = f"{oracle['calibration']:.3f}" if "calibration" in oracle else ""
        figures = (f"{oracle['auc']:.4f}", f"{oracle['logloss']:.4f}", calibration)
        table.add_row("oracle", *figures, "", "", "", "")
    linear = results["runs"].get("logistic", {}).get("auc")
    for name, r in results["runs"].items():
        table.add_row(
            name,
            f"{r['auc']:.4f}",
            f"{r['logloss']:.4f}",
            f"{r['calibration']:.3f}",
            f"{r['auc'] - linear:+.4f}" if linear is not None else "",
            f"{oracle['auc'] - r['auc']:.4f}" if oracle is not None else "",
            f"{r['steps']:,}",
            f"{r['seconds']:.0f}",
        )
    out.print(table)


if __name__ == "__main__":
    main()
