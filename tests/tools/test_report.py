"""Reports people read: the pages mxamp inspect / zoo / quantize / optimize write.

Structure (everywhere): the graph picture holds every node by name with an
arrow per edge, laid out in layers by Graphviz's dot or mxamp's own layout,
wrapped into columns, parameter casts folded into their readers; the reasons
table names the upstream node of "runs in its input's dtype"; FLOPs are
exact; per-layer errors are measured against float32; the charts are inline
SVG. Rendering (where Debian's chromium is installed): the pages load in
headless Chromium and their script runs (find, sort, filter); MobileNet v2's
page fits a 1400x900 window with whole labels and an overview.
"""
import html
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import types

import mxnet as mx
import numpy as np
import pytest
from gluoncv import model_zoo

from graphs import tiny_net
import mxamp
from mxamp.gluon import model_of
from mxamp.graph import graph_json
from mxamp.quantization import quantize_model
from mxamp.tools import inspection, layout, report
from mxamp.tools.checkpoint import save_checkpoint
from mxamp.tools.plots import PRECISION_COLOURS
from published import listing

SHAPES = {"data": (1, 3, 8, 8)}
OPS = ["conv0_fwd", "batchnorm0_fwd", "relu0_fwd", "pool0_fwd", "dense0_fwd"]
ENGINES = ["mxamp", pytest.param("dot", marks=pytest.mark.skipif(
    shutil.which("dot") is None, reason="Graphviz's dot is not installed"))]


@pytest.fixture(scope="module")
def tiny():
    """Convolution -> BatchNorm -> relu -> pooling -> Dense, float32."""
    net = tiny_net(SHAPES["data"])
    return model_of(net, "testing")[:3]


@pytest.fixture
def engine(request, monkeypatch):
    """Which layout graph_svg uses: mxamp's own (dot hidden) or dot."""
    if request.param == "mxamp":  # layout's own shutil: the C++ build still finds g++
        monkeypatch.setattr(layout, "shutil", types.SimpleNamespace(which=lambda _: None))
    return request.param


def _shown_edges(graph, hidden):
    nodes = graph["nodes"]
    return sum(1 for n in nodes if not (n["op"] == "null" and n["name"] in hidden)
               for e in n["inputs"] if nodes[e[0]]["name"] not in hidden)


