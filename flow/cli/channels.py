"""``flow handoff``: look at and tend handoff channels.

    flow handoff ls [LOCATION] [--json]        channels, commits, rows, unread bytes
    flow handoff show LOCATION CHANNEL [--json]   schema, layout, recent commits, consumers
    flow handoff verify LOCATION CHANNEL [--json] shards, commits and their sequence: what is lost
    flow handoff verify LOCATION CHANNEL --audit DIR   and every row read once by the trainers
    flow handoff close LOCATION CHANNEL        tell followers the producer has finished
    flow handoff retire LOCATION CHANNEL       delete shards every consumer group has read
    flow handoff drop LOCATION CHANNEL --yes   delete the channel

LOCATION is a pipeline namespace (a folder under $FLOW_HANDOFF), a path, or a URI (s3://...).
Results go to stdout (tables, or JSON with ``--json``); errors to stderr.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.markup import escape
from rich.table import Table

from flow.cli.common import console, emit_json, friendly, out, stack_config
from flow.errors import ChannelNotFoundError, FlowError

if TYPE_CHECKING:  # pyarrow loads inside the commands: `flow --help` stays instant
    from flow.handoff.audit import AuditProof
    from flow.handoff.channel import Channel
    from flow.storage import Location

__all__ = ["handoff"]


def resolve(where: str) -> Location:
    """A namespace name means the folder of that name under the stack's handoff root."""
    from flow.storage import location

    if "/" in where or "://" in where or where.startswith("."):
        return location(where)
    return location(stack_config().handoff).child(where)


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


@dataclass(frozen=True)
class ChannelSummary:
    name: str
    commits: int
    rows: int
    bytes_kept: int
    unread_bytes: int
    groups: int
    closed: bool

    @classmethod
    def of(cls, channel: Channel) -> ChannelSummary:
        commits = [channel.commit(b) for b in channel.commit_ids()]
        kept = sum(c.bytes for c in commits if not channel.retired(c.batch_id))
        return cls(
            name=channel.name,
            commits=len(commits),
            rows=sum(c.rows for c in commits),
            bytes_kept=kept,
            unread_bytes=channel.unconsumed_bytes(),
            groups=len(channel.positions()),
            closed=channel.closed(),
        )


def _channel(where: str, name: str) -> Channel:
    from flow.handoff.channel import Channel

    channel = Channel(resolve(where), name)
    channel.meta()  # names what exists when the channel does not
    return channel


@click.group()
def handoff() -> None:
    """Look at and tend handoff channels (see ``flow handoff ls``)."""


_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")


@handoff.command("ls")
@click.argument("where", required=False)
@_JSON
@friendly
def ls(where: str | None, as_json: bool) -> None:
    """Channels of LOCATION (a namespace, path or URI); every namespace when omitted."""
    from flow.handoff.channel import Channel, list_channels
    from flow.storage import location

    if where is None:
        root = location(stack_config().handoff)
        places = [root] if list_channels(root) else []  # a root may itself hold channels
        namespaces = (root.child(name) for name in root.list(folders=True))
        places += [space for space in namespaces if list_channels(space)]
        if not places:
            if as_json:
                emit_json([])
            else:
                console.print(f"no handoff channels under {escape(str(root))}")
            return
    else:
        places = [resolve(where)]
        if not places[0].exists():
            raise ChannelNotFoundError(f"handoff location {places[0]} does not exist")
    if as_json:
        emit_json(
            [
                {"location": str(place), **asdict(ChannelSummary.of(Channel(place, name)))}
                for place in places
                for name in list_channels(place)
            ]
        )
        return
    for place in places:
        table = Table(title=escape(str(place)), title_justify="left")
        for header in ("channel", "commits", "rows", "on disk", "unread", "consumer groups"):
            table.add_column(header, justify="left" if header == "channel" else "right")
        for name in list_channels(place):
            s = ChannelSummary.of(Channel(place, name))
            table.add_row(
                escape(name) + (" [dim](closed)[/]" if s.closed else ""),
                f"{s.commits:,}",
                f"{s.rows:,}",
                _mb(s.bytes_kept),
                _mb(s.unread_bytes),
                str(s.groups),
            )
        out.print(table)


