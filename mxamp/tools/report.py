"""Reports of what conversion did: tables for the terminal, a JSON file for
machines, Markdown and self-contained HTML pages for people.

A model's page shows its converted graph (laid out by :mod:`.layout`, with
node names, arrows, pan, zoom and find), why each operator runs in its
precision (a sortable, filterable table), the relative error of each layer's
output against float32 and the share of operators and FLOPs per precision
(charts from :mod:`.plots`). A zoo batch gets an index page (results, error
and precision charts) linking one such page per converted model.
"""
import collections
import html
import json
import logging
import os

import mxnet as mx

from ..graph import CAST_OPS, graph_json
from . import checkpoint, html_assets, inspection, plots
from .layout import MAX_LAYERED, layered, wrapped
from .plots import PRECISION_COLOURS

log = logging.getLogger(__name__)

KIND_COLOURS = {"cast": "#e5e5e5", "input": "#ffffff", "other": "#c7e9c0"}
CATEGORY_COLOURS = {"low precision": "#deebf7", "float32": "#fdd0a2",
                    "conditional float32": "#fdae6b", "widest": "#efedf5",
                    "neutral": "#f7f7f7", "follow": "#e5f5e0"}
# A longer name loses its middle in its box: its tail is what tells
# neighbouring nodes apart (the tooltip and find have all of it).
LABEL_CHARS = 34
CHAR_PX, BADGE_PX = 6.6, 24  # width of a label character; of the folded-casts badge
WRAP_PX = 1150  # a deep graph wraps into the columns that fit this wide: a 1400 px window's view


def size(n_bytes):
    """'1.50 MiB', '12.0 KiB' or '80 B'."""
    if n_bytes >= 2**20:
        return f"{n_bytes / 2**20:.2f} MiB"
    return f"{n_bytes / 2**10:.1f} KiB" if n_bytes >= 2**10 else f"{n_bytes} B"


def counts_text(counts):
    """'bfloat16 53, float32 3' for {'bfloat16': 53, 'float32': 3}."""
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _fmt(value):
    return "-" if value is None else f"{value:.2e}" if isinstance(value, float) else str(value)


def error_label(result):
    """Which figure a result's max error is: detectors' is measured on the
    tensors fed into NMS (NMS's selection is discrete)."""
    return "before NMS" if result.get("pre_nms") else "outputs"


ZOO_HEADERS = ("model", "dtype", "weights", "status", "max error", "low ops", "float32 ops",
               "casts", "verified", "params", "convert s")


def zoo_rows(results):
    """Table rows, one per (model, dtype) result."""
    rows = []
    for r in results:
        ops = r.get("ops_by_precision", {})
        status = "ok" if r["status"] == "ok" else f"failed in {r['failed_in']}"
        error = _fmt(r.get("max_error"))
        if r.get("pre_nms"):
            error += " before NMS"
        params = r.get("param_bytes")
        rows.append((r["model"], r["dtype"], r["weights"].split(" (")[0], status, error,
                     _fmt(ops.get(r["dtype"], 0) if ops else None),
                     _fmt(ops.get("float32", 0) if ops else None),
                     _fmt(sum(r["casts"].values()) if "casts" in r else None),
                     _fmt(r.get("verified")),
                     f"{size(params['float32'])} -> {size(params['converted'])}" if params else "-",
                     "-" if r.get("convert_seconds") is None else f"{r['convert_seconds']:.2f}"))
    return rows


OPERATOR_HEADERS = ("node", "op", "precision", "reason", "input from")


def operator_rows(summary):
    return [(r["name"], r["op"], r["precision"], r["reason"], r.get("input_from") or "")
            for r in summary["operators"]]


def text_table(headers, rows):
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
             for line in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(str(c).replace("|", "\\|") for c in line) + " |"
             for line in [headers, *rows]]
    lines.insert(1, "|" + "---|" * len(headers))
    return "\n".join(lines)


class Cell:
    """An HTML table cell with more than text: markup, a number to sort
    by, a background colour."""

    def __init__(self, text, markup=None, number=None, colour=None):
        self.text, self.markup, self.number, self.colour = text, markup, number, colour

    def html(self):
        attrs = ""
        if self.number is not None:
            attrs += f' data-v="{self.number!r}" class="num"'
        if self.colour:
            attrs += f' style="background:{self.colour}"'
        return f"<td{attrs}>{self.markup or html.escape(str(self.text), quote=False)}</td>"