def test_input_from_follows_the_multicast_output_read():
    """A multicast's output k carries its input k: a node reading output 1
    runs in the second input's dtype, not the first's."""
    a, b = mx.sym.var("a"), mx.sym.var("b")
    cast = mx.sym.amp_multicast(a, b, num_outputs=2, name="multicast")
    group = mx.sym.Group([mx.sym.relu(cast[0], name="first"),
                          mx.sym.relu(cast[1], name="second")])
    assert inspection.source_names(graph_json(group)) == {"first": "a", "second": "b"}


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_inspect_page_has_graph_reasons_and_plots(tiny, tmp_path, engine):
    summary, converted = inspection.inspect_model(*tiny, dtype="float16", data_shapes=SHAPES)
    rows = {r["name"]: r for r in summary["operators"]}
    # FLOPs: 2 per multiply-add for Convolution (8x8x8 outputs of 3x3x3) and
    # Dense (4 outputs of 8), one per output element elsewhere.
    assert {n: rows[n]["flops"] for n in OPS} == {
        "conv0_fwd": 2 * 512 * 27, "batchnorm0_fwd": 512, "relu0_fwd": 512, "pool0_fwd": 8,
        "dense0_fwd": 2 * 4 * 8}
    # Every layer runs in float16 (emulated): a float16-sized error, never 0.
    assert all(0 < rows[n]["error"] < 1e-2 for n in OPS)
    assert [rows[n]["input_from"] for n in OPS] == [
        None, "conv0_fwd", "batchnorm0_fwd", "relu0_fwd", None]

    graph, hidden = graph_json(converted[0]), set(converted[1]) | set(converted[2])
    report.write_inspect_report(tmp_path, "tiny", summary, graph, hidden)
    page = (tmp_path / "inspect.html").read_text()
    folded, full = re.findall(r"<svg[^>]*class=\"graph\".*?</svg>", page, re.DOTALL)
    assert re.search(r'data-layout="(\w+)"', folded).group(1) == engine
    names = re.findall(r'<g class="node" data-name="([^"]+)"', full)
    assert sorted(names) == sorted(n["name"] for n in graph["nodes"]
                                   if n["name"] not in hidden)
    assert len(names) == 12  # data, 6 casts, 5 operators
    assert full.count('marker-end="url(#graph-full-arrow)"') == _shown_edges(graph, hidden)
    # The picture shown first folds the 4 casts of conv0's and dense0's
    # weight and bias into a "+2" badge on each, with their names in its tooltip.
    weights = {f"{layer}_{p}_amp_cast_float16" for layer in ("conv0", "dense0")
               for p in ("weight", "bias")}
    assert set(re.findall(r'<g class="node" data-name="([^"]+)"', folded)) == \
        set(names) - weights
    assert re.findall(r'data-name="(\w+)"[^>]*><title>[^<]*parameter casts folded in: '
                      r'([^<]+)<', folded) == [
        (f"{layer}_fwd", f"{layer}_weight_amp_cast_float16, {layer}_bias_amp_cast_float16")
        for layer in ("conv0", "dense0")]
    assert re.findall(r'<rect class="badge".*?>\+(\d)</text>', folded) == ["2", "2"]
    assert folded.count("marker-end=") == _shown_edges(graph, hidden) - 4
    assert "show the 4 parameter casts" in page
    for svg in (folded, full):
        assert svg.count(f'fill="{PRECISION_COLOURS["float16"]}"') == 5
    table = page[page.index("<table class=sortable>"):]
    assert table.count("<tr>") == 1 + 5  # heading + one row per operator
    assert ("<td>runs in its input's dtype</td><td><a href='#graph' class='node-link' "
            "data-node='conv0_fwd'>conv0_<wbr>fwd</a></td>") in table
    assert page.count("<svg") == 4  # the graph twice, its overview, the per-layer errors
    assert "error of each layer" in page
    assert "{'" not in page  # no Python dict printed anywhere
    md = (tmp_path / "inspect.md").read_text()
    assert "| batchnorm0_fwd | BatchNorm | float16 | runs in its input's dtype | conv0_fwd |" in md
    assert "| operators by precision | float16 5 |" in md
    assert sorted(os.listdir(tmp_path)) == ["inspect.html", "inspect.json", "inspect.md"]