@handoff.command("show")
@click.argument("where")
@click.argument("name")
@click.option("--commits", "last", default=10, show_default=True, help="Recent commits to list.")
@_JSON
@friendly
def show(where: str, name: str, last: int, as_json: bool) -> None:
    """A channel's schema, layout, recent commits and consumer positions."""
    channel = _channel(where, name)
    meta = channel.meta()
    if as_json:
        emit_json(_shown(channel, last))
        return
    out.print(
        f"[bold]{escape(name)}[/] in {escape(str(channel.root))}: {meta.num_buckets} buckets, "
        f"compression {meta.compression}"
        + (f" (level {meta.compression_level})" if meta.compression_level is not None else "")
        + f", created {meta.created_at}"
        + (", [bold]closed[/]" if channel.closed() else ""),
        highlight=False,
    )
    for field in meta.schema:
        out.print(f"  {escape(field.name)}: {escape(str(field.type))}", highlight=False)
    if meta.layout:
        dense, sparse = meta.layout.get("dense", []), meta.layout.get("sparse", [])
        out.print(f"  layout: {len(dense)} dense, {len(sparse)} sparse features", highlight=False)
    if meta.feature_state:
        out.print(f"  feature state: {escape(meta.feature_state)}", highlight=False)
    ids = channel.commit_ids()
    table = Table(title=f"last {min(last, len(ids))} of {len(ids)} commits", title_justify="left")
    for header in ("batch", "rows", "shards", "size", "event time", "committed", "sources"):
        table.add_column(header)
    for batch_id in ids[-last:]:
        commit = channel.commit(batch_id)
        size = "retired" if channel.retired(batch_id) else _mb(commit.bytes)
        span = f"{commit.event_time.get('min') or '-'} .. {commit.event_time.get('max') or '-'}"
        sources = ", ".join(f"{k}={v}" for k, v in commit.source_positions.items())
        table.add_row(
            str(batch_id),
            f"{commit.rows:,}",
            str(len(commit.shards)),
            size,
            escape(span),
            escape(commit.committed_at[:19]),
            escape(sources[:80]),
        )
    out.print(table)
    positions = channel.positions()
    if positions:
        table = Table(title="consumer groups", title_justify="left")
        for header in ("group", "rank", "read up to batch", "updated"):
            table.add_column(header)
        for group, ranks in sorted(positions.items()):
            for p in sorted(ranks, key=lambda p: p.rank):
                table.add_row(
                    escape(group),
                    f"{p.rank}/{p.world_size}",
                    str(p.consumed_upto),
                    escape(p.updated_at[:19]),
                )
        out.print(table)


def _shown(channel: Channel, last: int) -> dict[str, object]:
    """What ``show`` prints, as data."""
    meta = channel.meta()
    ids = channel.commit_ids()
    recent = []
    for batch_id in ids[-last:]:
        commit = channel.commit(batch_id)
        recent.append(
            {
                "batch": batch_id,
                "rows": commit.rows,
                "shards": len(commit.shards),
                "bytes": commit.bytes,
                "retired": channel.retired(batch_id),
                "event_time": commit.event_time,
                "committed_at": commit.committed_at,
                "sources": commit.source_positions,
            }
        )
    return {
        "channel": channel.name,
        "location": str(channel.root),
        "buckets": meta.num_buckets,
        "compression": meta.compression,
        "compression_level": meta.compression_level,
        "created_at": meta.created_at,
        "closed": channel.closed(),
        "schema": {f.name: str(f.type) for f in meta.schema},
        "layout": meta.layout,
        "feature_state": meta.feature_state,
        "commits": len(ids),
        "recent_commits": recent,
        "consumer_groups": {
            group: [
                {
                    "rank": p.rank,
                    "world_size": p.world_size,
                    "consumed_upto": p.consumed_upto,
                    "updated_at": p.updated_at,
                }
                for p in sorted(ranks, key=lambda p: p.rank)
            ]
            for group, ranks in sorted(channel.positions().items())
        },
    }


