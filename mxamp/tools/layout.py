"""Where to draw each box and edge of a graph picture: Graphviz's ``dot``
program (run as a subprocess) when it is installed, else a layered layout
computed here, so a report needs nothing beyond the package.

Both give top-to-bottom layers, each node in the layer after all of its
inputs, and polyline or Bezier edges in pixels with y growing downwards.
The layout here (longest-path layers, nodes that only feed others pulled
down next to their readers, long edges routed through placeholder points,
barycentre ordering and a few alignment passes) is plainer than dot's, but
readable for networks of a few hundred operators.

Past :data:`MAX_LAYERED` nodes, or placeholder points, a graph is listed
instead (:func:`listed`): one node per row in the graph's order, which
takes time in proportion to the graph, where the layered layouts grow
faster (dot did not finish a 3,000-node chain in minutes).
"""
import bisect
import dataclasses
import itertools
import logging
import shutil
import subprocess

log = logging.getLogger(__name__)

DOT_SECONDS = 120  # dot is quadratic in places; a huge graph falls back to the layout here
MAX_LAYERED = 2000  # nodes (or placeholder points) past which a graph is listed
GAP_X, GAP_Y = 18, 34  # pixels between boxes in a layer, and between layers
COLUMN_GAP, MIN_COLUMN = 40, 600  # pixels between wrapped columns; least column height
POINTS_PER_INCH = 72


@dataclasses.dataclass
class Layout:
    width: float
    height: float
    centres: dict       # node key -> (x, y) of its box's centre
    edges: list         # (source key, destination key, [(x, y) ...], curved)
    engine: str         # "dot" or "mxamp"
    # edges cut by wrap(): (source, destination, points to the bottom of the
    # source's column, points from the top of the destination's column)
    continued: list = dataclasses.field(default_factory=list)


def layout(sizes, edges):
    """A :class:`Layout` of nodes `sizes` ({key: (width, height)} in pixels,
    keys in a topological order) joined by `edges` [(source, destination)]."""
    if not layered(sizes, edges):
        return listed(sizes, edges)
    if shutil.which("dot"):
        try:
            return _dot_layout(sizes, edges)
        except (OSError, subprocess.SubprocessError, ValueError) as err:
            log.warning("Graphviz dot failed (%s); using mxamp's own layout", err)
    return _layered_layout(sizes, edges)


def _dot_layout(sizes, edges):
    ids = {key: f"n{k}" for k, key in enumerate(sizes)}
    lines = ["digraph g {", "graph [rankdir=TB, nodesep=0.25, ranksep=0.4];",
             'node [shape=box, fixedsize=true, label=""];']
    lines += [f"{ids[key]} [width={w / POINTS_PER_INCH:.3f}, height={h / POINTS_PER_INCH:.3f}];"
              for key, (w, h) in sizes.items()]
    # Edges between operators pull harder than those from sources (inputs,
    # parameter casts): the chain of operators stays straight.
    fed = {b for _, b in edges}
    lines += [f"{ids[a]} -> {ids[b]}{' [weight=8]' if a in fed else ''};" for a, b in edges]
    lines.append("}")
    done = subprocess.run(["dot", "-Tplain"], input="\n".join(lines), capture_output=True,
                          text=True, timeout=DOT_SECONDS, check=True)
    keys = {v: k for k, v in ids.items()}
    centres, routes, height, width = {}, [], 0.0, 0.0

    def point(x, y):  # dot's y grows upwards, in inches
        return float(x) * POINTS_PER_INCH, height - float(y) * POINTS_PER_INCH
    for line in done.stdout.splitlines():
        words = line.split()
        if words[0] == "graph":
            width, height = (float(v) * POINTS_PER_INCH for v in words[2:4])
        elif words[0] == "node":
            centres[keys[words[1]]] = point(*words[2:4])
        elif words[0] == "edge":
            n = int(words[3])
            coords = words[4:4 + 2 * n]
            routes.append((keys[words[1]], keys[words[2]],
                           [point(*coords[i:i + 2]) for i in range(0, 2 * n, 2)], True))
    if len(centres) != len(sizes):
        raise ValueError(f"dot placed {len(centres)} of {len(sizes)} nodes")
    return Layout(width, height, centres, routes, "dot")