def _rows_of(placed):
    """{node: index of its row} from the boxes' centres (one row per y)."""
    ys = sorted({round(y) for _, y in placed.centres.values()})
    return {k: ys.index(round(y)) for k, (_, y) in placed.centres.items()}


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_layout_layers_casts_next_to_their_readers(engine):
    """data -> conv1 -> relu -> conv2 -> add(relu, conv2) -> fc, where conv1,
    conv2 and fc read parameter casts (sources of the drawn graph). Each
    node is in a row below its inputs, a cast in the row just above its
    reader (not at the top, as depth from the inputs put it), no boxes
    overlap, and every edge runs from its source's box to its destination's."""
    names = ["data", "cast1", "conv1", "relu", "cast2", "conv2", "add", "cast3", "fc"]
    edges = [("data", "conv1"), ("cast1", "conv1"), ("conv1", "relu"), ("relu", "conv2"),
             ("cast2", "conv2"), ("relu", "add"), ("conv2", "add"), ("add", "fc"),
             ("cast3", "fc")]
    sizes = {n: (60 + 10 * len(n), 32) for n in names}
    placed = layout.layout(sizes, edges)
    assert placed.engine == engine
    row = _rows_of(placed)
    assert all(row[b] > row[a] for a, b in edges)
    assert [row[c] for c in ("cast1", "cast2", "cast3")] == \
        [row[r] - 1 for r in ("conv1", "conv2", "fc")]
    boxes = [(x - sizes[k][0] / 2, x + sizes[k][0] / 2, y - 16, y + 16)
             for k, (x, y) in placed.centres.items()]
    assert not any(a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]
                   for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(0 <= x <= placed.width and 0 <= y <= placed.height
               for x, y in placed.centres.values())
    for a, b, points, _ in placed.edges:
        (xa, ya), (xb, yb) = placed.centres[a], placed.centres[b]
        assert abs(points[0][1] - (ya + 16)) <= 2 and abs(points[0][0] - xa) <= sizes[a][0] / 2
        # dot stops an edge short of its head by the arrowhead's length
        assert 0 <= (yb - 16) - points[-1][1] <= 12 and abs(points[-1][0] - xb) <= sizes[b][0] / 2


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
def test_wrap_cuts_a_deep_chain_into_columns(engine):
    """A chain of 40 boxes 100 px wide, wrapped to 600 px: 4 columns (4 x 100
    + 3 gaps of 40), 10 boxes each (cuts near even shares of the height), in
    chain order; the 3 edges between columns run from the bottom of one (the
    column's height, below their source) to the top of the next (y 0)."""
    names = [f"n{i}" for i in range(40)]
    sizes = {n: (100, 32) for n in names}
    edges = list(itertools.pairwise(names))
    wrapped = layout.wrap(layout.layout(sizes, edges), sizes, 600)
    assert wrapped.engine == engine and wrapped.width <= 600
    xs = sorted({round(x) for x, _ in wrapped.centres.values()})
    column = {n: xs.index(round(x)) for n, (x, _) in wrapped.centres.items()}
    assert [column[n] for n in names] == [k // 10 for k in range(40)]
    assert all(wrapped.centres[a][1] < wrapped.centres[b][1] for a, b, _, _ in wrapped.edges)
    assert [(a, b) for a, b, _, _ in wrapped.continued] == [("n9", "n10"), ("n19", "n20"),
                                                            ("n29", "n30")]
    for a, b, out, into in wrapped.continued:
        assert out[0][1] > wrapped.centres[a][1] and out[-1][1] <= wrapped.height
        assert into[0][1] == 0 and into[-1][1] < wrapped.centres[b][1]


def _zoo_result(model, dtype, **extra):
    return {"model": model, "dtype": dtype, "family": "classification", "ctx": "any",
            "input_shape": list(SHAPES["data"]), "weights": "random", "status": "ok",
            "failed_in": None, "error": None, "pre_nms": {}, "verified": "emulated",
            "casts": {"amp_cast:float16": 6}, "ops_by_precision": {dtype: 5},
            "param_bytes": {"float32": 1168, "converted": 1168}, "convert_seconds": 0.1,
            "files": [f"{model}-{dtype}-0000.params", f"{model}-{dtype}-symbol.json"],
            **extra}


def test_zoo_index_links_one_page_per_model(tiny, tmp_path):
    """A batch's index: results (detectors' error marked as taken before
    NMS), the error and precision-share charts, a link to each converted
    model's page; a failed conversion has no page."""
    results = []
    for model, dtype, extra in (("tiny", "float16", {"max_error": 1e-3}),
                                ("tinydet", "bfloat16", {"max_error": 4e-3,
                                                         "pre_nms": {"x_output": 4e-3}})):
        save_checkpoint(str(tmp_path / f"{model}-{dtype}"),
                        *mxamp.convert_model(*tiny, target_dtype=dtype))
        results.append(_zoo_result(model, dtype, **extra))
    results.append({"model": "broken", "dtype": "float16", "status": "failed", "ctx": "any",
                    "failed_in": "conversion", "error": "ValueError: no", "weights": "random",
                    "files": []})
    meta = {"dtype": "float16, bfloat16", "converted": 2, "failed": 1, "float32_failed": 0}
    report.write_zoo_report(str(tmp_path), results, meta)
    index = (tmp_path / "report.html").read_text()
    assert "<a href='tiny-float16.html'>" in index and "<a href='tinydet-bfloat16.html'>" in index
    assert "<td>broken</td><td>float16</td><td>random</td><td>failed in conversion</td>" in index
    assert "<td>4.00e-03 before NMS</td>" in index and "<td>1.00e-03</td>" in index
    assert index.count("<svg") == 2 and 'class="node"' not in index  # charts, no graph
    assert "| tinydet | bfloat16 | random | ok | 4.00e-03 before NMS |" in \
        (tmp_path / "report.md").read_text()
    page = (tmp_path / "tinydet-bfloat16.html").read_text()
    assert "<a href='report.html'>" in page
    assert "4.00e-03 (before NMS)" in page
    # the graph with parameter casts folded (8 nodes) and whole (12), its overview
    assert page.count('class="node"') == 8 + 12 and page.count("<svg") == 4
    assert "FLOPs by precision" in page
    assert not (tmp_path / "broken-float16.html").exists()


def test_int8_report(tiny, tmp_path):
    """Calibrated ranges and per-layer error of an INT8 model; the excluded
    Dense layer is float32 and says why."""
    rng = np.random.RandomState(0)
    calib = mx.io.NDArrayIter(mx.nd.array(rng.uniform(size=(8, 3, 8, 8))), batch_size=4)
    quantized = quantize_model(*tiny, calib_data=calib, calib_mode="naive",
                               excluded_sym_names=["dense0_fwd"], quantized_dtype="auto")
    report.write_int8_report(str(tmp_path), "tiny", tiny, quantized, SHAPES)
    summary = json.loads((tmp_path / "int8.json").read_text())
    rows = {r["name"]: r for r in summary["operators"]}
    assert [rows[n]["precision"] for n in OPS] == ["int8"] * 4 + ["float32"]
    assert rows["dense0_fwd"]["excluded"] and not rows["conv0_fwd"]["excluded"]
    assert rows["relu0_fwd"]["min"] == 0 < rows["relu0_fwd"]["threshold"]
    assert all(0 < rows[n]["error"] < 0.1 for n in OPS)
    assert 0 < summary["output_errors"][0] < 0.1
    assert summary["input_ranges"]["data"][1] == pytest.approx(1, abs=0.05)
    page = (tmp_path / "int8.html").read_text()
    # the float32 graph (no casts to fold), its overview, calibration ranges, per-layer error
    assert page.count("<svg") == 4 and "class='show-casts'" not in page
    assert page.count(f'fill="{PRECISION_COLOURS["int8"]}"') == 4
    assert "<td>excluded</td>" in page


@pytest.fixture(scope="module")
def resnet50_page(tmp_path_factory):
    """ResNet-50 v1 (random weights) in bfloat16: its inspect page."""
    # The prefix fixed: Gluon numbers it after the ResNets built before in the process
    net = model_zoo.get_model("resnet50_v1", pretrained=False, prefix="resnetv10_")
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 3, 224, 224)))
    model = model_of(net, "testing")[:3]
    summary, converted = inspection.inspect_model(*model, dtype="bfloat16",
                                                  data_shapes={"data": (1, 3, 224, 224)})
    directory = tmp_path_factory.mktemp("resnet50")
    graph, hidden = graph_json(converted[0]), set(converted[1]) | set(converted[2])
    report.write_inspect_report(str(directory), "resnet50_v1", summary, graph, hidden)
    return directory / "inspect.html", summary, graph, hidden


