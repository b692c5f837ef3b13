"""The report page: sections as HTML, plots through plotly, one file with nothing to fetch.

plotly.js is inlined once in the page's head (``plotly.offline.get_plotlyjs``);
each figure is a div and a call of ``Plotly.newPlot`` (``plotly.io.to_html``
without the library).  The only scripts written here are the ranges table's
(sorting by a column, drawing the selected range's histogram) and the flame
graphs' (plotly icicles built from the embedded call tree, the selected
range's redrawn on a row's click).  Fonts are
the system's; no element has a ``src`` or ``href`` that leaves the file.
"""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Sequence
from typing import Any

from .._render import format_bytes, format_ns, plot_text, visible
from .._tallies import TALLIES
from .._version import __version__
from ._sections import (
    COUNTER_PLOTS,
    FLAME_NODES,
    FLAME_RANGE_NODES,
    FLAME_RANGES,
    HIST_ROWS,
    PROCESS_NAMES,
    SCOPE_LINES,
    TABLE_ROWS,
    Flame,
    Sections,
    Triggered,
)
from ._series import POINTS, Series

CONFIG = {"displaylogo": False, "responsive": True}
TEMPLATE = "plotly_white"

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
       sans-serif; margin: 0 auto; max-width: 1200px; padding: 1em 2em; color: #222; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd;
  padding-bottom: 0.2em; margin-top: 1.6em; } .muted { color: #666; }
table { border-collapse: collapse; font-size: 0.9em; margin: 0.5em 0; }
th, td { padding: 0.25em 0.6em; border-bottom: 1px solid #eee; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
table.ranges th { cursor: pointer; user-select: none; background: #f6f6f6; position: sticky;
  top: 0; } table.ranges th.sorted::after { content: " \\25BE"; }
table.ranges th.sorted.asc::after { content: " \\25B4"; }
table.ranges tbody tr { cursor: pointer; } table.ranges tbody tr:hover { background: #f3f7ff; }
table.ranges tbody tr.selected { background: #dde8ff; }
.scroll { max-height: 480px; overflow: auto; border: 1px solid #eee; }
.hint { border-left: 4px solid #999; padding: 0.4em 0.8em; margin: 0.6em 0; background: #fafafa; }
.hint.high { border-color: #d62728; } .hint.medium { border-color: #ff7f0e; }
.hint.low { border-color: #1f77b4; } .hint h3 { margin: 0.1em 0; font-size: 1.05em; }
.badge { font-size: 0.75em; text-transform: uppercase; padding: 0.1em 0.4em; border-radius: 3px;
  background: #eee; margin-right: 0.5em; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
pre { background: #f6f6f6; padding: 0.6em; overflow: auto; font-size: 0.85em; }
.facts { display: flex; flex-wrap: wrap; gap: 0.5em; }
.fact { border: 1px solid #e4e4e4; border-radius: 4px; padding: 0.3em 0.7em; min-width: 7em; }
.fact .v { font-size: 1.15em; font-weight: 600; } .fact .k { color: #666; font-size: 0.8em; }
.plot { height: 380px; } .plot.small { height: 260px; }
details > summary { cursor: pointer; margin: 0.6em 0; }
"""

# The flame graphs: plotly icicles (root at the bottom, width = samples) of
# the embedded trees; the whole program's drawn at once, the selected range's
# by show() below (window.mxprofFlame).
_FLAME_SCRIPT = """
(function () {
  var data = document.getElementById("flames");
  if (!data) return;
  var flames = JSON.parse(data.textContent);
  // A function keeps its color everywhere; waiting is blue, the rest warm.
  var WARM = ["#e6550d", "#fd8d3c", "#fdae6b", "#f16913", "#d94801", "#fdd0a2", "#f03b20",
    "#feb24c", "#fc4e2a", "#ec7014"];
  function icicle(f, root) {
    var ids = ["root"], labels = [root], parents = [""], values = [f.total], where = [""];
    var colors = ["#bbbbbb"];
    for (var i = 0; i < f.value.length; i++) {
      var fr = flames.frames[f.frame[i]];
      ids.push("n" + i); labels.push(fr[0]); values.push(f.value[i]);
      parents.push(f.parent[i] < 0 ? "root" : "n" + f.parent[i]);
      where.push(fr[1] + ":" + fr[2]);
      colors.push(fr[0] === "&lt;waiting&gt;" ? "#9ecae1" : WARM[f.frame[i] % WARM.length]);
    }
    return [{type: "icicle", ids: ids, labels: labels, parents: parents, values: values,
      customdata: where, marker: {colors: colors}, branchvalues: "total",
      tiling: {orientation: "v", flip: "y"},
      textinfo: "label", hovertemplate:
        "%{label}<br>%{customdata}<br>%{value} samples (%{percentRoot:.1%})<extra></extra>"}];
  }
  // A range's name becomes the root's label: plain text, as the frames are.
  function plain(text) {
    return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
  function draw(id, f, root) {
    var div = document.getElementById(id);
    Plotly.react(div, icicle(f, plain(root)), div.layout);
  }
  draw("flame-program", flames.program, "program");
  window.mxprofFlame = function (row, name) {
    var f = flames.ranges[row];
    var title = document.getElementById("flame-title");
    var div = document.getElementById("flame-range");
    if (!f) {
      title.textContent = name + ": no samples";
      Plotly.react(div, [], div.layout);
      return;
    }
    title.textContent = "Samples in " + name + " (" + f.total + ")";
    draw("flame-range", f, name);
  };
})();
"""

# Sorting the ranges table by a column (numbers by their data-v, text by
# itself) and drawing the clicked range's histogram from the embedded bins.
_SCRIPT = """
(function () {
  var table = document.getElementById("ranges");
  if (!table) return;
  var body = table.tBodies[0];
  var hist = JSON.parse(document.getElementById("histograms").textContent);
  function key(cell, numeric) {
    return numeric ? parseFloat(cell.getAttribute("data-v")) : cell.textContent;
  }
  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
    th.addEventListener("click", function () {
      var numeric = th.getAttribute("data-type") === "num";
      var asc = th.classList.contains("sorted") ? !th.classList.contains("asc") : !numeric;
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) {
        h.classList.remove("sorted", "asc");
      });
      th.classList.add("sorted"); if (asc) th.classList.add("asc");
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = key(a.cells[col], numeric), y = key(b.cells[col], numeric);
        if (x < y) return asc ? -1 : 1;
        if (x > y) return asc ? 1 : -1;
        return a.cells[0].textContent < b.cells[0].textContent ? -1 : 1;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
  function show(row) {
    Array.prototype.forEach.call(body.rows, function (r) { r.classList.remove("selected"); });
    row.classList.add("selected");
    var h = hist[row.getAttribute("data-row")];
    var title = document.getElementById("hist-title");
    var div = document.getElementById("histogram");
    if (!h) {
      title.textContent = row.cells[0].textContent + ": no histogram kept";
    } else {
      title.textContent = "Durations of " + row.cells[0].textContent + " (" +
        row.cells[2].textContent + " ranges)";
      var ys = h.counts.concat([h.counts[h.counts.length - 1]]);
      Plotly.react(div, [{x: h.edges, y: ys, type: "scatter", mode: "lines",
        line: {shape: "hv"}, fill: "tozeroy", name: "ranges",
        hovertemplate: "from %{x:.4s}s: %{y} ranges<extra></extra>"}], div.layout);
    }
    if (window.mxprofFlame) window.mxprofFlame(row.getAttribute("data-row"),
      row.cells[0].textContent);
  }
  body.addEventListener("click", function (ev) {
    var row = ev.target.closest("tr"); if (row) show(row);
  });
  if (body.rows.length) show(body.rows[0]);
})();
"""


def esc(value: object) -> str:
    """Text for HTML: escaped, quotes too, and invisible characters shown (``visible``)."""
    return html.escape(visible(str(value)), quote=True)


def script_json(value: object) -> str:
    """JSON safe inside a <script> element: no '<' can end it early."""
    return json.dumps(value, separators=(",", ":")).replace("<", "\\u003c")


def plot(
    div_id: str, data: list[dict[str, Any]], layout: dict[str, Any], small: bool = False
) -> str:
    """One plotly figure as a div and its drawing call (plotly.js comes once, in the head)."""
    # plotly is a core dependency, imported here rather than at the top so that
    # every other command of the CLI (which imports this package) starts without it.
    import plotly.io as pio

    base = {"template": TEMPLATE, "margin": {"l": 60, "r": 20, "t": 40, "b": 50}}
    figure = {"data": [_as_text(trace) for trace in data], "layout": _as_text({**base, **layout})}
    fragment: str = pio.to_html(
        figure,
        include_plotlyjs=False,
        full_html=False,
        div_id=div_id,
        config=CONFIG,
        default_height="260px" if small else "380px",
    )
    return fragment


# Figure keys whose strings plotly draws (its pseudo-HTML included): names
# from the trace go there, so they are made text (``plot_text``) first.
_DRAWN = frozenset({"name", "text", "labels", "hovertext", "x", "y"})


def _as_text(figure: Any, drawn: bool = False) -> Any:
    """figure (a trace or a layout) with every string plotly draws as a label
    made plain text; templates, types and ids are left alone."""
    if isinstance(figure, dict):
        return {k: _as_text(v, k in _DRAWN) for k, v in figure.items()}
    if isinstance(figure, list):
        return [_as_text(v, drawn) for v in figure]
    if isinstance(figure, str) and drawn:
        return plot_text(figure)
    return figure


def _seconds(values: Sequence[float]) -> list[float]:
    return [v / 1e9 for v in values]


def page(sections: Sections, hints: str, diff: str) -> str:
    """The whole document."""
    import plotly.offline  # a core dependency; imported when a page is drawn (see plot)

    parts = [
        _header(sections),
        _trigger(sections),
        hints,
        diff,
        _summary(sections),
        _ranges(sections),
        _flames(sections),
        _steps(sections),
        _counters(sections),
        _memory(sections),
        _processes(sections),
        _timeline(sections),
    ]
    title = "mxprof report: " + ", ".join(sections.paths)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{esc(title)}</title><style>{_STYLE}</style>"
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
        "</head><body>\n"
        + "\n".join(p for p in parts if p)
        + f"\n<script>{_FLAME_SCRIPT}{_SCRIPT}</script>\n</body></html>\n"
    )


def _header(s: Sections) -> str:
    files = "".join(f"<li><code>{esc(p)}</code></li>" for p in s.paths)
    cut = "".join(
        f'<p class="muted">{esc(p)} was cut short: these are the events before the cut.</p>'
        for p in s.truncated
    )
    version = f'<p class="muted">mxprof {esc(__version__)}; inputs:</p>'
    return f"<h1>mxprof report</h1>{version}<ul>{files}</ul>{cut}"


def _trigger(s: Sections) -> str:
    """What triggered each flight recorder snapshot among the inputs: at the
    top, since it is why the file exists."""
    out = []
    for t in s.triggers:
        g = t.trigger
        kind = "job-wide flight recorder snapshot" if g.job else "flight recorder snapshot"
        by = f" on <b>{esc(g.by)}</b>" if g.by else ""
        when = f"{t.at_ns / 1e9:.3f} s from the start of this page's time axis"
        if g.wall_ns is not None:
            stamp = datetime.datetime.fromtimestamp(g.wall_ns / 1e9, datetime.timezone.utc)
            when += f" ({stamp.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]} UTC)"
        step = f", in step {t.step}" if t.step is not None else ""
        window = []
        if g.window_seconds is not None:
            window.append(f"{g.window_seconds:g} s before the trigger")
        if g.after_seconds:
            window.append(f"{g.after_seconds:g} s after it")
        held = " and ".join(window) or "the recorded window"
        kept = g.kept_seconds
        if g.shortened_by_cap:
            cut = "<b>shortened</b> by the byte cap (<code>flight_recorder_bytes</code>)" + (
                f": {kept:.3g} s kept" if kept is not None else ""
            )
        else:
            cut = "not shortened"
        facts = [
            f"<p><b>Trigger:</b> <code>{esc(g.reason)}</code>{by}, at {esc(when)}{esc(step)}. "
            f"Window: {esc(held)}, {cut}.</p>"
        ]
        if g.suppressed:
            facts.append(
                f"<p>{g.suppressed} earlier trigger(s) were held back by the rate limit "
                "(<code>flight_recorder_interval</code>).</p>"
            )
        if g.job:
            if g.missing:
                items = "".join(f"<li>{esc(m)}</li>" for m in g.missing)
                facts.append(
                    f'<p><b>Missing processes:</b></p><ul id="trigger-missing">{items}</ul>'
                )
            else:
                facts.append("<p>Every process of the job is in the snapshot.</p>")
        for line in g.stuck:
            facts.append(f'<p class="hint high"><b>Stands out:</b> {esc(line)}.</p>')
        if g.ranks:
            rows = [
                (
                    r.process,
                    r.range or "(none open)",
                    format_ns(r.open_for_seconds * 1e9) if r.open_for_seconds is not None else "-",
                )
                for r in g.ranks
            ]
            facts.append(
                "<p>Where each process was at the trigger (its main thread's innermost open "
                "range):</p>" + _table(["process", "range", "open for"], rows, "trigger-ranks")
            )
        if g.details is not None:
            text = json.dumps(g.details, indent=1, default=str)
            facts.append(
                f"<details><summary>The trigger's details</summary><pre>{esc(text)}</pre></details>"
            )
        facts.append(f'<p class="muted">{esc(_marked_on(s, t))}</p>')
        out.append(
            f'<h2 id="sec-trigger">This is a {kind}</h2><div class="trigger" data-path="'
            f'{esc(t.path)}">{"".join(facts)}</div>'
        )
    return "\n".join(out)


def _marked_on(s: Sections, t: Triggered) -> str:
    """Where the page draws the trigger, in words."""
    plots = []
    if s.steps is not None and t.step is not None:
        plots.append(f"the step chart (step {t.step})")
    if s.counters:
        plots.append("the counter plots")
    if s.devices or s.scopes:
        plots.append("the memory plots")
    where = (
        "The trigger is a dashed red line on " + ", ".join(plots) + "."
        if plots
        else "No step chart or counter plot here to mark the trigger on."
    )
    return (
        where + " On the timeline (Perfetto), the ranges still open at the trigger end at "
        "the snapshot's end, marked cut short (args.cut_short)."
    )


def _marks(s: Sections, steps: bool = False) -> dict[str, Any]:
    """Layout keys that draw each trigger as a dashed vertical line: at its
    time (s from the page's start) or, on the step chart, at its step."""
    shapes, notes = [], []
    for t in s.triggers:
        x = t.step if steps else t.at_ns / 1e9
        if x is None:
            continue
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "line": {"color": "#d62728", "dash": "dash", "width": 2},
            }
        )
        notes.append(
            {
                "x": x,
                "xref": "x",
                "y": 1,
                "yref": "paper",
                "text": f"trigger: {t.trigger.reason}",
                "showarrow": False,
                "xanchor": "left",
                "font": {"color": "#d62728"},
            }
        )
    return {"shapes": shapes, "annotations": notes} if shapes else {}


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], cls: str = "") -> str:
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _summary(s: Sections) -> str:
    facts = [
        ("wall time", format_ns(s.wall_ns)),
        ("processes", s.counts["processes"]),
        ("threads", s.counts["threads"]),
        ("ranges", s.counts["ranges"]),
        ("instants", s.counts["instants"]),
        ("counter samples", s.counts["counter samples"]),
        ("range names", len(s.rows)),
    ]
    if s.counts["unpaired begins/ends"]:
        facts.append(("unpaired begins/ends (left out)", s.counts["unpaired begins/ends"]))
    if s.tallies:
        # A box per tally that is not zero; all zero (the usual case) is one box,
        # so that the first screen keeps room for what the run did.
        problems = [(k.replace("_", " "), s.tallies[k]) for k in TALLIES if s.tallies.get(k)]
        facts += problems or [("drops and misuse tallies: every one zero", 0)]
    else:
        facts.append(("drops and misuse tallies", s.tallies_missing))
    boxes = "".join(
        f'<div class="fact"><div class="v">{esc(v)}</div><div class="k">{esc(k)}</div></div>'
        for k, v in facts
    )
    out = ['<h2 id="sec-summary">Summary</h2>', f'<div class="facts" id="summary">{boxes}</div>']
    if s.tallies.get("dropped_events"):
        out.append(
            f"<p><b>{s.tallies['dropped_events']} events were dropped</b> at the event cap: "
            "raise <code>max_events</code> (0 = no limit) or write more often "
            "(<code>dump_events</code>).</p>"
        )
    if s.config:
        rows = [(k, "; ".join(f"{v}" for v in by_file.values())) for k, by_file in s.config.items()]
        # Folded: a recording's settings are some thirty rows, and would push the
        # ranges, samples and steps below the first screen.
        out.append(
            '<details id="config"><summary>Recorded by: the trace\'s <code>otherData</code> '
            f"({len(rows)} {'key' if len(rows) == 1 else 'keys'})</summary>"
            f"{_table(['key', 'value'], rows, 'config')}</details>"
        )
    else:
        out.append('<p class="muted">The trace does not say which configuration produced it.</p>')
    return "\n".join(out)


_COLUMNS = ("Name", "Category", "Count", "Total", "Self", "Avg", "P50", "P90", "P99", "% of wall")


def _ranges(s: Sections) -> str:
    head = ['<h2 id="sec-ranges">Ranges</h2>']
    if not s.rows:
        head.append("<p>The input holds no ranges (only counters, instants or metadata).</p>")
        return "\n".join(head)
    th = "".join(
        f'<th data-type="{"text" if i < 2 else "num"}"'
        f"{' class=' + chr(34) + 'sorted' + chr(34) if name == 'Total' else ''}>{name}</th>"
        for i, name in enumerate(_COLUMNS)
    )
    body = []
    for i, r in enumerate(s.rows):
        cells = [
            f'<td class="text">{esc(r.name)}</td>',
            f'<td class="text">{esc(r.category)}</td>',
            f'<td data-v="{r.count}">{r.count}</td>',
        ]
        for value in (r.total, r.self, r.avg, r.p50, r.p90, r.p99):
            v = value if value is not None else -1
            cells.append(f'<td data-v="{v}">{esc(format_ns(value))}</td>')
        share = 100 * r.total / s.row_walls[i] if s.row_walls[i] else 0.0
        cells.append(f'<td data-v="{share}">{share:.1f} %</td>')
        body.append(f'<tr data-row="{i}">{"".join(cells)}</tr>')
    hist = {
        str(i): {"edges": [e / 1e9 for e in h.edges], "counts": h.counts}
        for i, h in s.histograms.items()
    }
    note = ""
    if len(s.rows) >= TABLE_ROWS:
        note = f'<p class="muted">The {TABLE_ROWS} ranges with the largest total are listed.</p>'
    head += [
        "<p>Per range name; times are the ranges' own (self: less their direct children). "
        "Click a column to sort, a row to see its durations. Percentiles are exact "
        "(nearest rank) from the trace. % of wall: the total over the wall time of the "
        "processes that ran the name (each process's first event to its last), so a name "
        "every rank runs is measured against every rank's time; ranges of one name open "
        "at once on several threads, or nested in one another, add up beyond 100 %.</p>",
        note,
        f'<div class="scroll"><table class="ranges" id="ranges"><thead><tr>{th}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>",
        f'<h3 id="hist-title">Durations</h3><p class="muted">Histograms are kept for the '
        f"{HIST_ROWS} ranges with the largest total, in log-spaced bins over every range.</p>",
        plot(
            "histogram",
            [],
            {
                "xaxis": {"type": "log", "title": {"text": "duration (s)"}},
                "yaxis": {"title": {"text": "ranges"}},
            },  # fmt: skip
        ),
        f'<script type="application/json" id="histograms">{script_json(hist)}</script>',
    ]
    return "\n".join(head)


def _flame_json(f: Flame) -> dict[str, Any]:
    return {"total": f.total, "frame": f.frame, "parent": f.parent, "value": f.value}


def _flames(s: Sections) -> str:
    out = ['<h2 id="sec-samples">Samples</h2>']
    fl = s.flames
    if fl is None:
        out.append(
            '<p class="muted">No stack samples in the input (mxprof records them with '
            "<code>sample_rate</code>, on by default in <code>mxprof run</code>).</p>"
        )
        return "\n".join(out)
    cut = ""
    if fl.program.dropped:
        cut = f" The {FLAME_NODES} heaviest call paths are shown."
    out += [
        f"<p>Flame graphs of the {fl.program.total} stack samples: each box a function on "
        "the stack, its width its samples (inclusive), its callers below it. Click a box to "
        f"zoom into it, a row of the ranges table to see the samples taken in that range."
        f"{cut}</p>",
        '<h3 id="flame-program-title">The whole program</h3>',
        plot("flame-program", [], {"margin": {"l": 10, "r": 10, "t": 10, "b": 10}}),
        '<h3 id="flame-title">Samples in the selected range</h3>',
        f'<p class="muted">Ranges keep at most {FLAME_RANGE_NODES} call paths each; the '
        f"{FLAME_RANGES} ranges with the most samples have theirs. A sample counts in the "
        "range innermost on its thread when it was taken; the profiler's own ranges (its "
        "writer's flush) are not listed, and samples taken in them count in no range.</p>",
        plot("flame-range", [], {"margin": {"l": 10, "r": 10, "t": 10, "b": 10}}),
    ]
    data = {
        # Drawn by the page's script as icicle labels and hover text: plain text.
        "frames": [[plot_text(f[0]), plot_text(str(f[1])), *f[2:]] for f in fl.frames],
        "program": _flame_json(fl.program),
        "ranges": {str(i): _flame_json(f) for i, f in fl.ranges.items()},
    }
    out.append(f'<script type="application/json" id="flames">{script_json(data)}</script>')
    return "\n".join(out)


def _steps(s: Sections) -> str:
    st = s.steps
    if st is None:
        return (
            '<h2 id="sec-steps">Steps</h2><p class="muted">No steps: no frame and no '
            "<code>ProfilerStep#N</code> range in the input.</p>"
        )
    others = f" (one of {st.processes} processes with steps)" if st.processes > 1 else ""
    grouped = "" if st.group == 1 else f" Each bar is the mean of {st.group} consecutive steps."
    data: list[dict[str, Any]] = [
        {"type": "bar", "name": name, "x": st.index, "y": _seconds(ns)}
        for name, ns in st.parts.items()
    ]
    # torch's DataLoader: the wait before each step stacked on it, by the worker
    # whose batch it waited for; each worker's busy time as a line.
    data += [
        {"type": "bar", "name": name, "x": st.index, "y": _seconds(ns)}
        for name, ns in st.data_wait.items()
    ]
    data += [
        {"type": "scatter", "mode": "lines+markers", "line": {"dash": "dot"}, "name": name,
         "x": st.index, "y": _seconds(ns)}
        for name, ns in st.worker_busy.items()
    ]  # fmt: skip
    loading = (
        "<p>DataLoader: each bar also stacks the wait for the step's batch (before the "
        "step), by the worker that made it; dotted lines are each worker's time "
        "producing batches in the step's window.</p>"
        if st.data_wait or st.worker_busy
        else ""
    )
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "outlier steps",
            "x": [n for n, _ in st.outliers],
            "y": _seconds([d for _, d in st.outliers]),
            "marker": {"color": "#d62728", "size": 9, "symbol": "x"},
        }
    )
    outliers = ", ".join(f"{n} ({format_ns(d)})" for n, d in st.outliers[:10]) or "none"
    idle = st.in_no_range_ns + st.between_ns
    share = f" ({100 * idle / st.span_ns:.0f} %)" if st.span_ns else ""
    single = " One step: no median to compare it with, so no outliers." if st.count == 1 else ""
    return "\n".join(
        [
            '<h2 id="sec-steps">Steps</h2>',
            f"<p>{st.count} steps of <code>{esc(st.name)}</code> on {esc(st.thread)}{others}: "
            "median "
            f"{esc(format_ns(st.median_ns))}; outliers (longer than "
            f"{esc(format_ns(st.threshold_ns))}, the median plus the larger of 3 scaled "
            f"median absolute deviations and a fifth of the median): {esc(outliers)}."
            f"{single}{grouped}</p>",
            f"<p>In no range (on the steps' thread, no range open): "
            f"{esc(format_ns(st.in_no_range_ns))} inside the steps and "
            f"{esc(format_ns(st.between_ns))} between them, of {esc(format_ns(st.span_ns))} "
            f"from the first step's start to the last one's end{share}. Unrecorded work or "
            "waiting; the hints and the samples say which.</p>",
            loading,
            plot(
                "steps",
                data,
                {
                    "barmode": "stack",
                    "xaxis": {"title": {"text": "step"}},
                    "yaxis": {"title": {"text": "time (s)"}},
                    "title": {
                        "text": "Step time by top-level range, and in no range"
                        + (", and the data wait before it" if st.data_wait else "")
                    },
                    **_marks(s, steps=True),
                },
            ),
        ]
    )


def _line(series: Series, name: str | None = None) -> dict[str, Any]:
    """A counter's series as a step line; a series of one sample as a marker,
    since a line through one point draws nothing."""
    return {
        "type": "scatter",
        "mode": "lines" if len(series.times) > 1 else "markers",
        "line": {"shape": "hv"},
        "name": name or series.name,
        "x": _seconds(series.times),
        "y": series.values,
    }


def _counters(s: Sections) -> str:
    out = ['<h2 id="sec-counters">Counters</h2>']
    if not s.counters:
        out.append('<p class="muted">No counters in the input.</p>')
        return "\n".join(out)
    out.append(
        f"<p>Each counter over time (s from the start); long series are reduced to about "
        f"{POINTS} points keeping every interval's lowest and highest sample.</p>"
    )
    rows = [(c.name, c.category, c.process, c.samples, c.last, c.least, c.most) for c in s.counters]
    out.append(_table(["counter", "category", "process", "samples", "last", "min", "max"], rows))
    for k, c in enumerate(s.counters[:COUNTER_PLOTS]):
        out.append(
            plot(
                f"counter-{k}",
                [_line(c)],
                {
                    "title": {"text": f"{c.name} ({c.process})"},
                    "xaxis": {"title": {"text": "s"}},
                    **_marks(s),
                },
                small=True,
            )
        )
    if len(s.counters) > COUNTER_PLOTS:
        out.append(f'<p class="muted">The first {COUNTER_PLOTS} counters are plotted.</p>')
    return "\n".join(out)


def _memory(s: Sections) -> str:
    out = ['<h2 id="sec-memory">Memory</h2>']
    if not s.devices and not s.scopes:
        out.append(
            '<p class="muted">No memory counters in the input (mxprof records them with '
            "<code>profile_memory</code> and <code>mxprof.memory.record_alloc</code>).</p>"
        )
        return "\n".join(out)
    rows = [
        (p.device, p.process, format_bytes(p.peak), format_ns(p.at_ns), p.scope or "-",
         format_bytes(p.scope_bytes))
        for p in s.peaks
    ]  # fmt: skip
    out.append(
        _table(["device", "process", "peak", "at", "scope holding most then", "its bytes"], rows)
    )
    out.append(
        '<p class="muted">Sizes in binary units (1 MiB = 1,048,576 bytes), here and in the '
        "hints. A process with several devices names no scope as holding a peak: a scope's "
        "counter adds up its bytes on every device.</p>"
    )
    scopes = [(c.name, c.process, format_bytes(c.most), format_ns(c.peak_ts)) for c in s.scopes]
    if scopes:
        out.append(_table(["scope", "process", "peak", "at"], scopes))
    if s.devices:
        out.append(
            plot(
                "memory-devices",
                [_line(c, f"{c.name} ({c.process})") for c in s.devices],
                {
                    "title": {"text": "Memory in use by device"},
                    "yaxis": {"title": {"text": "bytes"}},
                    "xaxis": {"title": {"text": "s"}},
                    **_marks(s),
                },  # fmt: skip
            )
        )
    if s.scopes:
        out.append(
            plot(
                "memory-scopes",
                [_line(c, f"{c.name} ({c.process})") for c in s.scopes[:SCOPE_LINES]],
                {
                    "title": {"text": f"Memory in use by scope (the {SCOPE_LINES} largest peaks)"},
                    "yaxis": {"title": {"text": "bytes"}},
                    "xaxis": {"title": {"text": "s"}},
                    **_marks(s),
                },  # fmt: skip
            )
        )
    return "\n".join(out)


def _processes(s: Sections) -> str:
    if len(s.processes) < 2:
        return (
            '<h2 id="sec-processes">Processes and ranks</h2><p class="muted">One process '
            "in the input: nothing to compare across processes (give several files, or "
            "one merged file, to see them side by side).</p>"
        )
    rows = [
        (p.label, p.name or "-", p.path, p.threads, p.ranges, format_ns(p.wall_ns),
         sum(p.tallies.get(k, 0) for k in TALLIES) if p.tallies is not None else "-")
        for p in s.processes
    ]  # fmt: skip
    totals: dict[str, int] = {}
    for p in s.processes:
        for name, ns in p.totals.items():
            totals[name] = totals.get(name, 0) + ns
    names = sorted(totals, key=lambda n: (-totals[n], n))[:PROCESS_NAMES]
    data = [
        {"type": "bar", "name": p.label, "x": names, "y": [p.totals.get(n, 0) / 1e9 for n in names]}
        for p in s.processes
    ]
    return "\n".join(
        [
            '<h2 id="sec-processes">Processes and ranks</h2>',
            _table(
                ["process", "name in the file", "file", "threads", "ranges", "wall", "tallies"],
                rows,
            ),
            plot(
                "processes",
                data,
                {
                    "barmode": "group",
                    "title": {"text": "Total time of the largest ranges by process"},
                    "yaxis": {"title": {"text": "s"}},
                },  # fmt: skip
            ),
        ]
    )


def _timeline(s: Sections) -> str:
    files = " ".join(f"<code>{esc(p)}</code>" for p in s.paths)
    return (
        '<h2 id="sec-timeline">The timeline</h2>'
        f"<p>This page holds statistics, not events. To see every range on its thread, open "
        f"{files} in the Perfetto UI (ui.perfetto.dev, <i>Open trace file</i>; the trace stays "
        "in the browser) or chrome://tracing. JSON viewers give up at a few hundred MiB; the "
        "Perfetto protobuf form is smaller and loads far beyond that: "
        "<code>mxprof merge TRACE -o trace.pftrace</code> writes it, or record straight into "
        'it with <code>set_config(filename="trace.pftrace")</code>.</p>'
    )


def hints_html(hints: Sequence[Any], missing: Sequence[str] = ()) -> str:
    """The hints section: each hint's title, evidence and suggestion, then
    what the inputs lack for some rules (``hints.not_checked``)."""
    out = ['<h2 id="sec-hints">Hints</h2>']
    if not hints:
        out.append("<p>No hints: none of the rules found anything to point out.</p>")
    for h in hints:
        evidence = "".join(f"<li>{esc(line)}</li>" for line in h.evidence)
        out.append(
            f'<div class="hint {esc(h.severity)}" data-rule="{esc(h.rule)}">'
            f'<h3><span class="badge">{esc(h.severity)}</span>{esc(h.title)}</h3>'
            f"<ul>{evidence}</ul><p><b>Try:</b> {esc(h.suggestion)}</p></div>"
        )
    if missing:
        items = "".join(f"<li>{esc(m)}</li>" for m in missing)
        out.append(f'<div class="muted" id="not-checked">Not checked:<ul>{items}</ul></div>')
    return "\n".join(out)


def diff_html(result: Any, baseline: Sequence[str]) -> str:
    """The baseline comparison: the diff's table, its flagged regressions and one-sided names."""
    files = ", ".join(f"<code>{esc(p)}</code>" for p in baseline)
    out = [f'<h2 id="sec-diff">Compared with the baseline</h2><p>Baseline: {files}.</p>']
    regressions = list(result.regressions)
    if regressions:
        items = "".join(
            f"<li><code>{esc(r.name)}</code>: {esc(getattr(r, 'why', ''))}</li>"
            for r in regressions
        )
        out.append(f"<p><b>{len(regressions)} flagged regression(s):</b></p><ul>{items}</ul>")
    else:
        out.append("<p>No flagged regression.</p>")
    for label, names in (
        ("Only in the baseline", result.only_base),
        ("Only here", result.only_new),
    ):
        if names:
            shown = ", ".join(f"<code>{esc(n)}</code>" for n in names)
            out.append(f"<p>{label}: {shown}</p>")
    out.append(f"<pre>{esc(result.to_table())}</pre>")
    return "\n".join(out)
