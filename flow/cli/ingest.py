"""``flow load`` and ``flow import``: users' own data into Iceberg tables of the stack's catalog.

Both show the table's schema (and the Field type a pipeline declares for each column) before
writing; ``--dry-run`` shows only that. The guide is docs/own-data.md.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, TimeRemainingColumn
from rich.progress import Progress as Bar
from rich.table import Table

from flow.cli.common import console, friendly, stack_config

if TYPE_CHECKING:
    from flow.workflows.ingest import Load, LoadReport, Mode

__all__ = ["import_", "load"]


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        name, sep, other = value.partition("=")
        if not sep or not name.strip() or not other.strip():
            raise click.BadParameter(f"{value!r}: write NAME=VALUE", param_hint=option)
        pairs[name.strip()] = other.strip()
    return pairs


def _mode(append: bool, replace: bool) -> Mode:
    if append and replace:
        raise click.UsageError("--append and --replace exclude each other; choose one")
    return "append" if append else "replace" if replace else "create"


def _show(load: Load, dry_run: bool) -> None:
    plan = load.plan
    table = Table(title=f"{plan.source} -> {plan.table}", title_justify="left")
    for header in ("column", "in the file", "in the table", "Field type", "note"):
        table.add_column(header)
    for c in plan.columns:
        if c.source == "(made)":
            source = "(made)"
        else:
            source = c.source_type if c.source == c.name else f"{c.source}: {c.source_type}"
        table.add_row(
            escape(c.name),
            escape(source),
            c.table_type,
            c.field_type or "[red]none[/]",
            escape(c.note),
        )
    console.print(table)
    console.print("first rows:")
    console.print(escape(load.preview.to_pandas().to_string(index=False, max_colwidth=40)))
    for hint in plan.hints:
        console.print(f"[yellow]hint:[/] {escape(hint)}", soft_wrap=True)
    if plan.exists and plan.mode == "create":
        console.print(
            f"[yellow]{plan.table} exists:[/] pass --append to add rows or --replace to replace it"
        )
    elif dry_run:
        console.print(f"would {plan.action}")
    if plan.added and not dry_run:
        console.print(
            f"adding column(s) {escape(', '.join(plan.added))} to {plan.table} (--add-columns): "
            "the rows already in it read null there",
            highlight=False,
        )


def _write(load: Load) -> LoadReport:
    with Bar(
        "{task.description}",
        BarColumn(),
        DownloadColumn() if load.input.unit == "bytes" else MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(f"{load.plan.action}", total=load.input.total)

        def advance(rows: int, done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total, description=f"{rows:,} rows")

        return load.write(advance)


def _run(open_load: Callable[[], Load], dry_run: bool) -> None:
    load = open_load()
    try:
        _show(load, dry_run)
        if dry_run:
            console.print("dry run: nothing written")
            return
        report = _write(load)
    finally:
        load.close()
    truncated = sum(report.truncated.values())
    console.print(
        f"{report.rows:,} rows into {report.table} ({report.files} data file(s), snapshot "
        f"{report.snapshot_id})"
        + (f"; {truncated:,} times lost digits below the microsecond" if truncated else "")
    )
    if report.message:
        console.print(escape(report.message), highlight=False)


_table = click.option("--table", required=True, help="The Iceberg table: NAMESPACE.NAME.")
_append = click.option("--append", is_flag=True, help="Add the rows to an existing table.")
_replace = click.option("--replace", is_flag=True, help="Replace an existing table.")
_dry_run = click.option(
    "--dry-run", is_flag=True, help="Show the schema and first rows; write nothing."
)


@click.command("load")
@click.argument("source", type=click.Path(path_type=Path))
@_table
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "parquet", "json"]), help="Default: from the name."
)
@click.option(
    "--timestamp-columns",
    default="",
    help="Comma-separated columns holding times as text or epoch numbers.",
)
@click.option(
    "--epoch-unit",
    type=click.Choice(["s", "ms", "us"]),
    help="The unit of numeric times in --timestamp-columns.",
)
@click.option(
    "--timezone",
    default="UTC",
    show_default=True,
    help="The zone of times written without one (IANA name, e.g. Europe/Paris).",
)
@click.option(
    "--dst",
    type=click.Choice(["raise", "earliest", "latest"]),
    default="raise",
    show_default=True,
    help="A zone-less time a daylight-saving change skips or repeats: an error, or a reading.",
)
@click.option("--type", "types", multiple=True, metavar="NAME=TYPE", help="A column's Field type.")
@click.option("--rename", multiple=True, metavar="OLD=NEW", help="A column's name in the table.")
@click.option(
    "--label", metavar="'COLUMN>=NUMBER'", help="Add a 0/1 'label' column from a comparison."
)
@click.option("--delimiter", help="CSV field separator (default ',', tab for .tsv).")
@_append
@click.option(
    "--add-columns",
    is_flag=True,
    help="With --append: add the file's columns the table lacks (its rows read null there).",
)
@_replace
@_dry_run
@friendly
def load(
    source: Path,
    table: str,
    fmt: str | None,
    timestamp_columns: str,
    epoch_unit: str | None,
    timezone: str,
    dst: str,
    types: tuple[str, ...],
    rename: tuple[str, ...],
    label: str | None,
    delimiter: str | None,
    append: bool,
    add_columns: bool,
    replace: bool,
    dry_run: bool,
) -> None:
    """Load a CSV, Parquet or JSON-lines file into an Iceberg table, read in batches.

    Time columns become UTC timestamps (Iceberg timestamptz, a pipeline's Field "timestamp"):
    zone-less times are read in --timezone, nanoseconds truncated to microseconds, epoch
    numbers read in --epoch-unit. The schema is shown before anything is written; options
    name columns as the file does. See docs/own-data.md.
    """
    from flow.workflows.ingest import LoadOptions, load_file
    from flow.workflows.timestamps import TimeRules

    options = LoadOptions(
        table=table,
        format=fmt,  # type: ignore[arg-type]  # click.Choice checked it
        timestamp_columns=tuple(c.strip() for c in timestamp_columns.split(",") if c.strip()),
        time=TimeRules(timezone=timezone, epoch_unit=epoch_unit, dst=dst),  # type: ignore[arg-type]
        types=_pairs(types, "--type"),
        renames=_pairs(rename, "--rename"),
        label=label,
        delimiter=delimiter.replace("\\t", "\t") if delimiter else None,
        mode=_mode(append, replace),
        add_columns=add_columns,
    )
    _run(lambda: load_file(stack_config(), source, options), dry_run)


@click.group("import")
def import_() -> None:
    """Well-known public data sets in their own formats, into Iceberg tables."""


def _instant(value: str | None, option: str = "--start") -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(
            f"{value!r}: write ISO-8601 with a zone, e.g. 2024-01-01T00:00:00Z",
            param_hint=option,
        ) from exc


def _split_at(value: str | None) -> datetime | float | None:
    """A share of the rows (``0.8``) or a time (``2024-01-02T00:00:00Z``)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return _instant(value, "--split-at")


@import_.command("criteo")
@click.argument("file", type=click.Path(path_type=Path))
@_table
@click.option("--start", help="Event time of the first row (ISO-8601), for a 'ts' column.")
@click.option(
    "--rows-per-second",
    type=float,
    help="With --start: row n is at start + n / this (Kaggle's 7 days: about 76).",
)
@click.option(
    "--split-at",
    metavar="SHARE|TIME",
    help="Where training ends, recorded on the table for pipelines/criteo.py: a share of the "
    "rows (0.8: the first 80%% by event time train) or a time (rows before it train). "
    "Default with --start: 0.8 (--append: the table's split is kept).",
)
@click.option("--row-index", is_flag=True, help="Add 'row_id', the row's position from 0.")
@_append
@_replace
@_dry_run
@friendly
def import_criteo(
    file: Path,
    table: str,
    start: str | None,
    rows_per_second: float | None,
    split_at: str | None,
    row_index: bool,
    append: bool,
    replace: bool,
    dry_run: bool,
) -> None:
    """The Criteo display-ads format: label, i1..i13 (long), c1..c26 (string), tab separated,
    no header, empty for missing (null in the table). Gzip files are read as they are."""
    from flow.workflows.criteo import CriteoOptions
    from flow.workflows.criteo import import_criteo as opening

    options = CriteoOptions(
        table=table,
        start=_instant(start),
        rows_per_second=rows_per_second,
        split_at=_split_at(split_at),
        row_index=row_index,
        mode=_mode(append, replace),
    )
    _run(lambda: opening(stack_config(), file, options), dry_run)
