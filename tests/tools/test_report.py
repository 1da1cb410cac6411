"""Reports people read: the pages mxamp inspect / zoo / INT8 write.

Structure (everywhere): the graph picture holds every node by name with an
arrow per edge, laid out in layers by Graphviz's dot or mxamp's own layout;
the reasons table names the upstream node of "runs in its input's dtype";
FLOPs are exact; per-layer errors are measured against float32; the charts
are inline SVG. Rendering (where Debian's chromium is installed): ResNet-50's
page loads in headless Chromium, its script runs (find a node by name) and
a screenshot shows the graph's colours.
"""
import json
import os
import re
import shutil
import subprocess

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
    if request.param == "mxamp":
        monkeypatch.setattr(layout.shutil, "which", lambda _: None)
    return request.param


def _shown_edges(graph, hidden):
    nodes = graph["nodes"]
    return sum(1 for n in nodes if not (n["op"] == "null" and n["name"] in hidden)
               for e in n["inputs"] if nodes[e[0]]["name"] not in hidden)


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
    svg = re.search(r"<svg[^>]*data-layout=\"(\w+)\".*?</svg>", page, re.DOTALL)
    assert svg.group(1) == engine
    names = re.findall(r'<g class="node" data-name="([^"]+)"', svg.group(0))
    assert sorted(names) == sorted(n["name"] for n in graph["nodes"]
                                   if n["name"] not in hidden)
    assert len(names) == 12  # data, 6 casts, 5 operators
    assert svg.group(0).count('marker-end="url(#arrow)"') == _shown_edges(graph, hidden)
    assert svg.group(0).count(f'fill="{PRECISION_COLOURS["float16"]}"') == 5
    table = page[page.index("<table class=sortable>"):]
    assert table.count("<tr>") == 1 + 5  # heading + one row per operator
    assert ("<td>runs in its input's dtype</td><td><a href='#graph' class='node-link' "
            "data-node='conv0_fwd'>conv0_fwd</a></td>") in table
    assert page.count("<svg") == 2  # the graph and the per-layer error chart
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
    assert page.count('class="node"') == 12 and page.count("<svg") == 2
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
    assert page.count("<svg") == 3  # graph, calibration ranges, per-layer error
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
def test_resnet50_graph_is_drawn_to_scale(resnet50_page, engine):
    """The complaint: a 16036 x 8500 px picture of op types, every
    parameter cast at depth 0. Now every node is named in a picture a few
    boxes wide, boxes apart, each weight's cast in the row above its
    Convolution."""
    _, summary, graph, hidden = resnet50_page
    svg = report.graph_svg(graph, {r["name"]: r["precision"] for r in summary["operators"]},
                           hidden)
    assert f'data-layout="{engine}"' in svg
    assert float(re.search(r'data-width="([\d.]+)"', svg).group(1)) < 4000
    names = set(re.findall(r'<g class="node" data-name="([^"]+)"', svg))
    assert {r["name"] for r in summary["operators"]} <= names
    boxes = [tuple(map(float, b)) for b in re.findall(
        r'<rect x="([\d.-]+)" y="([\d.-]+)" width="([\d.]+)" height="([\d.]+)"', svg)]
    assert len(boxes) == len(names)
    assert not any(a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and
                   a[1] < b[1] + b[3] and b[1] < a[1] + a[3]
                   for i, a in enumerate(boxes) for b in boxes[i + 1:])
    y = {name: float(v) for name, v in re.findall(r'data-name="([^"]+)" data-x="[\d.-]+" '
                                                   r'data-y="([\d.-]+)"', svg)}
    rows = sorted(set(y.values()))
    conv = "resnetv10_stage4_conv2_fwd"
    assert rows.index(y[conv.replace("fwd", "weight_amp_cast_bfloat16")]) == \
        rows.index(y[conv]) - 1


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