@handoff.command("verify")
@click.argument("where")
@click.argument("name")
@click.option(
    "--in-flight-grace",
    default=3600.0,
    show_default=True,
    help="Seconds an uncommitted batch above the last commit counts as still being written.",
)
@click.option(
    "--audit",
    "audit_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="A trainer's --audit-dir: prove every row of the channel was read exactly once, "
    "across its runs and resumes, naming rows read twice or never.",
)
@click.option("--key", help="The column that names a row (default: the channel's label key).")
@_JSON
@friendly
def verify(
    where: str,
    name: str,
    in_flight_grace: float,
    audit_dir: Path | None,
    key: str | None,
    as_json: bool,
) -> None:
    """Check the channel against its commits: damaged shards, missing commits, orphan shards,
    row counts; with ``--audit``, the trainers' reads against its rows. One line per problem
    and a summary; exit 1 if there is any problem."""
    from flow.handoff.audit import prove_channel

    channel = _channel(where, name)
    report = channel.verify(in_flight_grace=in_flight_grace)
    proof = None if audit_dir is None else prove_channel(channel, audit_dir, key)
    if as_json:
        emit_json(
            {
                "ok": report.ok and (proof is None or proof.exactly_once),
                "summary": report.summary(),
                "problems": [{"kind": p.kind, "message": p.message} for p in report.problems],
                **({} if proof is None else {"audit": _proof_json(proof)}),
            }
        )
    else:
        for problem in report.problems:
            out.print(
                f"[red]{problem.kind}:[/] {escape(problem.message)}",
                highlight=False,
                soft_wrap=True,
            )
        out.print(escape(report.summary()), highlight=False, soft_wrap=True)
        for line in [] if proof is None else proof.lines():
            out.print(escape(line), highlight=False, soft_wrap=True)
    if not report.ok or (proof is not None and not proof.exactly_once):
        raise SystemExit(1)


def _proof_json(proof: AuditProof) -> dict[str, object]:
    return {
        "exactly_once": proof.exactly_once,
        "rows": proof.rows,
        "read": proof.read,
        # Row ids as hex: a uint64 does not survive every JSON reader.
        "duplicates": {f"{i:016x}": n for i, n in sorted(proof.duplicates.items())},
        "gaps": {f"{i:016x}": n for i, n in sorted(proof.gaps.items())},
    }


@handoff.command("close")
@click.argument("where")
@click.argument("name")
@friendly
def close(where: str, name: str) -> None:
    """Mark the channel finished: following readers end after its last commit."""
    _channel(where, name).close()
    console.print(f"closed {escape(name)}")


@handoff.command("retire")
@click.argument("where")
@click.argument("name")
@friendly
def retire(where: str, name: str) -> None:
    """Delete the shards every rank of every consumer group has read."""
    channel = _channel(where, name)
    if not channel.positions():
        raise FlowError(
            f"channel {name!r} has no consumer groups recorded, so nothing is known to be read; "
            "readers record positions with ReadOptions(consumer_group=...)"
        )
    freed = channel.retire()
    console.print(
        f"freed {_mb(freed)}; read by every group up to batch {channel.consumed_by_all()}"
    )


@handoff.command("drop")
@click.argument("where")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Really delete the channel, its shards and commits.")
@friendly
def drop(where: str, name: str, yes: bool) -> None:
    """Delete a channel entirely (its writer's next run starts it again from batch 0)."""
    channel = _channel(where, name)
    if not yes:
        raise FlowError(f"this deletes {channel.folder} and everything in it; add --yes to do it")
    channel.folder.remove()
    console.print(f"dropped {escape(str(channel.folder))}")
