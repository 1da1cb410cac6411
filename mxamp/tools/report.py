"""Reports of what conversion did: tables for the terminal, a JSON file for
machines, Markdown and a self-contained HTML page for people, and a picture of
a converted graph with its low-precision and float32 regions coloured.

The picture is an SVG laid out here (operators in rows by their depth from
the inputs), so it needs no Graphviz binary; its Graphviz DOT source is
written next to it for anyone who wants Graphviz's layout (``dot -Tsvg``).
"""
import html
import json
import os

from ..dtypes import LOW_DTYPES
from ..graph import CAST_OPS

COLOURS = {"low": "#9ecae1", "float32": "#fdae6b", "cast": "#d9d9d9", "input": "#ffffff",
           "other": "#c7e9c0"}
LEGEND = {"low": "low precision", "float32": "float32", "cast": "amp_cast / amp_multicast",
          "input": "data input", "other": "integer or unknown dtype"}


def size(n_bytes):
    """'1.50 MiB', '12.0 KiB' or '80 B'."""
    if n_bytes >= 2**20:
        return f"{n_bytes / 2**20:.2f} MiB"
    return f"{n_bytes / 2**10:.1f} KiB" if n_bytes >= 2**10 else f"{n_bytes} B"


def _fmt(value):
    return "-" if value is None else f"{value:.2e}" if isinstance(value, float) else str(value)


ZOO_HEADERS = ("model", "dtype", "weights", "status", "max error", "low ops", "float32 ops",
               "casts", "verified", "params", "seconds")


def zoo_rows(results):
    """Table rows, one per (model, dtype) result."""
    rows = []
    for r in results:
        ops = r.get("ops_by_precision", {})
        if r["status"] == "ok":
            status = "ok"
        else:
            status = f"failed in {r['failed_in']}"
        params = r.get("param_bytes")
        rows.append((r["model"], r["dtype"], r["weights"].split(" (")[0], status,
                     _fmt(r.get("max_error")), _fmt(ops.get(r["dtype"], 0) if ops else None),
                     _fmt(ops.get("float32", 0) if ops else None),
                     _fmt(sum(r["casts"].values()) if "casts" in r else None),
                     _fmt(r.get("verified")),
                     f"{size(params['float32'])} -> {size(params['converted'])}" if params else "-",
                     "-" if r.get("convert_seconds") is None else f"{r['convert_seconds']:.2f}"))
    return rows


OPERATOR_HEADERS = ("node", "op", "precision", "reason")


def operator_rows(summary):
    return [(r["name"], r["op"], r["precision"], r["reason"]) for r in summary["operators"]]


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


def html_table(headers, rows):
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _graph_parts(graph, precisions, hidden):
    """(nodes, edges) of a converted graph for drawing: nodes as
    (id, label, tooltip, colour kind); parameters (`hidden`) left out."""
    nodes, edges = [], []
    shown = set()
    for nid, node in enumerate(graph["nodes"]):
        if node["op"] == "null" and node["name"] in hidden:
            continue
        shown.add(nid)
        if node["op"] == "null":
            kind, label = "input", node["name"]
        elif node["op"] in CAST_OPS:
            dtype = node.get("attrs", {}).get("dtype", "")
            kind, label = "cast", f"{node['op']} {dtype}".strip()
        else:
            precision = precisions.get(node["name"])
            kind = "low" if precision in LOW_DTYPES else "float32" if precision == "float32" \
                else "other"
            label = node["op"]
        nodes.append((nid, label, f"{node['name']} ({precisions.get(node['name'], node['op'])})",
                      kind))
        edges.extend((e[0], nid) for e in node["inputs"] if e[0] in shown)
    return nodes, edges


def graph_dot(graph, precisions, hidden):
    """Graphviz DOT source of the converted graph, coloured by precision."""
    import graphviz  # optional: needed for reports only (its source; no Graphviz binary)
    dot = graphviz.Digraph(graph_attr={"rankdir": "TB"},
                           node_attr={"shape": "box", "style": "filled", "fontsize": "10"})
    nodes, edges = _graph_parts(graph, precisions, hidden)
    for nid, label, tooltip, kind in nodes:
        dot.node(str(nid), label, tooltip=tooltip, fillcolor=COLOURS[kind])
    for src, dst in edges:
        dot.edge(str(src), str(dst))
    return dot.source


