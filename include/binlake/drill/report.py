"""The drills report: one self-contained HTML page (no external asset, no script)
an on-call engineer or an auditor opens: the last drill, plots of RPO and RTO over
time (inline SVG, one ``circle`` per drill, failed drills in red, the objective as
a dashed line), and the verdict history with each proof's outcome.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Mapping, Sequence
from typing import Any

_W, _H, _PAD = 640, 220, 40


def _plot(title: str, metric: str, drills: Sequence[Mapping[str, Any]], objective_key: str) -> str:
    points = [(d["started_at"], float(d[metric])) for d in drills if d.get(metric) is not None and d.get("started_at")]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" id="plot-{metric}" width="{_W}" height="{_H}" '
             f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{html.escape(title)}">',
             f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="#fafafa" stroke="#ccc"/>',
             f'<text x="{_PAD}" y="18" font-size="13" font-family="sans-serif">{html.escape(title)}</text>']
    if not points:
        parts.append(f'<text x="{_PAD}" y="{_H // 2}" font-size="12" font-family="sans-serif">no drill yet</text>')
        return "".join(parts) + "</svg>"
    objectives = [float(d[objective_key]) for d in drills if d.get(objective_key) is not None]
    top = max([v for _t, v in points] + objectives[-1:] + [1e-9]) * 1.1
    t0 = min(t for t, _v in points).timestamp()
    t1 = max(t for t, _v in points).timestamp()
    span = max(t1 - t0, 1.0)

    def x(t: dt.datetime) -> float:
        return _PAD + (t.timestamp() - t0) / span * (_W - 2 * _PAD) if len(points) > 1 else _W / 2

    def y(v: float) -> float:
        return _H - _PAD - v / top * (_H - 2 * _PAD)

    parts.append(f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#888"/>')
    parts.append(f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#888"/>')
    parts.append(f'<text x="4" y="{_PAD + 4}" font-size="10" font-family="sans-serif">{top:.3g}s</text>')
    parts.append(f'<text x="4" y="{_H - _PAD}" font-size="10" font-family="sans-serif">0</text>')
    if objectives:
        yo = y(objectives[-1])
        parts.append(f'<line class="objective" x1="{_PAD}" y1="{yo:.1f}" x2="{_W - _PAD}" y2="{yo:.1f}" '
                     f'stroke="#d80" stroke-dasharray="6 4"/>')
    if len(points) > 1:
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#47a"/>')
    for d in drills:
        if d.get(metric) is None or not d.get("started_at"):
            continue
        t, v = d["started_at"], float(d[metric])
        color = "#c22" if d.get("verdict") == "failed" else "#283"
        parts.append(f'<circle class="point" cx="{x(t):.1f}" cy="{y(v):.1f}" r="4" fill="{color}" '
                     f'data-value="{v:.6g}" data-verdict="{html.escape(str(d.get("verdict")))}">'
                     f'<title>{html.escape(t.isoformat())}: {v:.3g}s</title></circle>')
    parts.append(f'<text x="{_PAD}" y="{_H - 8}" font-size="10" font-family="sans-serif">'
                 f'{html.escape(min(t for t, _ in points).isoformat(timespec="seconds"))}</text>')
    parts.append(f'<text x="{_W - _PAD}" y="{_H - 8}" font-size="10" text-anchor="end" font-family="sans-serif">'
                 f'{html.escape(max(t for t, _ in points).isoformat(timespec="seconds"))}</text>')
    return "".join(parts) + "</svg>"


def _cell(value: Any) -> str:
    if value is None:
        return "<td>-</td>"
    if isinstance(value, float):
        return f"<td>{value:.3g}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def render(drills: Sequence[Mapping[str, Any]], lake: str) -> str:
    """The page for ``drills`` (oldest first, rows of the ``drills`` table)."""
    last = drills[-1] if drills else None
    head = ("<p>No drill has run on this lake yet: <code>binlake drill --lake LAKE</code>.</p>" if last is None else
            f'<p class="last {html.escape(str(last["verdict"]))}">Last drill {html.escape(str(last["started_at"]))}: '
            f'<b>{html.escape(str(last["verdict"]).upper())}</b>'
            + (f" &mdash; {html.escape(str(last['failure']))}" if last.get("failure") else "")
            + f"; RTO {float(last['restore_s'] or 0):.3g}s, RPO "
            + ("-" if last.get("rpo_s") is None else f"{float(last['rpo_s']):.3g}s") + "</p>")
    rows = []
    for d in reversed(drills):
        cls = "failed" if d.get("verdict") == "failed" else "passed"
        rows.append(f'<tr class="{cls}">' + "".join(_cell(d.get(k)) for k in (
            "started_at", "verdict", "ts", "seed", "tables", "rows", "restore_s", "drill_s", "proving_share", "rpo_s",
            "proof_apply", "proof_paths", "proof_upstream", "failure")) + "</tr>")
    header = "".join(f"<th>{h}</th>" for h in (
        "started (UTC)", "verdict", "ts", "seed", "tables", "rows", "RTO s", "drill s", "proving share", "RPO s",
        "(a) apply targets", "(b) restore paths", "(c) upstream", "failure"))
    style = ("body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}tr.failed{background:#fdd}"
             "p.last.failed{color:#a00}p.last.passed{color:#060}svg{margin:0.5em 1em 0.5em 0}")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>binlake restore drills</title>"
            f"<style>{style}</style></head><body><h1>Restore drills</h1><p>Lake <code>{html.escape(lake)}</code>, "
            f"{len(drills)} drill(s).</p>{head}<h2>Over time</h2>"
            f"{_plot('RTO: seconds to restore', 'restore_s', drills, 'rto_objective_s')}"
            f"{_plot('RPO: seconds behind at the drill', 'rpo_s', drills, 'rpo_objective_s')}"
            f"<h2>Verdicts</h2><table id=\"verdicts\"><thead><tr>{header}</tr></thead><tbody>{''.join(rows)}"
            f"</tbody></table><p>Replay a drill: <code>binlake drill --seed SEED --until-ts UNTIL_TS</code> "
            f"(both in the drills table).</p></body></html>\n")


def write(path: str, drills: Sequence[Mapping[str, Any]], lake: str) -> None:
    """Write the page to ``path`` through a rename (a reader never sees half a page)."""
    import os

    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(render(drills, lake))
    os.replace(tmp, path)