def _cell(value):
    if isinstance(value, Cell):
        return value.html()
    return f"<td>{html.escape(str(value), quote=False)}</td>"


def html_table(headers, rows, sortable=False, filter_hint=None):
    """A table (no heading row when `headers` is None); `sortable` ones sort
    by a click on a heading and get a filter box above (`filter_hint` its
    placeholder)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in headers or ())
    head = f"<thead><tr>{head}</tr></thead>" if head else ""
    body = "".join("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    table = (f"<table{' class=sortable' if sortable else ''}>{head}"
             f"<tbody>{body}</tbody></table>")
    if not sortable:
        return table
    return (f"<input class='filter' placeholder='{html.escape(filter_hint or 'filter rows')}'>"
            + table)


def _node_link(name):
    """A node's name that jumps to it in the graph; it may wrap after '_'."""
    shown = html.escape(name).replace("_", "_<wbr>")
    return Cell(name, f"<a href='#graph' class='node-link' data-node='{html.escape(name)}'>"
                      f"{shown}</a>")


def operator_cells(summary):
    """The HTML rows of a model's operator table: names link to the graph,
    precision and category coloured, numbers sortable."""
    measured = "flops" in (summary["operators"] or [{}])[0]
    rows = []
    for k, r in enumerate(summary["operators"]):
        row = [Cell(k, number=k), _node_link(r["name"]), r["op"],
               Cell(r["precision"], colour=PRECISION_COLOURS.get(r["precision"])),
               Cell(r["category"], colour=CATEGORY_COLOURS.get(r["category"])), r["reason"],
               _node_link(r["input_from"]) if r.get("input_from") else ""]
        if measured:
            error = r["error"]
            row += [Cell(f"{r['flops']:,}", number=r["flops"]),
                    Cell(_fmt(error), number=-1.0 if error is None else error)]
        rows.append(row)
    headers = ["#", "node", "op", "precision", "category", "reason", "input from"]
    return headers + (["FLOPs", "error vs float32"] if measured else []), rows


def parameter_casts(graph, hidden):
    """Ids of the cast nodes that cast only parameters (`hidden`), directly
    or through other such casts: the picture folds them into their readers."""
    nodes, found = graph["nodes"], set()
    for nid, node in enumerate(nodes):
        if node["op"] in CAST_OPS and all(
                e[0] in found or (nodes[e[0]]["op"] == "null" and nodes[e[0]]["name"] in hidden)
                for e in node["inputs"]):
            found.add(nid)
    return found


class _Box(collections.namedtuple("_Box", "name second colour casts")):
    def shown_name(self, prefix):
        """The name in the box: a cast's without its '_amp_cast_<dtype>'."""
        op, _, dtype = self.second.partition(" to ")
        return shown_name(self.name, prefix, f"_{op}_{dtype}" if op in CAST_OPS else "")


def _graph_nodes(graph, precisions, hidden, fold):
    """(nodes, edges) of a converted graph for drawing: nodes as {id: _Box};
    parameters (`hidden`) left out, and with `fold` their casts too, each
    named in its reader's `casts`."""
    folded = parameter_casts(graph, hidden) if fold else set()
    nodes, edges = {}, []
    for nid, node in enumerate(graph["nodes"]):
        name, op = node["name"], node["op"]
        if nid in folded or (op == "null" and name in hidden):
            continue
        casts = [graph["nodes"][e[0]]["name"] for e in node["inputs"] if e[0] in folded]
        if op == "null":
            nodes[nid] = _Box(name, "input", KIND_COLOURS["input"], casts)
        elif op in CAST_OPS:
            dtype = node.get("attrs", {}).get("dtype", "")
            nodes[nid] = _Box(name, f"{op} to {dtype}".strip(), KIND_COLOURS["cast"], casts)
        else:
            precision = precisions.get(name, "unknown")
            nodes[nid] = _Box(name, f"{op} \u00b7 {precision}",
                              PRECISION_COLOURS.get(precision, KIND_COLOURS["other"]), casts)
        edges.extend((e[0], nid) for e in node["inputs"] if e[0] in nodes)
    return nodes, edges


