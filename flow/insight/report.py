"""The insight report of a run's training rows: headline findings, an HTML page, PNG plots.

<folder>/profile.json     the statistics (the next run's reference)
<folder>/findings.json    the headline findings, most important first
<folder>/report.html      tables and the plots below, embedded (it reads on its own: in MLflow's
                          artifact view, a mail, a browser)
<folder>/numeric.png      each number's distribution in raw units (deciles, each bar labelled with
                          its range), now against the reference
<folder>/categorical.png  each category's out-of-vocabulary rate and distinct values
<folder>/label_rate.png   the label rate over event time (hourly)
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flow.insight.drift import DRIFTED, Drift, compare
from flow.insight.profile import Profile

__all__ = ["Insight", "bin_label", "findings", "number", "write_report"]

OOV_HIGH = 0.2
NULLS_HIGH = 0.05


@dataclass(frozen=True)
class Insight:
    profile: Profile
    reference: Profile | None
    drift: list[Drift]
    findings: list[str]


def findings(
    profile: Profile, reference: Profile | None, drift: list[Drift], against: str | None = None
) -> list[str]:
    """What a person should look at first, as sentences. ``against``: the channel the reference
    is of, when it is another channel's rows rather than the previous run's."""
    other = f"channel {against}" if against else "the previous run"
    said = [
        f"{d.feature} drifted: PSI {d.psi:.2f} against {other} (>= {DRIFTED})"
        for d in drift
        if d.drifted
    ]
    for name, stats in profile.categorical.items():
        if stats.oov_rate >= OOV_HIGH:
            was = reference.categorical.get(name) if reference else None
            then = f" (was {was.oov_rate:.0%})" if was else ""
            said.append(f"{name}: {stats.oov_rate:.0%} of rows out of vocabulary or null{then}")
    for name, numbers in profile.numeric.items():
        if numbers.count and numbers.nulls / numbers.count >= NULLS_HIGH:
            said.append(f"{name}: {numbers.nulls / numbers.count:.0%} of values missing")
    rate = f"label rate {profile.label_rate:.2%} over {profile.rows:,} rows"
    if reference is not None and reference.rows:
        rate += f" ({other} {reference.label_rate:.2%})"
    said.append(rate)
    if not any(d.drifted for d in drift):
        said.append(
            f"no feature drifted against {other}"
            if reference is not None
            else "no previous run to compare with: this run is the reference for the next"
        )
    return said


def _save(fig: Any, folder: Path, name: str) -> str:
    """Lay ``fig`` out, write it as ``folder/name`` and free it; ``name``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(folder / name, dpi=100)
    plt.close(fig)
    return name