@pytest.mark.parametrize("engine", ENGINES, indirect=True)
@pytest.mark.parametrize("fold", [True, False])
def test_resnet50_graph_is_drawn_to_scale(resnet50_page, engine, fold):
    """The complaint: a 16036 x 8500 px picture of op types, every
    parameter cast at depth 0. Now every node is named in a picture a few
    boxes wide, boxes apart. Folded (as the page first shows it), the 87
    parameter casts are badges on their readers and the picture wraps
    into columns that fit report.WRAP_PX; whole, each weight's cast is in the row
    above its Convolution."""
    _, summary, graph, hidden = resnet50_page
    svg = report.graph_svg(graph, {r["name"]: r["precision"] for r in summary["operators"]},
                           hidden, fold=fold)
    drawn_by = re.search(r'data-layout="(\w+)"', svg).group(1)
    # whole, dot's picture does not wrap: mxamp's own replaces it where narrower
    assert drawn_by == engine or (engine == "dot" and not fold and drawn_by == "mxamp")
    width = float(re.search(r'data-width="([\d.]+)"', svg).group(1))
    names = set(re.findall(r'<g class="node" data-name="([^"]+)"', svg))
    operators = {r["name"] for r in summary["operators"]}
    casts = {graph["nodes"][i]["name"] for i in report.parameter_casts(graph, hidden)}
    # the 53 Convolutions' weights, 32 of their biases, the Dense layer's weight and bias
    assert len(casts) == 53 + 32 + 2
    others = {"data", "data_amp_cast_bfloat16", "resnetv10_dense0_fwd_amp_cast_float32"}
    assert names == operators | others | (set() if fold else casts)
    if fold:
        assert width <= report.WRAP_PX and "stroke-dasharray" in svg  # columns, continued edges
    else:
        assert width < 4000
    boxes = [tuple(map(float, b)) for b in re.findall(
        r'<rect x="([\d.-]+)" y="([\d.-]+)" width="([\d.]+)" height="([\d.]+)"', svg)]
    assert len(boxes) == len(names)
    assert not any(a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and
                   a[1] < b[1] + b[3] and b[1] < a[1] + a[3]
                   for i, a in enumerate(boxes) for b in boxes[i + 1:])
    if not fold:  # one row (a 32 px box and the gap between rows) above
        xy = {name: (float(x), float(y)) for name, x, y in re.findall(
            r'data-name="([^"]+)" data-x="([\d.-]+)" data-y="([\d.-]+)"', svg)}
        conv = "resnetv10_stage4_conv2_fwd"
        cast = xy[conv.replace("fwd", "weight_amp_cast_bfloat16")]
        assert 32 < xy[conv][1] - cast[1] <= 32 + layout.GAP_Y