def shared_prefix(names):
    """The longest prefix ending in '_' that at least half of `names` start
    with ('' if none), such as Gluon's block prefix: said once above the
    picture rather than in every box."""
    counts = collections.Counter(n[:i + 1] for n in names for i, c in enumerate(n[:-1])
                                 if c == "_")
    return max((p for p, c in counts.items() if 2 * c >= len(names)), key=len, default="")


def shown_name(name, prefix="", suffix=""):
    """A node's name as its box shows it: without `prefix` and `suffix` (a
    cast's, which its second line says), and at most LABEL_CHARS long by
    cutting its middle (the end tells nodes apart)."""
    if prefix and name.startswith(prefix):
        name = name[len(prefix):]
    if suffix and name.endswith(suffix) and len(name) > len(suffix):
        name = name[:-len(suffix)]
    if len(name) <= LABEL_CHARS:
        return name
    head = (LABEL_CHARS - 1) // 3
    return name[:head] + "\u2026" + name[head + 1 - LABEL_CHARS:]


def _box_size(box, prefix):
    chars = max(len(box.shown_name(prefix)), len(box.second))
    return CHAR_PX * chars + 14 + (BADGE_PX if box.casts else 0), 32


def _path(points, curved):
    (x0, y0), rest = points[0], points[1:]
    if curved and len(rest) % 3 == 0:  # dot's cubic Bezier control points
        return f"M{x0:.1f},{y0:.1f}C" + " ".join(f"{x:.1f},{y:.1f}" for x, y in rest)
    return f"M{x0:.1f},{y0:.1f}" + "".join(f"L{x:.1f},{y:.1f}" for x, y in rest)


def _node_svg(box, x, y, w, h, prefix):
    title = f"{box.name}: {box.second}"
    if box.casts:
        title += "\nparameter casts folded in: " + ", ".join(box.casts)
    parts = [f'<g class="node" data-name="{html.escape(box.name)}" data-x="{x:.0f}" '
             f'data-y="{y:.0f}"><title>{html.escape(title)}</title>'
             f'<rect x="{x - w / 2:.1f}" y="{y - h / 2:.1f}" width="{w:.0f}" height="{h}" '
             f'rx="4" fill="{box.colour}" stroke="#555"/>']
    if box.casts:  # a grey badge at the right end: how many parameter casts
        right = x + w / 2
        parts.append(f'<rect class="badge" x="{right - BADGE_PX + 2:.1f}" y="{y - 8:.1f}" '
                     f'width="{BADGE_PX - 6}" height="16" rx="8" fill="{KIND_COLOURS["cast"]}" '
                     f'stroke="#777"/><text x="{right - BADGE_PX / 2 - 1:.1f}" y="{y + 4:.1f}" '
                     f'text-anchor="middle" font-size="10">+{len(box.casts)}</text>')
        x -= BADGE_PX / 2  # the name and op centred in the rest
    parts.append(f'<text class="label" x="{x:.1f}" y="{y - 3:.1f}" text-anchor="middle">'
                 f'{html.escape(box.shown_name(prefix))}</text>'
                 f'<text x="{x:.1f}" y="{y + 11:.1f}" text-anchor="middle" font-size="10" '
                 f'fill="#444">{html.escape(box.second)}</text></g>')
    return "".join(parts)