def _layers(keys, inputs, readers):
    """{key: layer}: one below its deepest input; a node is then moved down
    to just above its first reader when nothing holds it higher (parameter
    casts and constants sit next to the layer reading them, not at the top)."""
    layer = {}
    for key in keys:
        layer[key] = 1 + max((layer[i] for i in inputs[key]), default=-1)
    for key in reversed(keys):
        if readers[key]:
            layer[key] = max(layer[key], min(layer[r] for r in readers[key]) - 1)
    return layer


def _links(keys, edges):
    inputs, readers = {k: [] for k in keys}, {k: [] for k in keys}
    for a, b in edges:
        inputs[b].append(a)
        readers[a].append(b)
    return inputs, readers


def layered(sizes, edges):
    """Whether the layered layouts draw this graph: at most MAX_LAYERED nodes
    and as many placeholder points for its long edges."""
    if len(sizes) > MAX_LAYERED:
        return False
    layer = _layers(list(sizes), *_links(list(sizes), edges))
    return sum(max(layer[b] - layer[a] - 1, 0) for a, b in edges) <= MAX_LAYERED


def listed(sizes, edges):
    """One node per row in the order of `sizes`, centred on one line; an edge
    between neighbours is straight, a longer one bows out to the right, the
    further the longer. Time in proportion to the graph."""
    x = max((w for w, _ in sizes.values()), default=0.0) / 2 + GAP_X
    centres, y = {}, GAP_Y / 2
    for key, (_, h) in sizes.items():
        centres[key] = (x, y + h / 2)
        y += h + GAP_Y
    row = {key: k for k, key in enumerate(sizes)}
    routes, bow = [], 0.0
    for a, b in edges:
        (_, ya), (_, yb) = centres[a], centres[b]
        start, end = (x, ya + sizes[a][1] / 2), (x, yb - sizes[b][1] / 2)
        if row[b] - row[a] == 1:
            routes.append((a, b, [start, end], False))
            continue
        out = x + sizes[a][0] / 2 + GAP_X * min(row[b] - row[a], 8)
        bow = max(bow, out)
        routes.append((a, b, [start, (out, start[1]), (out, end[1]), end], True))
    width = max(2 * x, bow + GAP_X)
    return Layout(width, y, centres, routes, "list")


def _order(rows, up, down, sweeps=6):
    """Reorders each row (a list of keys) by the mean position of its
    neighbours in the row above, then below, alternately."""
    position = {k: i for row in rows for i, k in enumerate(row)}
    for sweep in range(sweeps):
        pairs = (range(1, len(rows)), up) if sweep % 2 == 0 else \
            (range(len(rows) - 2, -1, -1), down)
        for r in pairs[0]:
            def centre(key, near=pairs[1]):
                found = [position[n] for n in near[key]]
                return sum(found) / len(found) if found else position[key]
            rows[r].sort(key=centre)
            position.update((k, i) for i, k in enumerate(rows[r]))
    return rows


def _place_row(row, width, wanted, priority):
    """x centres for a row's keys in order: as near to `wanted` as the
    boxes' widths allow, without overlap, the row shifted so that its node
    of highest `priority` is where it wants to be (else a column of
    operators drifts sideways by every box placed beside it)."""
    xs = [wanted[k] for k in row]
    for i in range(1, len(row)):  # push right past the left neighbour
        xs[i] = max(xs[i], xs[i - 1] + (width[row[i - 1]] + width[row[i]]) / 2 + GAP_X)
    for i in range(len(row) - 2, -1, -1):  # then pull left where the right one allows
        limit = xs[i + 1] - (width[row[i + 1]] + width[row[i]]) / 2 - GAP_X
        xs[i] = min(xs[i], limit)
    if not row:
        return {}
    anchor = max(range(len(row)), key=lambda i: priority.get(row[i], 0))
    shift = wanted[row[anchor]] - xs[anchor]
    return {k: x + shift for k, x in zip(row, xs)}