CHROMIUM = shutil.which("chromium")


def _chromium(*args):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", *args], capture_output=True, text=True,
                          timeout=180, check=True)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_resnet50_page_in_headless_chromium(resnet50_page, tmp_path):
    path = resnet50_page[0]
    target = "resnetv10_stage3_conv2_fwd"
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom",
                    f"file://{path}#find={target}").stdout
    # The page's script ran: it found the node and moved the view to it.
    assert re.search(rf'<g class="node hit" data-name="{target}"', dom)
    view = re.search(r'<svg[^>]*viewBox="([^"]+)"', dom).group(1)
    width = float(re.search(r'data-width="([\d.]+)"', dom).group(1))
    assert float(view.split()[2]) < width  # 1:1 around the node, not the whole graph
    assert "1 of 1: " + target in dom
    shot = tmp_path / "page.png"
    _chromium("--window-size=1400,2000", f"--screenshot={shot}", f"file://{path}")
    from PIL import Image
    pixels = Image.open(shot).convert("RGB")
    colours = {c for _, c in pixels.getcolors(1 << 20)}
    bfloat16 = tuple(int(PRECISION_COLOURS["bfloat16"][i:i + 2], 16) for i in (1, 3, 5))
    assert pixels.size == (1400, 2000) and bfloat16 in colours


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_operator_table_sorts_and_filters_in_chromium(resnet50_page, tmp_path):
    """The page's script, driven as a reader would: type "Convolution" in the
    filter, click the error heading twice (largest first)."""
    path, summary = resnet50_page[:2]
    clicks = ("<script>window.addEventListener('load',function(){"
              "var th=document.querySelectorAll('table.sortable th');"
              "var error=th[th.length-1];error.click();error.click();"
              "var box=document.querySelector('.filter');box.value='Convolution';"
              "box.dispatchEvent(new Event('input'));});</script>")
    page = tmp_path / "driven.html"
    page.write_text(path.read_text().replace("</body>", clicks + "</body>"))
    dom = _chromium("--virtual-time-budget=5000", "--dump-dom", f"file://{page}").stdout
    table = dom[dom.index('<table class="sortable">'):]
    shown = [re.search(r"data-node=\"([^\"]+)\"", row).group(1)
             for row in re.findall(r"<tr(?![^>]*display: none)[^>]*>(.*?)</tr>", table,
                                   re.DOTALL)[1:]]
    convolutions = sorted((r for r in summary["operators"] if r["op"] == "Convolution"),
                          key=lambda r: -r["error"])
    assert shown == [r["name"] for r in convolutions]



@pytest.fixture(scope="module")
def mobilenet_page(tmp_path_factory):
    """MobileNet v2 (random weights) in bfloat16: its inspect page, with FLOPs
    and per-layer errors (the widest reasons table)."""
    net = model_zoo.get_model("mobilenetv2_1.0", pretrained=False, prefix="mobilenetv20_")
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 3, 224, 224)))
    summary, converted = inspection.inspect_model(*model_of(net, "testing")[:3],
                                                  dtype="bfloat16",
                                                  data_shapes={"data": (1, 3, 224, 224)})
    directory = tmp_path_factory.mktemp("mobilenet")
    graph, hidden = graph_json(converted[0]), set(converted[1]) | set(converted[2])
    report.write_inspect_report(str(directory), "mobilenetv2_1.0", summary, graph, hidden)
    return directory / "inspect.html", graph, hidden