def graph_svg(graph, precisions, hidden, fold=True, prefix="", key="graph", visible=True):
    """An SVG of a converted graph laid out in layers (Graphviz's dot when
    installed, else mxamp's own layout; see layout.wrapped): one box per node with its name
    (`prefix` left out) and its op and precision, coloured by precision,
    arrows from inputs to readers; with `fold`, the casts of parameters are
    not drawn but counted on a badge of their reader. Each node is a
    ``g.node`` with ``data-name`` for the page's find; the drawing is in
    ``g#<key>`` (the overview shows it); not `visible` until the page's
    script shows it."""
    nodes, edges = _graph_nodes(graph, precisions, hidden, fold)
    sizes = {nid: _box_size(box, prefix) for nid, box in nodes.items()}
    placed = wrapped(sizes, edges, WRAP_PX)
    style = "" if visible else 'style="display:none" '
    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" data-content="{key}" '
              f'{style}data-width="{placed.width:.0f}" data-height="{placed.height:.0f}" '
              f'data-layout="{placed.engine}" '
              f'viewBox="0 0 {placed.width:.0f} {placed.height:.0f}" font-size="11">'),
             (f'<defs><marker id="{key}-arrow" viewBox="0 0 10 10" refX="10" refY="5" '
              'markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0L10,5L0,10z" '
              f'fill="#666"/></marker></defs><g id="{key}"><g fill="none" stroke="#888" '
              'stroke-width="1.2">')]
    parts += [f'<path d="{_path(points, curved)}" marker-end="url(#{key}-arrow)"/>'
              for _, _, points, curved in placed.edges]
    parts.append("</g>")
    for a, b, out, into in placed.continued:  # dashed: on in the next column
        title = html.escape(f"{nodes[a].name} \u2192 {nodes[b].name}")
        parts.append(f'<g class="continued" fill="none" stroke="#888" stroke-width="1.2" '
                     f'stroke-dasharray="4 3"><title>{title}</title>'
                     f'<path d="{_path(out, False)}"/>'
                     f'<path d="{_path(into, False)}" marker-end="url(#{key}-arrow)"/></g>')
    parts += [_node_svg(box, *placed.centres[nid], *sizes[nid], prefix)
              for nid, box in nodes.items()]
    parts.append("</g></svg>")
    return "".join(parts)


def _legend(precisions_seen, badge):
    items = [(PRECISION_COLOURS.get(p, KIND_COLOURS["other"]), p) for p in precisions_seen]
    items += [(KIND_COLOURS["cast"], "amp_cast / amp_multicast"),
              (KIND_COLOURS["input"], "data input")]
    return "<div class='legend'>" + "".join(
        f"<span><i style='background:{c}'></i>{html.escape(t)}</span>" for c, t in items) \
        + ("<span><b class='badge'>+n</b>n parameter casts folded into their reader</span>"
           if badge else "") + "</div>"


def _listed_note(graph, precisions, hidden):
    """Says so when the picture lists the graph instead of laying it out."""
    nodes, edges = _graph_nodes(graph, precisions, hidden, True)
    if layered(dict.fromkeys(nodes, (0, 0)), edges):
        return ""
    return (f"<p class='note'>This graph has {len(nodes):,} nodes to draw: they are listed one "
            f"per row in the graph's order, an arrow bowing out to the right for each input "
            f"from further up. The layered picture is drawn up to {MAX_LAYERED:,} nodes; past "
            f"that it takes minutes to make and is slow to open.</p>")


def graph_view(graph, precisions, hidden):
    """The graph picture with its legend, an overview of the whole graph
    (click or drag in it to move the view) and pan / zoom / find tools;
    parameter casts folded into their readers, with a box to show them."""
    names = [n["name"] for n in graph["nodes"] if not (n["op"] == "null" and n["name"] in hidden)]
    prefix = shared_prefix(names)
    casts = len(parameter_casts(graph, hidden))
    svgs = graph_svg(graph, precisions, hidden, fold=True, prefix=prefix, key="graph-folded")
    if casts:
        svgs += graph_svg(graph, precisions, hidden, fold=False, prefix=prefix,
                          key="graph-full", visible=False)
    tools = ("<div class='tools'><button class='zoom-in' title='zoom in'>+</button>"
             "<button class='zoom-out' title='zoom out'>\u2212</button>"
             "<button class='actual'>1:1</button><button class='fit-width'>fit width</button>"
             "<button class='fit'>whole graph</button> "
             "<input class='find' placeholder='find a node by name (Enter: next)' size='30'> "
             "<span class='found'></span> "
             + (f"<label><input type='checkbox' class='show-casts'>show the {casts} parameter "
                "casts</label> " if casts else "")
             + "<span class='note'>drag to pan, wheel to zoom</span></div>")
    note = (f"<p class='note'>Names in the boxes leave out their shared prefix "
            f"<code>{html.escape(prefix)}</code>; a box's tooltip and the find box have the "
            f"whole name.</p>" if prefix else "") + _listed_note(graph, precisions, hidden)
    overview = ("<div class='overview' title='the whole graph: click or drag to move the view'>"
                "<svg xmlns='http://www.w3.org/2000/svg' preserveAspectRatio='xMidYMin meet'>"
                "<use href='#graph-folded'/>"
                "<rect class='frame'/></svg></div>")
    return (_legend(sorted(set(precisions.values())), casts) + note
            + "<div class='graphview' id='graph'>" + tools + "<div class='panes'>" + svgs
            + overview + "</div></div>")


