"""Faults on a running live stage, on the real services: the driver killed (-9) at random moments,
the broker gone for over a minute. Every produced record is accounted for afterwards: a training
row (with the right label) or a dead letter (with the right reason) or a counted duplicate, none
lost, none twice. Both label strategies: ``window`` (one row per impression, labelled once its
window closes) and ``immediate`` (the demo's: every impression at once as its first row, a
negative, and a second row, its positive, when a click comes within the window).

    pytest -m faults    # this folder, and the trainer-kill and tracking-outage tests

Each test writes its figures (events in, rows out, lost, duplicated, dead letters by reason) to
``$FLOW_HOME/faults/<test>.json``; docs/reliability.md shows a run's.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest

from flow.config import StackConfig
from flow.errors import FlowError, MissingCommitError, ShardCorruptError
from flow.handoff import Channel, ChannelReader, ReadOptions
from flow.handoff.format import COMMITS, commit_name
from flow.stack.iceberg import open_catalog
from flow.stack.kafka import ensure_topics
from spark_jobs.sinks import ledger_totals
from tests.faults.events import BROKEN, Expected, Producer, marker_of
from tests.support import FLOW_BIN, REPO, clean_environ, handoff_rows, run_flow

pytestmark = [pytest.mark.integration, pytest.mark.faults]

PIPELINE = str(REPO / "tests" / "faults" / "live_pipeline.py")


LAST = "v-last"
"""The impression that closes every earlier window at the end of a run: an id no numbered
impression has (the long run's 30,000 include a v9999)."""
Strategy = Literal["window", "immediate"]
STRATEGIES: tuple[Strategy, ...] = ("immediate", "window")


class Stage:
    """``flow run`` of the suite's live stage, as a user starts it: killable as a whole."""

    def __init__(
        self,
        env: dict[str, str],
        namespace: str,
        log: Path,
        strategy: Strategy = "window",
        *extra: str,
    ) -> None:
        self.env, self.namespace, self.log = env, namespace, log
        self.strategy, self.extra = strategy, extra
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self, *more: str) -> list[str]:
        return [
            FLOW_BIN, "run", PIPELINE, "--namespace", self.namespace,
            "--strategy", self.strategy, *self.extra, *more,
        ]  # fmt: skip

    def start(self, *more: str) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.argv("--continuous", *more),
                env={**clean_environ(), **self.env},
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the JVM and workers die with it
            )

    def kill(self) -> None:
        """kill -9 of the whole job: the flow command, spark-submit's JVM, the Python driver."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def rows(stack: StackConfig, namespace: str) -> list[dict[str, Any]]:
    where = f"{stack.handoff}/{namespace}"
    if not Channel(where, "live").exists():
        return []
    return list(handoff_rows(where, "live").select(["id", "label"]).to_pylist())


def labels_of(stack: StackConfig, namespace: str) -> dict[str, set[float]]:
    """The labels of each id's training rows: one with ``window``; with ``immediate``, 0.0 (its
    first row) and 1.0 too once it was clicked."""
    found: dict[str, set[float]] = {}
    for row in rows(stack, namespace):
        found.setdefault(row["id"], set()).add(row["label"])
    return found


def wait_for(check: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


def ledger(stack: StackConfig, namespace: str) -> Counter[str]:
    """The counts every commit of the stage put in the dead-letter table's snapshots: per
    writer, its latest roll-up and the commits after it (older snapshots may be expired)."""
    table = open_catalog(stack.catalog).load_table(f"{namespace}.dead_letters")
    by_writer: dict[str, list[dict[str, str]]] = {}
    for snapshot in table.metadata.snapshots:
        summary = dict(snapshot.summary.additional_properties if snapshot.summary else {})
        by_writer.setdefault(summary.get("flow.writer", ""), []).append(summary)
    totals: Counter[str] = Counter()
    for summaries in by_writer.values():
        found = ledger_totals(summaries)[0]
        totals.update({k: v for k, v in found.items() if k.startswith("flow.")})
    return totals


def dead_letters(stack: StackConfig, namespace: str) -> list[dict[str, Any]]:
    table = open_catalog(stack.catalog).load_table(f"{namespace}.dead_letters")
    return list(table.scan(selected_fields=("raw", "key", "reason")).to_arrow().to_pylist())


def _trained(
    trained: list[dict[str, Any]], expected: Expected, strategy: Strategy
) -> dict[str, Any]:
    """Lost, duplicated and wrongly labelled ids among the training rows.

    ``window``: one row per impression, with its label. ``immediate``: every impression once as
    a first row (label 0) and every click within its window once as a second row (label 1);
    nothing waits for a window, so nothing is pending."""
    if strategy == "window":
        ids = Counter(r["id"] for r in trained)
        labels = {r["id"]: r["label"] for r in trained}
        return {
            "first_rows": len(ids),
            "lost": sorted(set(expected.labels) - set(ids) - expected.pending),
            "duplicated": sorted(i for i, n in ids.items() if n > 1),
            "wrong_labels": sorted(
                i for i in labels if labels[i] != expected.labels.get(i, labels[i])
            ),
        }
    first = Counter(r["id"] for r in trained if r["label"] == 0.0)
    positive = Counter(r["id"] for r in trained if r["label"] == 1.0)
    clicked = {i for i, label in expected.labels.items() if label == 1.0}
    return {
        "first_rows": len(first),
        "positives": sum(positive.values()),
        "lost": sorted(set(expected.labels) - set(first)),
        "duplicated": sorted(
            {i for i, n in first.items() if n > 1} | {i for i, n in positive.items() if n > 1}
        ),
        # A positive for an impression not clicked within its window, or none for one that was.
        "wrong_labels": sorted(set(positive) ^ clicked),
    }


def account(
    stack: StackConfig, namespace: str, expected: Expected, strategy: Strategy = "window"
) -> dict[str, Any]:
    """Everything produced, matched to what came out; the figures of docs/reliability.md."""
    trained = rows(stack, namespace)
    letters = dead_letters(stack, namespace)
    by_marker: dict[str, list[str]] = {}
    for letter in letters:
        marker = marker_of(letter["raw"], letter["key"])
        by_marker.setdefault(marker or "?", []).append(letter["reason"])
    counts = ledger(stack, namespace)
    return {
        "strategy": strategy,
        "impressions_in": expected.impressions,
        "clicks_in": expected.clicks,
        "training_rows": len(trained),
        **_trained(trained, expected, strategy),
        "dead_letters": len(letters),
        "dead_letters_by_reason": dict(Counter(_kind(r["reason"]) for r in letters)),
        "unmatched_dead_letters": by_marker.get("?", []),
        "missing_dead_letters": sorted(m for m in expected.reasons if m not in by_marker),
        "dead_letters_twice": sorted(m for m, found in by_marker.items() if len(found) > 1),
        "wrong_reasons": {
            m: found
            for m, found in by_marker.items()
            if m in expected.reasons and expected.reasons[m] not in found[0]
        },
        "duplicates_counted": counts["flow.duplicates.impressions"],
        "duplicates_sent": expected.duplicates,
        "late": counts["flow.late.impressions"],
        "late_by_spark_operators": counts["flow.operators_late"],
        "input_counted": counts["flow.input.impressions"] + counts["flow.input.clicks"],
        "pending": sorted(expected.pending) if strategy == "window" else [],
    }


def _kind(reason: str) -> str:
    """A reason without its values: 'late', 'not a JSON object', "field 'position' = ..."."""
    return reason.split(":")[0] if ":" in reason[:40] else reason.split(" = ")[0][:60]


def check(found: dict[str, Any], expected: Expected) -> None:
    assert found["lost"] == []
    assert found["duplicated"] == []
    assert found["wrong_labels"] == []
    assert found["missing_dead_letters"] == []
    assert found["dead_letters_twice"] == []
    assert found["unmatched_dead_letters"] == []
    assert found["wrong_reasons"] == {}
    assert found["duplicates_counted"] == found["duplicates_sent"]
    assert found["late"] == found["late_by_spark_operators"]  # ours are exactly Spark's drops
    assert found["input_counted"] == expected.impressions + expected.clicks
    # Every impression: a first training row, a dead letter, a counted duplicate or still
    # pending (window labels: the one the suite sends last).
    impression_letters = sum(1 for m in expected.reasons if m.startswith(("bad-imp", "late")))
    assert expected.impressions == (
        found["first_rows"]
        + impression_letters
        + found["duplicates_counted"]
        + len(found["pending"])
    )


def report(stack: StackConfig, name: str, found: dict[str, Any]) -> None:
    folder = stack.home / "faults"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(found, indent=2))
    print(f"\n{name}: " + json.dumps(found), file=sys.stderr)


def new_namespace(stack: StackConfig) -> str:
    ns = f"fz{uuid.uuid4().hex[:6]}"
    ensure_topics(stack.kafka, [f"{ns}.impressions", f"{ns}.clicks"], partitions=2)
    return ns


@pytest.fixture
def namespace(running_stack: StackConfig) -> str:
    return new_namespace(running_stack)


@dataclass
class KilledRun:
    namespace: str
    expected: Expected
    found: dict[str, Any]
    strategy: Strategy


@pytest.fixture(scope="module", params=STRATEGIES)
def killed_run(
    request: pytest.FixtureRequest,
    running_stack: StackConfig,
    stack_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> KilledRun:
    """Two kill -9 rounds at random moments, each restarted from the checkpoint; the third run
    must close the windows the run before it left open, and, still running, account for every
    record once the last window is closed (`finish`): a fourth driver start, a drain, added
    ~40 s a strategy to CI and nothing the restarts do not already prove."""
    strategy: Strategy = request.param
    namespace = new_namespace(running_stack)
    tmp_path = tmp_path_factory.mktemp("killed")
    pick = random.Random(7)
    stack = running_stack
    now = datetime.now(UTC)
    events = Producer(stack.kafka, namespace, base=now - timedelta(minutes=100))
    stage = Stage(stack_env, namespace, tmp_path / "stage.log", strategy)
    kills = 0

    def labelled(expect: Callable[[str, float], bool]) -> Callable[[], bool]:
        """Every id ``expect`` picks has a training row with its expected label."""

        def check() -> bool:
            found = labels_of(stack, namespace)
            wanted = [(i, lab) for i, lab in events.expected.labels.items() if expect(i, lab)]
            return all(label in found.get(i, ()) for i, label in wanted)

        return check

    def number(ident: str) -> int:
        return int(ident[1:]) if ident.startswith("v") else 0

    try:
        # Round 1: history-like traffic, clicks, duplicates and broken records of many kinds.
        first = events.impressions(40, clicks=True, repeat=(5, 6, 7))
        events.broken([k for k in BROKEN if k <= "bad-imp-11"])
        stage.start()
        wait_for(labelled(lambda i, label: label == 1.0 and number(i) <= 12), "round 1 positives")
        time.sleep(pick.uniform(0, 4))
        stage.kill()
        kills += 1

        # Round 2: more traffic, the other broken kinds; then records behind the watermark.
        events.impressions(40, clicks=True)
        events.broken([k for k in BROKEN if k > "bad-imp-11"])
        stage.start()
        wait_for(labelled(lambda i, label: label == 1.0), "every positive so far")
        events.impressions(40, clicks=False)
        wait_for(labelled(lambda i, label: number(i) <= 80), "negatives whose windows closed")
        # At the first round's start: behind the watermark of every batch since the first, on
        # either strategy. (At round 2's start they were not always: immediate labels close no
        # windows, so the wait above passes before the watermark has moved past round 2.)
        events.late(["late1", "late2"], at=first)
        time.sleep(pick.uniform(0, 6))
        stage.kill()
        kills += 1

        # Round 3: after a restart the watermark moves again once every topic has new data.
        events.impressions(20, clicks=True, every=1.0)
        stage.start()
        wait_for(labelled(lambda i, label: number(i) <= 120), "negatives after the restart")
        # The end: an impression closes every earlier window; the running stage accounts for all.
        finish(stage, events, stack, namespace, "every record after two kills", timeout=300)
    finally:
        if stage.process is not None and stage.process.poll() is None:
            stage.kill()
    found = account(stack, namespace, events.expected, strategy) | {"driver_kills": kills}
    report(stack, f"driver-kills-{strategy}", found)
    return KilledRun(namespace, events.expected, found, strategy)


def test_the_driver_killed_at_random_moments_loses_and_repeats_nothing(
    killed_run: KilledRun,
) -> None:
    check(killed_run.found, killed_run.expected)


def test_a_damaged_handoff_is_found_and_never_trained_on_silently(
    running_stack: StackConfig, stack_env: dict[str, str], killed_run: KilledRun, tmp_path: Path
) -> None:
    """The killed run's channel, copied, then hurt four ways: each is reported by
    ``flow handoff verify`` (exit 1) and stops a reader with an error naming it."""
    source = Path(f"{running_stack.handoff}/{killed_run.namespace}")
    intact = tmp_path / "intact"
    shutil.copytree(source, intact)
    verified = run_flow(["handoff", "verify", str(intact), "live"], stack_env)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    def hurt(name: str, how: Callable[[Channel], None]) -> tuple[str, BaseException | None]:
        where = tmp_path / name
        shutil.copytree(source, where)
        how(Channel(str(where), "live"))
        said = run_flow(["handoff", "verify", str(where), "live"], stack_env)
        assert said.returncode == 1, f"{name}: {said.stdout}{said.stderr}"
        try:
            for _ in ChannelReader(str(where), "live", options=ReadOptions(batch_size=16)):
                pass
        except FlowError as error:
            return said.stdout + said.stderr, error
        return said.stdout + said.stderr, None

    def first_shard(channel: Channel) -> Path:
        commit = next(channel.commit(b) for b in channel.commit_ids() if channel.commit(b).shards)
        return Path(channel.folder.path) / commit.shards[0].path

    def flip(channel: Channel) -> None:
        shard = first_shard(channel)
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))

    def truncate(channel: Channel) -> None:
        shard = first_shard(channel)
        shard.write_bytes(shard.read_bytes()[:-100])

    def delete_commit(channel: Channel) -> None:
        ids = channel.commit_ids()
        (Path(channel.folder.path) / COMMITS / commit_name(ids[len(ids) // 2])).unlink()

    def orphan(channel: Channel) -> None:
        shard = first_shard(channel)
        shutil.copy(shard, shard.with_name("orphan-" + shard.name))

    said, error = hurt("bit-flip", flip)
    assert "damaged" in said
    assert isinstance(error, ShardCorruptError)
    said, error = hurt("truncated", truncate)
    assert "damaged" in said
    assert isinstance(error, ShardCorruptError)
    said, error = hurt("deleted-commit", delete_commit)
    assert "missing" in said
    assert isinstance(error, MissingCommitError)
    said, error = hurt("orphan", orphan)
    assert "orphan" in said
    assert error is None  # an orphan is never read: no commit names it


def finish(
    stage: Stage, events: Producer, stack: StackConfig, namespace: str, what: str, timeout: float
) -> int:
    """Wait until every positive sent is a training row, send an event that closes the last
    windows and wait, the stage still running, until every record is accounted for (the
    running stage itself, no restart, closes them); stop it. The restarts its log shows."""
    clicked = {i for i, label in events.expected.labels.items() if label == 1.0}
    wait_for(lambda: clicked <= {r["id"] for r in rows(stack, namespace)}, what, timeout=timeout)
    events.pending(LAST, datetime.now(UTC))

    def accounted() -> bool:
        try:
            check(account(stack, namespace, events.expected, stage.strategy), events.expected)
        except AssertionError:
            return False
        return True

    try:
        wait_for(accounted, f"{what}: every record accounted for", timeout=timeout)
    except AssertionError:
        # Timed out: the check once more, for its own message of what is missing.
        check(account(stack, namespace, events.expected, stage.strategy), events.expected)
        raise
    assert stage.process is not None
    assert stage.process.poll() is None, "the stage stopped"
    stage.kill()
    return stage.log.read_text(errors="replace").count("from its checkpoint in")


def test_a_broker_outage_of_over_a_minute_is_ridden_out(
    running_stack: StackConfig, stack_env: dict[str, str], namespace: str, tmp_path: Path
) -> None:
    stack = running_stack
    events = Producer(stack.kafka, namespace, base=datetime.now(UTC) - timedelta(minutes=40))
    stage = Stage(stack_env, namespace, tmp_path / "stage.log")
    try:
        events.impressions(30, clicks=True)
        stage.start()
        wait_for(lambda: len(rows(stack, namespace)) > 0, "the first rows")
        # The outage starts with `down`: the broker stops answering at once, though its JVM
        # can take ~40 s to exit while a client is connected (then it is killed).
        outage = time.monotonic()
        down = run_flow(["services", "down", "--only", "kafka"], stack_env)
        assert down.returncode == 0, down.stderr
        # Past the Kafka client's 60 s timeout: the query fails, maybe repeatedly.
        time.sleep(max(0.0, 70 - (time.monotonic() - outage)))
        up = run_flow(["services", "up", "--only", "kafka"], stack_env)
        assert up.returncode == 0, up.stdout + up.stderr
        outage = time.monotonic() - outage
    finally:
        run_flow(["services", "up", "--only", "kafka"], stack_env)
    try:
        events = _reconnected(events, stack)
        events.impressions(30, clicks=True)
        assert stage.process is not None
        assert stage.process.poll() is None, "the stage did not ride out the outage"
        restarts = finish(stage, events, stack, namespace, "the positives sent after the outage",
                          timeout=420)  # fmt: skip
    finally:
        if stage.process is not None and stage.process.poll() is None:
            stage.kill()
    found = account(stack, namespace, events.expected) | {
        "outage_s": round(outage),
        "restarts": restarts,
    }
    report(stack, "broker-outage", found)
    # Spark's Kafka source retries an offset lookup itself (three tries of up to a minute), so an
    # outage this short is ridden out inside the query; a longer one fails the query and the
    # stage's supervisor restarts it (the next test makes one fail).
    check(found, events.expected)


def test_topics_created_after_the_stage_started_are_waited_for_by_restarts(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path
) -> None:
    """The query fails while its topics do not exist; the stage restarts it from its checkpoint
    with backoff (one line each) until they do, then reads everything."""
    stack = running_stack
    namespace = f"fz{uuid.uuid4().hex[:6]}"  # no topics yet
    stage = Stage(stack_env, namespace, tmp_path / "stage.log")
    try:
        stage.start()
        wait_for(lambda: "restart 1/" in stage.log.read_text(errors="replace"),
                 "a restart while the topics are missing", timeout=240)  # fmt: skip
        assert stage.process is not None
        assert stage.process.poll() is None
        ensure_topics(stack.kafka, [f"{namespace}.impressions", f"{namespace}.clicks"])
        events = Producer(stack.kafka, namespace, base=datetime.now(UTC) - timedelta(minutes=40))
        events.impressions(20, clicks=True)
        finish(stage, events, stack, namespace, "the positives once the topics exist",
               timeout=300)  # fmt: skip
    finally:
        if stage.process is not None and stage.process.poll() is None:
            stage.kill()
    log = stage.log.read_text(errors="replace")
    lines = [line for line in log.splitlines() if "from its checkpoint in" in line]
    found = account(stack, namespace, events.expected) | {"restarts": len(lines)}
    report(stack, "missing-topics", found)
    assert lines, log[-3000:]
    assert all("live: the query failed (" in line for line in lines)
    check(found, events.expected)


def _reconnected(events: Producer, stack: StackConfig) -> Producer:
    """The same expectations, a producer connected to the broker that came back."""
    fresh = Producer(stack.kafka, events.namespace, events.base)
    fresh.expected, fresh.next_id, fresh.latest = events.expected, events.next_id, events.latest
    return fresh


def test_flow_run_stops_its_trainer_when_the_spark_side_fails(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    """A job that fails at once (its pipeline names a column no source has): `flow run --train`
    must not wait for a trainer that follows channels nobody will ever write."""
    app = tmp_path / "broken_pipeline.py"
    app.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'tests' / 'faults')!r})\n"
        "from dataclasses import replace\n"
        "from flow.pipeline import Derived, run_main\n"
        "from live_pipeline import faults_pipeline\n"
        "p = faults_pipeline('fzbroken')\n"
        "stage = p.stage('live')\n"
        # A derived expression only Spark can resolve: it fails on the Spark side, after the
        # trainer started (a missing feature column is caught before anything starts).
        "bad = (Derived('broken', 'no_such_column + 1'),)\n"
        "run_main(replace(p, stages=(replace(stage, derive=bad),)))\n"
    )
    started = time.monotonic()
    done = run_flow(["run", "--train", "--channel live --max-steps 5", str(app)], stack_env,
                    timeout=400)  # fmt: skip
    took = time.monotonic() - started
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-3000:]
    assert "stopping the trainer" in said, said[-3000:]
    assert "no_such_column" in said
    assert "SignalException" not in said  # the trainer stopped quietly (trainers.launch)
    assert took < 300, f"flow run took {took:.0f}s: it waited for its trainer"


LONG = os.environ.get("LONG_FAULTS", "") == "1"


def commits(stack: StackConfig, namespace: str) -> int:
    where = f"{stack.handoff}/{namespace}"
    return len(Channel(where, "live").commit_ids()) if Channel(where, "live").exists() else 0


@pytest.mark.skipif(not LONG, reason="the long fault run (~20 min a strategy): LONG_FAULTS=1")
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_long_run_five_driver_kills_and_a_three_minute_broker_outage_under_load(
    running_stack: StackConfig, stack_env: dict[str, str], tmp_path: Path, strategy: Strategy
) -> None:
    """The long version: 200 impressions a second (and their clicks) (30,000 in all, 150 s),
    while the driver is killed (-9) five times, each at a random moment once the stage is
    committing again after its restart; then the broker stopped for three minutes while the
    stage runs; then every record accounted for.

        LONG_FAULTS=1 .venv/bin/pytest tests/faults -k long_run --basetemp=/tmp/long-faults

    (``--basetemp``: pytest keeps three base folders, so other pytest runs meanwhile would
    delete this one's logs and figures.)
    """
    stack = running_stack
    namespace = new_namespace(stack)
    pick = random.Random(11)
    # Event time: 0.3 s apart (2.5 hours for 30,000), ending well in the past.
    events = Producer(stack.kafka, namespace, base=datetime.now(UTC) - timedelta(minutes=240))
    # Batches of up to 2,000 impressions: the suite's default of 50 would take the run hours.
    extra = ("--per-batch", "2000", "--max-restarts", "20")
    stage = Stage(stack_env, namespace, tmp_path / "stage.log", strategy, *extra)
    count, per_second = 30_000, 200.0
    sending: dict[str, float] = {}

    def send() -> None:
        # One timeline (0.3 s of event time apart, 2.5 hours in all), sent at 200 a second.
        started = time.monotonic()
        events.impressions(
            count, clicks=True, every=0.005, repeat=range(7, count, 500), per_second=per_second
        )
        sending["rate"] = count / (time.monotonic() - started)

    def grown(before: int) -> Callable[[], bool]:
        return lambda: commits(stack, namespace) > before + 1

    kills, outage, restarts = 0, 0.0, 0
    sender = threading.Thread(target=send, name="producer")
    try:
        events.broken(list(BROKEN))
        stage.start()
        sender.start()
        for _ in range(5):
            before = commits(stack, namespace)
            wait_for(grown(before), "commits after a start", 600)
            time.sleep(pick.uniform(0, 4))
            stage.kill()
            kills += 1
            stage.start()
        sender.join()

        def streaming_again() -> bool:  # one line a start: the stage runs again after its kills
            return stage.log.read_text(errors="replace").count("live: streaming ") > kills

        # Not "new commits": a stage that has caught up (window labels) commits nothing more.
        wait_for(streaming_again, "the stage streaming again after the kills", 600)
        down = run_flow(["services", "down", "--only", "kafka"], stack_env)
        assert down.returncode == 0, down.stderr
        outage = time.monotonic()
        time.sleep(185)
        up = run_flow(["services", "up", "--only", "kafka"], stack_env)
        assert up.returncode == 0, up.stdout + up.stderr
        outage = time.monotonic() - outage
        events = _reconnected(events, stack)
        events.impressions(200, clicks=True, every=0.005)
        assert stage.process is not None
        assert stage.process.poll() is None, "the stage did not ride out the outage"
        restarts = finish(stage, events, stack, namespace, "every positive", timeout=1800)
    finally:
        run_flow(["services", "up", "--only", "kafka"], stack_env)
        if stage.process is not None and stage.process.poll() is None:
            stage.kill()
    found = account(stack, namespace, events.expected, strategy) | {
        "driver_kills": kills,
        "send_rate_per_s": round(sending.get("rate", 0.0)),
        "outage_s": round(outage),
        "restarts": restarts,
    }
    report(stack, f"long-{strategy}", found)
    check(found, events.expected)