# Run in the page once it has laid out: scrolls the graph into view, then
# writes what a reader would see as JSON into <pre id="measured">: the
# window, the graph view's and overview's boxes, and each drawn node's box,
# name label and badge; then ticks "show the parameter casts" and counts.
MEASURE = """<script>window.addEventListener('load',function(){setTimeout(function(){
function box(e){var b=e.getBoundingClientRect();return [b.left,b.top,b.right,b.bottom];}
var view=document.querySelector('.graphview');view.scrollIntoView();
var svg=view.querySelector('svg.graph'),over=view.querySelector('.overview');
var out={window:[innerWidth,innerHeight],scrollWidth:document.documentElement.scrollWidth,
  view:box(view),svg:box(svg),viewBox:svg.getAttribute('viewBox').split(' ').map(Number),
  width:+svg.dataset.width,overview:box(over),whole:box(over.querySelector('use')),
  frame:box(over.querySelector('.frame')),
  nodes:[].map.call(svg.querySelectorAll('g.node'),function(g){
    var t=g.querySelector('text.label'),b=g.querySelector('rect.badge'),
      lines=g.querySelectorAll('text');
    return {name:g.dataset.name,label:t.textContent,
            second:lines[lines.length-1].textContent,box:box(g.querySelector('rect')),
            text:box(t),badge:b?box(b):null};})};
var casts=view.querySelector('.show-casts');casts.click();
var shown=[].filter.call(view.querySelectorAll('svg.graph'),function(s){
  return s.style.display!=='none';});
out.withCasts=[shown.length,shown[0].querySelectorAll('g.node').length];
out.casts={svg:box(shown[0]),viewBox:shown[0].getAttribute('viewBox').split(' ').map(Number),
  width:+shown[0].dataset.width,height:+shown[0].dataset.height,
  continued:shown[0].querySelectorAll('g.continued').length};
var pre=document.createElement('pre');pre.id='measured';pre.textContent=JSON.stringify(out);
document.body.appendChild(pre);},200);});</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_mobilenet_graph_fits_1400x900_in_chromium(mobilenet_page, tmp_path):
    """The complaint: at 50+ layers the whole-graph view was a sliver with no
    overview, labels cut at the end ('...linearbottleneck10_co...'), 53
    parameter casts cluttering it, a reasons table wider than the window.
    In headless Chromium at 1400x900: nothing is wider than the window; the
    graph view (tools, picture, overview) is on screen whole; at its first
    zoom (1:1, text 11 px) the picture's full width is in view (wrapped into
    columns); the overview holds the whole graph with the view's frame in it;
    every label is inside its box, keeps the end of its node's name, and no
    two boxes read alike; parameter casts are folded until the box is ticked."""
    path, graph, hidden = mobilenet_page
    page = tmp_path / "measured.html"
    page.write_text(path.read_text().replace("</body>", MEASURE + "</body>"))
    dom = _chromium("--window-size=1400,900", "--virtual-time-budget=5000", "--dump-dom",
                    f"file://{page}").stdout
    m = json.loads(html.unescape(re.search(r'<pre id="measured">(.*?)</pre>', dom).group(1)))
    width, height = m["window"]
    assert width == 1400 and m["scrollWidth"] <= width  # the reasons table fits too
    left, top, right, bottom = m["view"]
    assert 0 <= left and right <= width and -1 <= top and bottom <= height
    x, y, w, h = m["viewBox"]
    assert w == pytest.approx(m["svg"][2] - m["svg"][0], abs=1)  # 1:1
    assert x <= 0 and x + w >= m["width"]  # every column in view
    assert m["width"] > 2 * 300  # wrapped: MobileNet's one column is about 300 px wide
    slack = 8  # the overview's drawing: its boxes' strokes and arrowheads
    assert m["overview"][0] - slack <= m["whole"][0] and m["whole"][2] <= m["overview"][2] + slack
    assert m["overview"][1] - slack <= m["whole"][1] and m["whole"][3] <= m["overview"][3] + slack
    assert m["whole"][1] - 1 <= m["frame"][1] < m["frame"][3] <= m["whole"][3] + 1
    nodes = {n["name"]: n for n in m["nodes"]}
    casts = {graph["nodes"][i]["name"] for i in report.parameter_casts(graph, hidden)}
    drawn = {n["name"] for n in graph["nodes"] if n["name"] not in hidden}
    assert len(casts) == 53 and set(nodes) == drawn - casts
    assert m["withCasts"] == [1, len(drawn)]
    # Ticked, the picture with the casts wraps too (with dot it was one
    # column 1309 x 9426 px, 1:1 wider than the view): at 1:1 every column in
    # view, and it is cut into columns, with edges running on between them.
    full = m["casts"]
    x, y, w, h = full["viewBox"]
    assert w == pytest.approx(full["svg"][2] - full["svg"][0], abs=1)
    assert x <= 0 and x + w >= full["width"] and full["width"] <= report.WRAP_PX
    assert full["continued"] >= 1 and full["height"] < 9426 * 2 / 3
    prefix = "mobilenetv20_features_"
    for name, n in nodes.items():
        right_end = n["badge"][0] if n["badge"] else n["box"][2]
        assert n["box"][0] < n["text"][0] and n["text"][2] < right_end, name
        assert n["text"][3] - n["text"][1] >= 11, name  # 11 px text: readable
        head, cut, tail = n["label"].partition("\u2026")
        whole = re.sub(r"_amp_cast_b?float(16|32)$", "", name.removeprefix(prefix))
        assert (head + tail == whole) if not cut else (
            whole.startswith(head) and whole.endswith(tail) and len(tail) >= 20), name
    assert "mobilenetv20_features_linearbottleneck10_conv0_fwd" in nodes
    assert nodes["mobilenetv20_features_linearbottleneck10_conv0_fwd"]["label"] == \
        "linearbottleneck10_conv0_fwd"
    labels = [(n["label"], n["second"]) for n in nodes.values()]  # a cast: "amp_cast to .."
    assert len(set(labels)) == len(labels)
    shot = tmp_path / "graph.png"
    scrolled = tmp_path / "scrolled.html"  # the page from its graph down, as the link shows it
    scrolled.write_text(path.read_text().replace(
        "<h2>Graph</h2>", "<h2>Graph</h2><style>h1,h2,h1~table,h1~p{display:none}</style>", 1))
    _chromium("--window-size=1400,900", "--virtual-time-budget=5000", f"--screenshot={shot}",
              f"file://{scrolled}")
    from PIL import Image
    colours = {c for _, c in Image.open(shot).convert("RGB").getcolors(1 << 20)}
    bfloat16 = tuple(int(PRECISION_COLOURS["bfloat16"][i:i + 2], 16) for i in (1, 3, 5))
    assert bfloat16 in colours and (214, 39, 40) in colours  # boxes; the overview's frame


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
def test_filter_words_match_whole_words_in_chromium(tmp_path):
    """"float16" shows float16's rows, not bfloat16's; a word matches where a
    word of the row starts ("conv" finds "conv0_fwd" and "Convolution")."""
    rows = [("conv0_fwd", "Convolution", "float16"), ("conv1_fwd", "Convolution", "bfloat16"),
            ("relu0_fwd", "Activation", "float32"), ("fc_fwd", "FullyConnected", "bfloat16")]
    words = ["float16", "bfloat16", "float", "conv", "onv", "relu0_fwd float32"]
    typing = ("<script>window.addEventListener('load',function(){var found={},"
              "box=document.querySelector('.filter');"
              f"{json.dumps(words)}.forEach(function(w){{box.value=w;"
              "box.dispatchEvent(new Event('input'));found[w]=[].filter.call("
              "document.querySelectorAll('tbody tr'),function(r){return r.style.display!=='none';})"
              ".map(function(r){return r.cells[0].textContent;});});"
              "var pre=document.createElement('pre');pre.id='found';"
              "pre.textContent=JSON.stringify(found);document.body.appendChild(pre);});</script>")
    page = tmp_path / "filter.html"
    page.write_text(report._page("filter", [("rows", report.html_table(
        ("node", "op", "precision"), rows, sortable=True))]).replace("</body>", typing + "</body>"))
    dom = _chromium("--virtual-time-budget=3000", "--dump-dom", f"file://{page}").stdout
    found = json.loads(html.unescape(re.search(r'<pre id="found">(.*?)</pre>', dom).group(1)))
    assert found == {"float16": ["conv0_fwd"], "bfloat16": ["conv1_fwd", "fc_fwd"],
                     "float": ["conv0_fwd", "relu0_fwd"], "conv": ["conv0_fwd", "conv1_fwd"],
                     "onv": [], "relu0_fwd float32": ["relu0_fwd"]}


def _mxamp(*args):
    """`python -m mxamp ARGS` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "mxamp", *map(str, args)], text=True,
                          capture_output=True, timeout=600)