def write_text(path, text):
    """Writes under a temporary name, then renames: no half-written file,
    and no temporary file left when writing fails."""
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path}: it is a directory (give a file name)")
    temp = f"{path}.tmp{os.getpid()}"
    try:
        with open(temp, "w") as f:
            f.write(text)
        os.replace(temp, path)
    except BaseException:
        if os.path.lexists(temp):
            os.remove(temp)
        raise


def _page(title, sections, back=None):
    """A complete HTML page: (heading, HTML) sections, the style and script inline."""
    body = "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    link = f"<p><a href='{html.escape(back[0])}'>{html.escape(back[1])}</a></p>" if back else ""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{html_assets.STYLE}</style><script>{html_assets.SCRIPT}</script>"
            f"</head><body>{link}<h1>{html.escape(title)}</h1>{body}</body></html>\n")


def _by_precision(summary, key):
    totals = collections.Counter()
    for r in summary["operators"]:
        totals[r["precision"]] += r.get(key, 1) if key else 1
    return dict(sorted(totals.items()))


def _facts(summary, extra=()):
    facts = [*extra, ("target dtype", summary["dtype"]),
             ("operators by precision", counts_text(summary["ops_by_precision"])),
             ("casts", counts_text(summary["casts"])),
             ("parameters (float32 -> converted)",
              (f"{size(summary['param_bytes']['float32'])} -> "
               f"{size(summary['param_bytes']['converted'])}"))]
    if summary["operators"] and "flops" in summary["operators"][0]:
        flops = _by_precision(summary, "flops")
        total = max(sum(flops.values()), 1)
        facts.append(("FLOPs by precision", ", ".join(
            f"{p} {v / 1e9:.3g} G ({100 * v / total:.1f}%)" for p, v in flops.items())))
    return facts


def model_sections(title, summary, graph, hidden, extra_facts=()):
    """The sections of one model's page: facts, graph, per-layer error, and
    the table of operators with the reason for each one's precision."""
    precisions = {r["name"]: r["precision"] for r in summary["operators"]}
    sections = [("Summary", html_table(None, _facts(summary, extra_facts))),
                ("Graph", graph_view(graph, precisions, hidden))]
    measured = [(k, r) for k, r in enumerate(summary["operators"]) if r.get("error") is not None]
    if measured:
        chart = plots.layer_error_chart([k for k, _ in measured], [r["error"] for _, r in measured],
                                        [r["precision"] for _, r in measured],
                                        f"{title}: error of each layer's output")
        sections.append(("Error per layer", "<p class='note'>Relative L2 error of each "
                         "operator's output against float32 on one random input, layers "
                         "in graph order (below 1e-6 drawn at 1e-6).</p><div class='plot'>"
                         + chart + "</div>"))
    headers, rows = operator_cells(summary)
    sections.append(("Why each operator runs in its precision",
                     html_table(headers, rows, sortable=True,
                                filter_hint="filter, e.g. float32 or Pooling neutral")))
    return sections


def write_inspect_report(directory, title, summary, graph, hidden):
    """inspect.json, inspect.md and inspect.html in `directory`."""
    write_text(os.path.join(directory, "inspect.json"),
               json.dumps(summary, indent=1, sort_keys=True))
    write_text(os.path.join(directory, "inspect.md"), "\n".join(
        [f"# mxamp inspect: {title}", "", markdown_table(("", ""), _facts(summary)), "",
         markdown_table(OPERATOR_HEADERS, operator_rows(summary))]) + "\n")
    write_text(os.path.join(directory, "inspect.html"), _page(
        f"mxamp inspect: {title}", model_sections(title, summary, graph, hidden)))