def _layered_layout(sizes, edges):
    keys = list(sizes)
    inputs, readers = _links(keys, edges)
    layer = _layers(keys, inputs, readers)
    # An edge over several layers passes through a placeholder in each, so
    # ordering keeps it clear of the boxes it passes.
    width = {k: w for k, (w, _) in sizes.items()}
    up, down = ({k: list(v) for k, v in links.items()} for links in (inputs, readers))
    chains = []
    for n, (a, b) in enumerate(edges):
        chain = [a] + [("via", n, d) for d in range(layer[a] + 1, layer[b])] + [b]
        for p, q in itertools.pairwise(chain):
            if p != a or q != b:
                down.setdefault(p, []).append(q)
                up.setdefault(q, []).append(p)
        for via in chain[1:-1]:
            width[via] = 4
            layer[via] = via[2]
        chains.append(chain)
    for a, b in edges:
        if layer[b] - layer[a] > 1:  # replaced by the chain's steps
            down[a].remove(b)
            up[b].remove(a)
    rows = [[] for _ in range(max(layer.values(), default=-1) + 1)]
    for key in [*keys, *(v for c in chains for v in c[1:-1])]:
        rows[layer[key]].append(key)
    rows = _order(rows, up, down)
    # Operators joined to many others anchor their rows; placeholders never do.
    priority = {k: len(inputs[k]) + len(readers[k]) for k in keys}
    xs = {}
    for row in rows:
        xs.update(_place_row(row, width, {k: 0.0 for k in row}, priority))
    def mean_x(neighbours):
        # nodes before placeholders: a chain stays straight beside the long
        # edges that pass it, rather than drifting halfway towards each
        real = [n for n in neighbours if n in sizes] or neighbours
        return sum(xs[n] for n in real) / len(real)
    for sweep in range(8):  # align each node with the mean of its neighbours
        near = up if sweep % 2 == 0 else down
        for row in rows if sweep % 2 == 0 else reversed(rows):
            wanted = {k: mean_x(near[k]) if near.get(k) else xs[k] for k in row}
            xs.update(_place_row(row, width, wanted, priority))
    left = min((xs[k] - width[k] / 2 for k in xs), default=0.0) - GAP_X
    tops, y = [], GAP_Y / 2
    for row in rows:
        tallest = max((sizes[k][1] for k in row if k in sizes), default=4)
        tops.append((y, tallest))
        y += tallest + GAP_Y
    centre = {k: (xs[k] - left, tops[layer[k]][0] + tops[layer[k]][1] / 2) for k in xs}
    routes = []
    for (a, b), chain in zip(edges, chains):
        (xa, ya), (xb, yb) = centre[a], centre[b]
        points = [(xa, ya + sizes[a][1] / 2)] + [centre[v] for v in chain[1:-1]] + \
            [(xb, yb - sizes[b][1] / 2)]
        routes.append((a, b, points, False))
    right = max((xs[k] + width[k] / 2 for k in xs), default=0.0) - left + GAP_X
    return Layout(right, y, {k: centre[k] for k in keys}, routes, "mxamp")


def wrap(placed, sizes, width):
    """`placed` (a :class:`Layout` of boxes `sizes`) cut into the most
    columns side by side that fit in `width` pixels: a deep, narrow network
    reads down one column and on at the top of the next, instead of being
    a sliver many screens tall. Each cut is in a gap between rows of boxes,
    near an even share of the height, where the fewest edges cross; those
    edges run off the bottom of their source's column and in at the top of
    their destination's (``Layout.continued``)."""
    gaps = _gaps(placed, sizes)
    crossing = _crossings(placed, gaps)
    narrowest = min((w for w, _ in sizes.values()), default=width)
    # every column holds a box: no more columns than the narrowest boxes fit
    most = min(int(placed.height // MIN_COLUMN), int((width + COLUMN_GAP) //
                                                     (narrowest + COLUMN_GAP)))
    for columns in range(most, 1, -1):
        cuts, share = [], placed.height / columns
        for j in range(1, columns):
            target = j * share
            first = bisect.bisect_left(gaps, target - share / 4)
            if cuts:
                first = max(first, bisect.bisect_right(gaps, cuts[-1]))
            near = range(first, bisect.bisect_right(gaps, target + share / 4))
            if near:
                cuts.append(gaps[min(near, key=lambda i, t=target: (crossing[i],
                                                                      abs(gaps[i] - t)))])
        wrapped = _columns(placed, sizes, cuts)
        if wrapped.width <= width:
            return wrapped
    return placed