def test_quantize_and_optimize_write_the_int8_report(tmp_path):
    """`mxamp quantize` writes OUT.html / OUT.json beside OUT's model files
    (refused like them when they exist); `mxamp optimize --report DIR`
    writes its INT8 candidate's int8.html / int8.json in DIR."""
    prefix = tmp_path / "tiny"
    tiny_net(SHAPES["data"]).export(str(prefix))
    np.save(tmp_path / "x.npy", np.random.RandomState(0).uniform(size=(8, 3, 8, 8)))
    quantize = ("quantize", prefix, "--calib", tmp_path / "x.npy", "--calib-mode", "naive",
                "--out", tmp_path / "q")
    done = _mxamp(*quantize, "--json")
    assert done.returncode == 0, done.stderr
    out = str(tmp_path / "q")
    assert json.loads(done.stdout)["files"] == [f"{out}-symbol.json", f"{out}-0000.params",
                                                f"{out}.json", f"{out}.html"]
    assert listing(tmp_path) == [".q.mxamp", "q-0000.params", "q-symbol.json", "q.html", "q.json",
                                 "tiny-0000.params", "tiny-symbol.json", "x.npy"]
    rows = {r["name"]: r for r in json.loads((tmp_path / "q.json").read_text())["operators"]}
    assert [rows[n]["precision"] for n in OPS] == ["int8"] * 5
    page = (tmp_path / "q.html").read_text()
    assert "<title>mxamp INT8: q</title>" in page
    assert page.count('class="node"') == 1 + 5  # data, the operators
    for f in ("q-symbol.json", "q-0000.params"):  # the report alone stops a second run
        os.remove(tmp_path / f)
    again = _mxamp(*quantize)
    assert again.returncode == 1 and f"{out}.json exists; pass --overwrite" in again.stderr
    assert "report: " + f"{out}.html" in _mxamp(*quantize, "--overwrite").stdout

    measured = _mxamp("optimize", prefix, "--calib", tmp_path / "x.npy", "--runs", "1",
                      "--report", tmp_path / "r")
    assert measured.returncode == 0, measured.stderr
    assert f"report: {tmp_path / 'r' / 'int8.html'}" in measured.stderr
    assert listing(tmp_path / "r") == [".int8.mxamp", "int8.html", "int8.json"]
    assert "<title>mxamp INT8: " in (tmp_path / "r" / "int8.html").read_text()


def test_write_text_refuses_a_directory(tmp_path):
    """A report path that is a directory: a clear error, no int8.html.tmpPID
    left in it or beside it."""
    (tmp_path / "int8.html").mkdir()
    with pytest.raises(IsADirectoryError, match=r"cannot write .*int8.html: it is a directory"):
        report.write_text(str(tmp_path / "int8.html"), "<html>")
    assert os.listdir(tmp_path) == ["int8.html"] and not os.listdir(tmp_path / "int8.html")


def test_a_report_over_a_directory_is_refused_and_leaves_nothing(tmp_path):
    """A report path that is a directory: one error naming it, and neither
    the directory nor a temporary file beside it changed."""
    target = tmp_path / "r.html"
    target.mkdir()
    with pytest.raises(IsADirectoryError, match=f"cannot write {target}: it is a directory"):
        report.write_text(str(target), "<html></html>")
    assert sorted(os.listdir(tmp_path)) == ["r.html"] and os.listdir(target) == []


def test_a_failed_report_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full(path, text):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(report.os, "replace", full)
    with pytest.raises(OSError, match="No space left"):
        report.write_text(str(tmp_path / "r.html"), "<html></html>")
    assert os.listdir(tmp_path) == []