def page_name(result):
    return f"{result['model']}-{result['dtype']}.html"


def _zoo_page(directory, result):
    """Writes one converted zoo model's page; returns its summary."""
    prefix = os.path.join(directory, f"{result['model']}-{result['dtype']}")
    model = checkpoint.load_checkpoint(prefix, 0)
    params = set(model[1]) | set(model[2])
    data = [n for n in model[0].list_inputs() if n not in params]
    summary, _ = inspection.inspect_model(
        *model, ctx=None if result["ctx"] == "any" else mx.cpu(),
        data_shapes={data[0]: tuple(result["input_shape"])})
    title = f"{result['model']} {result['dtype']}"
    facts = [("max error vs float32", f"{_fmt(result.get('max_error'))} ({error_label(result)})"),
             ("verified", result.get("verified", "-")),
             ("weights", result["weights"])]
    graph = graph_json(model[0])
    write_text(os.path.join(directory, page_name(result)), _page(
        f"mxamp zoo: {title}", model_sections(title, summary, graph, params, facts),
        back=("report.html", "\u2190 all models")))
    return summary


def write_zoo_report(directory, results, meta):
    """report.json, report.md and report.html in `directory`, and a page per
    converted model (read from its checkpoint there) linked from report.html."""
    failed = [r for r in results if r["status"] != "ok"]
    write_text(os.path.join(directory, "report.json"),
               json.dumps({**meta, "results": results}, indent=1, sort_keys=True))
    summaries = {}
    for r in results:
        if r.get("files"):
            try:
                summaries[page_name(r)] = _zoo_page(directory, r)
            except Exception as err:  # noqa: BLE001 - one page's failure leaves the rest
                log.warning("no page for %s %s: %s", r["model"], r["dtype"], err)
    rows = zoo_rows(results)
    notes = [(f"{meta['converted']} converted, {meta['failed']} failed, "
              f"{meta['float32_failed']} whose float32 network does not build or run here."),
             f"CPU: {meta.get('cpu', 'not recorded')}.",
             ("max error: relative L2 error against float32 on a random input; for detectors "
              "(marked 'before NMS') the error of the tensors fed into NMS, whose selection is "
              "discrete. verified: native (this CPU's kernels) or emulated (low-precision ops "
              "computed in float32 and rounded, where this CPU has no kernel for them).")]
    # conversion failures first, then networks whose float32 build or run fails
    failed.sort(key=lambda r: r.get("failed_in") == "float32")
    failures = [(f"{r['model']} ({r['dtype']}, {r['failed_in']})", r["error"]) for r in failed]
    md = [f"# mxamp zoo: {meta['dtype']}", "", *notes, "", markdown_table(ZOO_HEADERS, rows)]
    links = [Cell(page_name(r), f"<a href='{html.escape(page_name(r))}'>graph, reasons</a>")
             if page_name(r) in summaries else "-" for r in results]
    sections = [("Results", "".join(f"<p class='note'>{html.escape(n)}</p>" for n in notes)
                 + html_table((*ZOO_HEADERS, "page"),
                              [(*row, link) for row, link in zip(rows, links)], sortable=True,
                              filter_hint="filter, e.g. bfloat16 or failed"))]
    measured = [(r["model"] + (" (before NMS)" if r.get("pre_nms") else ""), r["dtype"],
                 r.get("max_error")) for r in results]
    if any(e is not None for _, _, e in measured):
        sections.append(("Error per model and dtype", "<div class='plot'>"
                         + plots.error_chart(measured) + "</div>"))
    if summaries:
        shares = [(f"{r['model']} {r['dtype']}", _by_precision(s, None),
                   _by_precision(s, "flops")) for r in results
                  for s in [summaries.get(page_name(r))] if s]
        sections.append(("Share of operators and FLOPs in each precision",
                         "<div class='plot'>" + plots.share_chart(shares) + "</div>"))
    if failures:
        md += ["", "## Failures", "", markdown_table(("model", "error"), failures)]
        sections.append(("Failures", html_table(("model", "error"), failures)))
    write_text(os.path.join(directory, "report.md"), "\n".join(md) + "\n")
    write_text(os.path.join(directory, "report.html"),
               _page(f"mxamp zoo: {meta['dtype']}", sections))