def _plots(insight: Insight, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    profile, reference = insight.profile, insight.reference
    if profile.numeric:
        names = list(profile.numeric)
        cols = min(4, len(names))
        rows = -(-len(names) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
        for ax, name in zip(axes.flat, names, strict=False):
            now = profile.numeric[name]
            ax.bar(range(len(now.counts)), now.counts, color="tab:blue", alpha=0.7, label="now")
            before = reference.numeric.get(name) if reference else None
            if before is not None and before.edges == now.edges and any(before.counts):
                scale = sum(now.counts) / sum(before.counts)
                ax.step(range(len(before.counts)), [c * scale for c in before.counts],
                        where="mid", color="black", label="previous")  # fmt: skip
            ax.set_title(name if now.raw else f"{name} (as stored)", fontsize=9)
            # Bin i holds values from edge i-1 to edge i (the reference's deciles): every bar
            # says which, since deciles are unevenly wide.
            ax.set_xticks(range(len(now.counts)))
            ax.set_xticklabels(
                [bin_label(now.edges, i) for i in range(len(now.counts))],
                fontsize=6,
                rotation=60,
                ha="right",
            )
        for ax in list(axes.flat)[len(names) :]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=7)
        fig.suptitle("numeric features: rows per decile of the reference")
        made.append(_save(fig, folder, "numeric.png"))
    if profile.categorical:
        names = list(profile.categorical)
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(names) + 1.2))
        ax.barh(names, [profile.categorical[n].oov_rate for n in names], color="tab:orange")
        ax.set_xlabel("share of rows at index 0 (null / out of vocabulary)")
        ax.invert_yaxis()
        made.append(_save(fig, folder, "categorical.png"))
    if profile.label_rate_by_hour:
        hours = sorted(profile.label_rate_by_hour)
        fig, ax = plt.subplots(figsize=(8, 2.8))
        ax.plot(range(len(hours)), [profile.label_rate_by_hour[h][1] for h in hours], marker=".")
        ax.set_xticks(range(0, len(hours), max(1, len(hours) // 8)))
        ax.set_xticklabels([hours[i][5:13] for i in ax.get_xticks()], fontsize=7)
        ax.set_ylabel("label rate")
        ax.set_title("label rate over event time (hourly)")
        made.append(_save(fig, folder, "label_rate.png"))
    return made


def number(value: float) -> str:
    """A statistic as a person reads it: ``41.2``, ``0.0132``, ``1,250``."""
    if value != value:  # NaN: no values
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def bin_label(edges: list[float], bin_index: int) -> str:
    """Bin ``bin_index`` of ``edges`` as its range: ``<16``, ``16-24``, ``>=81`` (the first and
    the last bins are open)."""
    if not edges:
        return "all"
    if bin_index == 0:
        return f"<{number(edges[0])}"
    if bin_index >= len(edges):
        return f">={number(edges[-1])}"
    return f"{number(edges[bin_index - 1])}-{number(edges[bin_index])}"


def _embedded(folder: Path, name: str) -> str:
    """An ``<img>`` with the plot inside: a relative ``src`` shows nothing in MLflow's artifact
    view, which serves each artifact alone."""
    data = base64.b64encode((folder / name).read_bytes()).decode()
    return f'<p><img src="data:image/png;base64,{data}" alt="{html.escape(name)}"></p>'


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def write_report(
    profile: Profile, reference: Profile | None, folder: Path, against: str | None = None
) -> Insight:
    """Compare with ``reference`` (the previous run's profile, or channel ``against``'s), write
    every file of the report into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    drift = compare(reference, profile) if reference is not None else []
    insight = Insight(profile, reference, drift, findings(profile, reference, drift, against))
    (folder / "profile.json").write_text(json.dumps(profile.to_dict(), indent=1))
    (folder / "findings.json").write_text(json.dumps(insight.findings, indent=1))
    images = _plots(insight, folder)
    psi = {d.feature: f"{d.psi:.3f}" for d in drift}
    numeric = [
        [
            n,
            f"{s.count:,}",
            f"{s.nulls:,}",
            number(s.mean),
            number(s.std),
            number(s.quantiles["p1"]),
            number(s.quantiles["p50"]),
            number(s.quantiles["p99"]),
            "raw" if s.raw else "as stored",
            psi.get(n, "-"),
        ]
        for n, s in profile.numeric.items()
    ]
    categorical = [
        [n, f"{s.count:,}", f"{s.oov_rate:.2%}", f"{s.distinct:,}", psi.get(n, "-")]
        for n, s in profile.categorical.items()
    ]
    span = f"commits {profile.commits[0]}..{profile.commits[-1]}" if profile.commits else "empty"
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>Training data insight: {html.escape(profile.channel)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}</style></head><body>
<h1>Training data: channel {html.escape(profile.channel)}, {span}</h1>
<h2>Findings</h2><ul>{"".join(f"<li>{html.escape(f)}</li>" for f in insight.findings)}</ul>
<h2>Numeric features</h2>
<p>In raw units: each feature's standardizing and log undone (values its clip bounds cut stay at
those bounds, and a missing value is its fill); "as stored" where the channel does not record
how (the values the trainer reads).</p>
{_table(["feature", "rows", "missing", "mean", "std", "p1", "p50", "p99", "units", "PSI"], numeric)}
<h2>Categorical features</h2>
{_table(["feature", "rows", "OOV / null", "distinct", "PSI"], categorical)}
{"".join(_embedded(folder, i) for i in images)}
</body></html>"""
    (folder / "report.html").write_text(page)
    return insight