def graph_svg(graph, precisions, hidden):
    """An SVG of the converted graph: one row per depth from the inputs,
    boxes coloured by the precision each operator runs in."""
    width, height, gap_x, gap_y, legend_h = 170, 24, 12, 26, 30
    nodes, edges = _graph_parts(graph, precisions, hidden)
    inputs = {}
    for src, dst in edges:
        inputs.setdefault(dst, []).append(src)
    depth, rows, place = {}, {}, {}
    for nid, *_ in nodes:  # graph order is topological
        depth[nid] = 1 + max((depth[i] for i in inputs.get(nid, [])), default=-1)
        rows.setdefault(depth[nid], []).append(nid)
    for d, members in rows.items():
        for k, nid in enumerate(members):
            place[nid] = (10 + k * (width + gap_x), legend_h + 10 + d * (height + gap_y))
    total_w = 20 + max(len(m) for m in rows.values()) * (width + gap_x) if rows else 200
    total_h = legend_h + 20 + len(rows) * (height + gap_y)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{max(total_w, 760)}" '
             f'height="{total_h}" font-family="sans-serif" font-size="11">']
    for k, (kind, text) in enumerate(LEGEND.items()):
        parts.append(f'<rect x="{10 + k * 150}" y="6" width="14" height="14" '
                     f'fill="{COLOURS[kind]}" stroke="#555"/><text x="{28 + k * 150}" y="17">'
                     f'{html.escape(text)}</text>')
    for src, dst in edges:
        (x1, y1), (x2, y2) = place[src], place[dst]
        parts.append(f'<line x1="{x1 + width / 2}" y1="{y1 + height}" x2="{x2 + width / 2}" '
                     f'y2="{y2}" stroke="#999" stroke-width="1"/>')
    for nid, label, tooltip, kind in nodes:
        x, y = place[nid]
        parts.append(f'<g><title>{html.escape(tooltip)}</title><rect x="{x}" y="{y}" '
                     f'width="{width}" height="{height}" rx="4" fill="{COLOURS[kind]}" '
                     f'stroke="#555"/><text x="{x + width / 2}" y="{y + 16}" '
                     f'text-anchor="middle">{html.escape(label[:26])}</text></g>')
    parts.append("</svg>")
    return "\n".join(parts)


def write_text(path, text):
    """Writes under a temporary name, then renames: no half-written file."""
    temp = f"{path}.tmp{os.getpid()}"
    with open(temp, "w") as f:
        f.write(text)
    os.replace(temp, path)


_STYLE = ("body{font-family:sans-serif;margin:1.5em} table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}"
          ".graph{overflow:auto;max-height:80vh;border:1px solid #ccc}")


def _page(title, sections):
    body = "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"{body}</body></html>\n")


def write_zoo_report(directory, results, meta, graphs=()):
    """report.json, report.md and report.html in `directory`. `graphs` is
    [(title, graph JSON, {node: precision}, parameter names)]: one picture
    each (and a .dot file next to the report)."""
    failed_fp32 = [r for r in results if r.get("failed_in") == "float32"]
    failed = [r for r in results if r["status"] != "ok" and r.get("failed_in") != "float32"]
    write_text(os.path.join(directory, "report.json"),
               json.dumps({**meta, "results": results}, indent=1, sort_keys=True))
    headers, rows = ZOO_HEADERS, zoo_rows(results)
    notes = [f"{meta['converted']} converted, {meta['failed']} failed, "
             f"{meta['float32_failed']} whose float32 network does not build or run here.",
             f"CPU: {meta.get('cpu', 'not recorded')}.",
             "max error: relative L2 error against float32 on a random input (detectors: "
             "the tensors fed into NMS). verified: native (this CPU's kernels) or emulated "
             "(low-precision ops computed in float32 and rounded, where this CPU has no "
             "kernel for them)."]
    failures = [(f"{r['model']} ({r['dtype']}, {r['failed_in']})", r["error"])
                for r in failed + failed_fp32]
    md = [f"# mxamp zoo: {meta['dtype']}", "", *notes, "", markdown_table(headers, rows)]
    sections = [("Results", "".join(f"<p>{html.escape(n)}</p>" for n in notes)
                 + html_table(headers, rows))]
    if failures:
        md += ["", "## Failures", "", markdown_table(("model", "error"), failures)]
        sections.append(("Failures", html_table(("model", "error"), failures)))
    for title, graph, precisions, hidden in graphs:
        name = title.replace(" ", "-")
        write_text(os.path.join(directory, f"graph-{name}.dot"),
                   graph_dot(graph, precisions, hidden))
        md += ["", f"Graph of {title}: graph-{name}.dot (see report.html)"]
        sections.append((f"Graph: {title}", "<div class='graph'>"
                         + graph_svg(graph, precisions, hidden) + "</div>"))
    write_text(os.path.join(directory, "report.md"), "\n".join(md) + "\n")
    write_text(os.path.join(directory, "report.html"),
               _page(f"mxamp zoo: {meta['dtype']}", sections))


def write_inspect_report(directory, title, summary, graph, hidden):
    """inspect.json, inspect.md, inspect.html and graph.dot in `directory`."""
    precisions = {r["name"]: r["precision"] for r in summary["operators"]}
    write_text(os.path.join(directory, "inspect.json"),
               json.dumps(summary, indent=1, sort_keys=True))
    facts = [("target dtype", summary["dtype"]),
             ("operators by precision", summary["ops_by_precision"]),
             ("casts", summary["casts"]),
             ("parameters (float32 -> converted)",
              f"{size(summary['param_bytes']['float32'])} -> "
              f"{size(summary['param_bytes']['converted'])}")]
    rows = operator_rows(summary)
    write_text(os.path.join(directory, "inspect.md"), "\n".join(
        [f"# mxamp inspect: {title}", "", markdown_table(("", ""), facts), "",
         markdown_table(OPERATOR_HEADERS, rows)]) + "\n")
    write_text(os.path.join(directory, "graph.dot"), graph_dot(graph, precisions, hidden))
    write_text(os.path.join(directory, "inspect.html"), _page(f"mxamp inspect: {title}", [
        ("Summary", html_table(("", ""), facts)), ("Operators", html_table(OPERATOR_HEADERS, rows)),
        ("Graph", "<div class='graph'>" + graph_svg(graph, precisions, hidden) + "</div>")]))