def _int8_reason(row):
    if row["precision"] == "int8":
        return "INT8 region"
    return "excluded" if row["excluded"] else "not run in INT8 by the backend"


def int8_report_files(directory, name="int8"):
    """The paths :func:`write_int8_report` writes: NAME.json, NAME.html."""
    return [os.path.join(directory, f"{name}.{ext}") for ext in ("json", "html")]


def _int8_charts(title, rows):
    """The INT8 page's charts of the layers `rows`: calibration ranges and
    error per layer; past inspection.MAX_INT8_LAYER_ERRORS layers, a note
    saying they are left out."""
    if len(rows) > inspection.MAX_INT8_LAYER_ERRORS:
        return [("Per layer", f"<p class='note'>{len(rows):,} layers: past "
                 f"{inspection.MAX_INT8_LAYER_ERRORS:,}, the calibration ranges are in the "
                 "table below only, and each layer's error is not measured (the output "
                 "error above is).</p>")]
    sections = []
    calibrated = [(k, r) for k, r in enumerate(rows) if r["threshold"] is not None]
    if calibrated:
        sections.append(("Calibration ranges", "<div class='plot'>" + plots.range_chart(
            [k for k, _ in calibrated], [r["min"] for _, r in calibrated],
            [r["threshold"] for _, r in calibrated]) + "</div>"))
    sections.append((
        "Error per layer", "<p class='note'>Each layer's output taken out of the INT8 chain "
        "and compared with float32 on one random input (a layer output made a graph output "
        "can stop a fusion there: these approximate the quantized model's own values; the "
        "summary's output error is the quantized model's).</p><div class='plot'>"
        + plots.layer_error_chart(list(range(len(rows))), [r["error"] for r in rows],
                                  [r["precision"] for r in rows],
                                  f"{title}: error of each layer's output") + "</div>"))
    return sections


def write_int8_report(directory, title, reference, quantized, data_shapes, name="int8"):
    """NAME.json and NAME.html in `directory`: what INT8 quantization did to
    the float32 model `reference` (sym, arg_params, aux_params), given the
    `quantized` model mxamp.quantization made of it, measured on a random
    input of `data_shapes` ({data input: shape}): the graph coloured by
    where INT8 runs, each layer's calibrated range and output error."""
    summary = inspection.int8_summary(reference, quantized, data_shapes)
    rows = summary["operators"]
    json_path, html_path = int8_report_files(directory, name)
    write_text(json_path, json.dumps(summary, indent=1, sort_keys=True))
    counts = collections.Counter(r["precision"] for r in rows)
    facts = [("output error vs float32", ", ".join(_fmt(e) for e in summary["output_errors"])),
             ("operators by precision", counts_text(dict(sorted(counts.items())))),
             ("data input ranges (min, threshold)", ", ".join(
                 f"{n} {_fmt(lo)} .. {_fmt(hi)}" for n, (lo, hi) in
                 summary["input_ranges"].items()) or "none")]
    table = [[Cell(k, number=k), _node_link(r["name"]), r["op"],
              Cell(r["precision"], colour=PRECISION_COLOURS.get(r["precision"])),
              _int8_reason(r),
              Cell(_fmt(r["min"]), number=r["min"] if r["min"] is not None else 0.0),
              Cell(_fmt(r["threshold"]), number=r["threshold"] or 0.0),
              Cell(_fmt(r["error"]), number=r["error"])] for k, r in enumerate(rows)]
    graph = graph_json(reference[0])
    params = set(reference[1]) | set(reference[2])
    sections = [("Summary", html_table(None, facts)),
                ("Graph", graph_view(graph, {r["name"]: r["precision"] for r in rows}, params))]
    sections += _int8_charts(title, rows)
    sections.append(("Layers", html_table(("#", "node", "op", "precision", "why", "min",
                                           "threshold", "error vs float32"), table,
                                          sortable=True,
                                          filter_hint="filter, e.g. float32 or Convolution")))
    write_text(html_path, _page(f"mxamp INT8: {title}", sections))