def _gaps(placed, sizes):
    """The heights between rows of boxes where a cut crosses no box, ascending."""
    spans = sorted((y - sizes[k][1] / 2, y + sizes[k][1] / 2)
                   for k, (_, y) in placed.centres.items())
    gaps, reach = [], spans[0][1] if spans else 0.0
    for top, bottom in spans[1:]:
        if top > reach:
            gaps.append((reach + top) / 2)
        reach = max(reach, bottom)
    return gaps


def _crossings(placed, gaps):
    """How many edges cross each gap: +1 where an edge starts, -1 past where
    it ends, summed along the gaps (in time E log G, not E x G)."""
    change = [0] * (len(gaps) + 1)
    for a, b, _, _ in placed.edges:
        top, bottom = sorted((placed.centres[a][1], placed.centres[b][1]))
        change[bisect.bisect_right(gaps, top)] += 1
        change[bisect.bisect_left(gaps, bottom)] -= 1
    return list(itertools.accumulate(change))[:len(gaps)]


def wrapped(sizes, edges, width):
    """:func:`layout` cut into columns by :func:`wrap`; where dot's picture
    does not wrap into `width`, mxamp's own layout if that wraps narrower.
    dot moves the chain of operators sideways at every residual block (the
    shortcut's edge beside it), by the width of a box alongside: with the
    parameter casts drawn, MobileNet v2's chain drifts 850 px down the
    picture, and no column is narrow enough."""
    placed = wrap(layout(sizes, edges), sizes, width)
    if placed.engine == "dot" and placed.width > width:
        own = wrap(_layered_layout(sizes, edges), sizes, width)
        if own.width < placed.width:
            return own
    return placed


def _columns(placed, sizes, cuts):
    """`placed` cut at heights `cuts`, the pieces side by side, each as
    narrow as what is in it."""
    bounds = [0.0, *cuts, placed.height]

    def column(y):
        return bisect.bisect_right(cuts, y)
    lefts, rights = [float("inf")] * len(bounds), [float("-inf")] * len(bounds)
    for k, (x, y) in placed.centres.items():
        j = column(y)
        half = sizes[k][0] / 2
        lefts[j], rights[j] = min(lefts[j], x - half), max(rights[j], x + half)
    shifts, at = [], 0.0
    for left, right in zip(lefts, rights):
        shifts.append(at - left if right > left else at)
        at += max(right - left, 0.0) + COLUMN_GAP

    def moved(points, j):
        return [(x + shifts[j], y - bounds[j]) for x, y in points]
    centres = {k: moved([c], column(c[1]))[0] for k, c in placed.centres.items()}
    edges, continued = [], []
    for a, b, points, curved in placed.edges:
        ja, jb = column(placed.centres[a][1]), column(placed.centres[b][1])
        if ja == jb:
            edges.append((a, b, moved(points, ja), curved))
            continue
        # a curve's control points serve as a polyline's corners here
        out = [p for p in points if p[1] < bounds[ja + 1]] or points[:1]
        into = [p for p in points if p[1] > bounds[jb]] or points[-1:]
        continued.append((a, b, moved(out + [(out[-1][0], bounds[ja + 1])], ja),
                          moved([(into[0][0], bounds[jb])] + into, jb)))
    height = max(bounds[j + 1] - bounds[j] for j in range(len(bounds) - 1))
    return Layout(at - COLUMN_GAP, height, centres, edges, placed.engine, continued)
