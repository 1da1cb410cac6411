"""The `mxamp` command line end to end, on real exported files in a temporary
directory: convert, inspect and zoo (serially, in worker processes and on a
Dask LocalCluster), the reports they write, and every bad-input case (one
line on stderr, non-zero exit, nothing written).

The tiny model is Convolution -> BatchNorm -> relu -> pooling -> Dense; for
any device all five operators run in the low-precision dtype. Numerics:
relative L2 error against float32 within bfloat16 3e-2, float16 1e-2.
"""
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner
from gluoncv.model_zoo import model_store

import mxamp
from mxamp import cpu
from mxamp.tools import zoo
from mxamp.tools.checkpoint import save_checkpoint
from mxamp.verify import after_selection
from mxamp.tools.cli import main
from published import listing
from mxamp.verify import relative_error, run_emulated

TOL = {"bfloat16": 3e-2, "float16": 1e-2}
SHAPE = ["--shape", "data:1,3,8,8"]
OPS = ["conv0_fwd", "batchnorm0_fwd", "relu0_fwd", "pool0_fwd", "dense0_fwd"]
TWO_MODELS = ["cifar_resnet20_v1", "squeezenet1.1"]
# How bfloat16 zoo conversions are verified on this CPU (they hold only ops
# MXNet has bfloat16 kernels for wherever it has any).
VERIFIED = "native" if cpu.mxnet_has_bfloat16() else "emulated"


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def float32_outputs(prefix, x):
    sym, args, aux = mx.model.load_checkpoint(prefix, 0)
    return run_emulated(sym, args, aux, {"data": x})[0]


def test_convert_writes_a_reloadable_pair(tiny, tmp_path, dtype):
    out = tmp_path / "out"
    result = run("convert", tiny, "--dtype", dtype, *SHAPE, "--out", out)
    assert result.exit_code == 0, result.stderr
    sym, args, aux = mx.model.load_checkpoint(str(out), 0)
    assert mxamp.summarize(sym) == {f"amp_cast:{dtype}": 5, "amp_cast:float32": 1}
    assert {a.dtype for a in {**args, **aux}.values()} == {np.float32}
    x = mx.nd.random.uniform(shape=(1, 3, 8, 8))
    got = run_emulated(sym, args, aux, {"data": x})[0]
    assert relative_error(got, float32_outputs(tiny, x)) < TOL[dtype]
    lines = result.stdout.splitlines()
    assert lines[1] == f"operators: {dtype} 5"
    assert lines[2] == f"casts: amp_cast:{dtype} 5, amp_cast:float32 1"
    assert lines[3] == "parameters: 1.1 KiB float32 -> 1.1 KiB (stored float32, cast when " \
                       "read, as MXNet's AMP does; --cast-optional-params stores them in the " \
                       "low dtype where every reader takes them so)"
    error = float(re.search(r"output 0 (\S+)", lines[4]).group(1))
    assert 0 < error < TOL[dtype]
    assert listing(tmp_path) == [".out.mxamp", "out-0000.params", "out-symbol.json"]


def test_convert_options(tiny, tmp_path):
    """--cast-optional-params stores the weights in bfloat16 (one runtime cast
    left: the data's); --no-keep-io-types declares the input bfloat16."""
    out = tmp_path / "out"
    result = run("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out", out,
                 "--cast-optional-params", "--no-keep-io-types")
    assert result.exit_code == 0, result.stderr
    sym, args, aux = mx.model.load_checkpoint(str(out), 0)
    assert mxamp.summarize(sym) == {}
    assert sym.attr_dict()["data"]["__dtype__"] == "12"
    assert args["conv0_weight"].dtype == args["dense0_weight"].dtype != np.float32
    assert "parameters: 1.1 KiB float32 -> 648 B" in result.stdout


def test_convert_exclude_and_fp32_op(tiny, tmp_path):
    out = tmp_path / "out"
    assert run("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out", out, "--exclude",
               "conv0_fwd", "--fp32-op", "FullyConnected").exit_code == 0
    result = run("inspect", out, "--exclude", "conv0_fwd", "--fp32-op", "FullyConnected",
                 "--out", tmp_path / "report")
    rows = {r["name"]: (r["precision"], r["reason"]) for r in
            json.loads((tmp_path / "report" / "inspect.json").read_text())["operators"]}
    assert rows["conv0_fwd"] == ("float32", "excluded by name")
    assert rows["dense0_fwd"] == ("float32", "--fp32-op")
    assert rows["relu0_fwd"] == ("float32", "runs in its input's dtype")
    assert re.search(r"^dense0_fwd +FullyConnected +float32 +--fp32-op$", result.stdout, re.M)


def test_inspect_float32_model_and_report(tiny, tmp_path):
    report = tmp_path / "report"
    result = run("inspect", tiny, "--dtype", "float16", "--out", report)
    assert result.exit_code == 0, result.stderr
    summary = json.loads((report / "inspect.json").read_text())
    assert summary["dtype"] == "float16" and not summary["was_converted"]
    assert [(r["name"], r["precision"]) for r in summary["operators"]] == \
        [(op, "float16") for op in OPS]
    assert summary["casts"] == {"amp_cast:float16": 5, "amp_cast:float32": 1}
    assert summary["param_bytes"] == {"float32": 4 * 292, "converted": 4 * 292}
    md = (report / "inspect.md").read_text()
    assert "| conv0_fwd | Convolution | float16 | low-precision list |" in md
    assert "| batchnorm0_fwd | BatchNorm | float16 | runs in its input's dtype |" in md
    page = (report / "inspect.html").read_text()
    # the graph twice, its parameter casts folded (8 boxes: the data input, 2 casts, 5
    # float16 operators) and whole (12: 4 more casts); tests/tools/test_report.py
    assert page.count('<g class="node"') == 8 + 12 and page.count('fill="#6baed6"') == 2 * 5
    assert "data-node='dense0_fwd'>dense0_<wbr>fwd</a></td><td>FullyConnected</td>" in page
    assert sorted(os.listdir(report)) == ["inspect.html", "inspect.json", "inspect.md"]
    assert sorted(os.listdir(tmp_path)) == ["report"]


def test_inspect_converted_model_for_this_cpu(tiny, tmp_path):
    """A model converted for any device, inspected with --ctx cpu: its own
    dtype is read off its casts, and where this CPU's probe would have kept
    an op in float32 the table says the file runs it in low precision."""
    out = tmp_path / "out"
    run("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out", out)
    result = run("inspect", out, "--ctx", "cpu")
    assert result.exit_code == 0
    assert f"{out} (converted) -> bfloat16" in result.stdout
    conv = next(line for line in result.stdout.splitlines() if line.startswith("conv0_fwd"))
    assert conv.split()[2] == "bfloat16"
    has_kernel = mxamp.convert.probe.has_kernel(
        "Convolution", (("kernel", "(3, 3)"), ("layout", "NCHW"), ("num_filter", "8"),
                        ("pad", "(1, 1)")), (-1, -1, -1), "bfloat16", mx.cpu())
    assert ("converted with other options" in conv) == (has_kernel is False)


@pytest.fixture(scope="module")
def serial_zoo(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo") / "out"
    return out, run("zoo", *TWO_MODELS, "--dtype", "bfloat16", "--out", out)


@pytest.mark.cpu
def test_zoo_converts_and_reports(serial_zoo):
    out, result = serial_zoo
    assert result.exit_code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert (report["models"], report["converted"], report["failed"]) == (2, 2, 0)
    assert report["cpu"] == cpu.describe() and f"CPU: {cpu.describe()}." in \
        (out / "report.md").read_text()
    for r in report["results"]:
        assert r["status"] == "ok" and r["weights"] == "random" and r["verified"] == VERIFIED
        assert 0 < r["max_error"] < TOL["bfloat16"] and r["reload_error"] == 0
        assert r["casts"]["amp_cast:bfloat16"] > 0
        assert r["files"] == [f"{r['model']}-bfloat16-0000.params",
                              f"{r['model']}-bfloat16-symbol.json"]
        sym, args, aux = mx.model.load_checkpoint(str(out / f"{r['model']}-bfloat16"), 0)
        assert mxamp.summarize(sym) == r["casts"]
    assert [r["model"] for r in report["results"]] == TWO_MODELS
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for model in TWO_MODELS:
        assert f"| {model} | bfloat16 | random | ok |" in md
        assert f"<tr><td>{model}</td><td>bfloat16</td><td>random</td><td>ok</td>" in html
        assert re.search(rf"^{re.escape(model)} +bfloat16 +random +ok ", result.stdout, re.M)
    # the index: two charts, no graph; a page per model has its graph
    assert html.count("<svg") == 2 and '<g class="node"' not in html
    for model in TWO_MODELS:
        assert f"<a href='{model}-bfloat16.html'>" in html
        assert '<g class="node"' in (out / f"{model}-bfloat16.html").read_text()
    assert "weights: random" in result.stdout


def test_zoo_model_page_has_a_graph_picture(tmp_path):
    out = tmp_path / "out"
    result = run("zoo", "cifar_resnet20_v1", "--dtype", "float16", "--shape", "1,3,16,16",
                 "--out", out)
    assert result.exit_code == 0, result.stderr
    r = json.loads((out / "report.json").read_text())["results"][0]
    assert r["input_shape"] == [1, 3, 16, 16]
    page = (out / "cifar_resnet20_v1-float16.html").read_text()
    # float16 boxes, in the folded and the whole picture of the graph
    assert page.count('fill="#6baed6"') == 2 * r["ops_by_precision"]["float16"]
    # the graph twice, its overview and the per-layer error chart
    assert page.count("<svg") == 4


def test_zoo_float32_failure_is_listed_not_failed(tmp_path):
    """squeezenet1.1 pools 13x13 at the end: at 32x32 its float32 forward
    fails. The batch goes on and the exit status stays 0."""
    out = tmp_path / "out"
    result = run("zoo", *TWO_MODELS, "--dtype", "bfloat16", "--shape", "1,3,32,32",
                 "--out", out)
    assert result.exit_code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert (report["converted"], report["failed"], report["float32_failed"]) == (1, 0, 1)
    failed = report["results"][1]
    assert failed["model"] == "squeezenet1.1" and failed["failed_in"] == "float32"
    assert "kernel size (13) exceeds input (1 padded to 1)" in failed["error"]
    assert "squeezenet1.1 (bfloat16) failed in float32: ValueError: Deferred initialization " \
        "failed" in result.stdout
    assert "| squeezenet1.1 (bfloat16, float32) |" in (out / "report.md").read_text()


@pytest.mark.cpu
def test_zoo_builds_tsn_networks_offline():
    """GluonCV's TSN builders call reset_ctx on parameters that
    pretrained_base=False leaves uninitialized (MXNet 1.9.1 refuses); the
    zoo's offline build lets them, then initializes the network."""
    with pytest.raises(ValueError, match="Cannot reset context"):
        zoo.model_zoo.get_model("inceptionv1_kinetics400", pretrained_base=False)
    results = zoo.run_model("inceptionv1_kinetics400", ["bfloat16"])  # at 224x224
    assert [(r["status"], r["verified"]) for r in results] == [("ok", VERIFIED)]
    assert results[0]["max_error"] < 2e-2 and results[0]["reload_error"] == 0
    with pytest.raises(ValueError, match="Cannot reset context"):  # restored afterwards
        zoo.model_zoo.get_model("inceptionv1_kinetics400", pretrained_base=False)


@pytest.mark.parametrize("name, frames", [("slowfast_4x16_resnet50_kinetics400", 36),
                                          ("slowfast_8x8_resnet50_kinetics400", 40),
                                          ("c3d_kinetics400", 16), ("p3d_resnet50_kinetics400", 16),
                                          ("i3d_resnet50_v1_kinetics400", 8)])
def test_zoo_clip_lengths(name, frames):
    assert zoo.input_shape(name) == (1, 3, frames, 112, 112)


def test_zoo_conversion_failure_sets_exit_status(tmp_path, monkeypatch):
    real = zoo.convert_model_with

    def fails_for_squeezenet(sym, *args, **kwargs):
        if "squeezenet" in sym.list_outputs()[0]:
            raise RuntimeError("mxamp's graph pass failed: simulated")
        return real(sym, *args, **kwargs)

    monkeypatch.setattr(zoo, "convert_model_with", fails_for_squeezenet)
    out = tmp_path / "out"
    result = run("zoo", *TWO_MODELS, "--dtype", "bfloat16", "--out", out)
    assert result.exit_code == 1
    report = json.loads((out / "report.json").read_text())
    assert (report["converted"], report["failed"]) == (1, 1)
    assert report["results"][1]["failed_in"] == "conversion"
    assert report["results"][1]["error"] == "RuntimeError: mxamp's graph pass failed: simulated"


def test_zoo_uses_cached_weights(tmp_path, monkeypatch):
    """Weights in the GluonCV cache (hash checked) are used instead of random ones."""
    net = zoo._get_model("cifar_resnet20_v1", pretrained=False)
    net.initialize(mx.init.Normal(0.5))
    net(mx.nd.zeros((1, 3, 32, 32)))
    saved = tmp_path / "w.params"
    net.save_parameters(str(saved))
    sha1 = hashlib.sha1(saved.read_bytes()).hexdigest()
    monkeypatch.setitem(model_store._model_sha1, "cifar_resnet20_v1", sha1)
    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "home"))
    os.makedirs(tmp_path / "home" / "models")
    cached = tmp_path / "home" / "models" / f"cifar_resnet20_v1-{sha1[:8]}.params"
    shutil.copy(saved, cached)
    out = tmp_path / "out"
    assert run("zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--out", out).exit_code == 0
    r = json.loads((out / "report.json").read_text())["results"][0]
    assert r["weights"] == f"pretrained ({cached})"
    _, args, _ = mx.model.load_checkpoint(str(out / "cifar_resnet20_v1-bfloat16"), 0)
    def unprefixed(params):  # the network's name prefix differs per instance
        return {n.split("_", 1)[1]: p for n, p in params.items()}

    original = unprefixed({p.name: p.data() for p in net.collect_params().values()})
    args = unprefixed(args)
    assert len(args) == 65 and all(np.array_equal(args[n].asnumpy(), original[n].asnumpy())
                                   for n in args)


def _results(out):
    return {(r["model"], r["dtype"]): r["max_error"]
            for r in json.loads((out / "report.json").read_text())["results"]}


def test_zoo_worker_processes_match_serial(serial_zoo, tmp_path):
    out = tmp_path / "out"
    result = run("zoo", *TWO_MODELS, "--dtype", "bfloat16", "--workers", 2, "--out", out)
    assert result.exit_code == 0, result.stderr
    # The same error figures; a worker process may split float32 sums over
    # threads differently (seen: 3.7e-5 relative on an error of 2.6e-3).
    assert _results(out) == pytest.approx(_results(serial_zoo[0]), rel=1e-4)


def test_zoo_workers_stop_the_batch_where_a_network_runs_out_of_memory(monkeypatch):
    """As in one process, the error ends the batch: the networks no worker
    has started are cancelled, not converted after it. Threads stand in for
    the spawned workers (the same concurrent.futures pool API): "a" runs out
    of memory while "b" holds the other worker until the batch has stopped."""
    from mxamp.errors import OutOfMemory
    started, stopped = [], threading.Event()

    def run_model(name, *task):
        started.append(name)
        if name == "a":
            raise OutOfMemory("out of memory while building a")
        stopped.wait(60)
        return [{"model": name}]

    class Pool(concurrent.futures.ThreadPoolExecutor):
        def __init__(self, workers, **spawning):
            super().__init__(workers)

        def shutdown(self, wait=True, *, cancel_futures=False):
            super().shutdown(wait=False, cancel_futures=cancel_futures)
            stopped.set()
            super().shutdown(wait=wait)

    monkeypatch.setattr(zoo, "run_model", run_model)
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Pool)
    with pytest.raises(OutOfMemory, match="^out of memory while building a$"):
        list(zoo.run_batch(["b", "a", "c", "d", "e", "f"], ["float16"], workers=2))
    # the worker that ran "a" may have taken "c" before the batch stopped
    assert {"a", "b"} <= set(started) <= {"a", "b", "c"}


def test_zoo_on_dask_cluster(serial_zoo, tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        out = tmp_path / "out"
        result = run("zoo", *TWO_MODELS, "--dtype", "bfloat16", "--scheduler",
                     cluster.scheduler_address, "--out", out)
    assert result.exit_code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["scheduler"] == cluster.scheduler_address
    # The same error figures; a worker process may split float32 sums over
    # threads differently (seen: 3.7e-5 relative on an error of 2.6e-3).
    assert _results(out) == pytest.approx(_results(serial_zoo[0]), rel=1e-4)
    assert sorted(os.listdir(out)) == sorted(
        [f"{m}-bfloat16{s}" for m in TWO_MODELS for s in ("-0000.params", "-symbol.json", ".html")]
        + ["report.html", "report.json", "report.md"])


def test_python_m_mxamp_subprocess(tiny, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(mxamp.__file__))}
    out = tmp_path / "sub"
    done = subprocess.run([sys.executable, "-m", "mxamp", "convert", tiny, "--dtype",
                           "bfloat16", *SHAPE, "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (f"converted {tiny} to bfloat16 (for any device): "
                                           f"{out}-symbol.json, {out}-0000.params")
    done = subprocess.run([sys.executable, "-m", "mxamp", "convert", str(tmp_path / "nope"),
                           "--dtype", "bfloat16"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 1
    assert done.stderr == f"Error: file not found: {tmp_path / 'nope'}-symbol.json\n"


# ---- bad input: (files to write, arguments, message) --------------------------------------

def _copy(tiny, dst):
    for suffix in ("-symbol.json", "-0000.params"):
        shutil.copy(tiny + suffix, f"{dst}{suffix}")


def _params_without(tiny, dst, name, replace=None):
    _copy(tiny, dst)
    saved = mx.nd.load(f"{dst}-0000.params")
    del saved[f"arg:{name}"]
    if replace is not None:
        saved[f"arg:{name}"] = replace
    mx.nd.save(f"{dst}-0000.params", saved)


def _truncate(tiny, dst):
    _copy(tiny, dst)
    data = open(f"{dst}-0000.params", "rb").read()
    open(f"{dst}-0000.params", "wb").write(data[:len(data) // 2])


def _directory_params(tiny, dst):
    shutil.copy(tiny + "-symbol.json", f"{dst}-symbol.json")
    os.mkdir(f"{dst}-0000.params")


def _empty_graph(tiny, dst):
    mx.sym.var("data").save(f"{dst}-symbol.json")
    mx.nd.save(f"{dst}-0000.params", {})


def _converted(tiny, dst):
    save_checkpoint(dst, *mxamp.convert_model(*mx.model.load_checkpoint(tiny, 0),
                                              target_dtype="bfloat16"))


BAD = {
    "missing file": (None, ["convert", "{m}", "--dtype", "bfloat16"],
                     "file not found: {m}-symbol.json"),
    "unreadable (a directory)": (_directory_params, ["convert", "{m}", "--dtype", "bfloat16"],
                                 "cannot read {m}-0000.params: Is a directory"),
    "malformed symbol": (lambda t, d: (_copy(t, d), open(f"{d}-symbol.json", "w").write("{oops")),
                         ["convert", "{m}", "--dtype", "bfloat16", *SHAPE],
                         "{m}-symbol.json is not a symbol file: it is not JSON (Expecting "
                         "property name"),
    "truncated params": (_truncate, ["convert", "{m}", "--dtype", "bfloat16", *SHAPE],
                         "{m}-0000.params is not an MXNet params file (truncated or corrupt?)"),
    "gluon params file": (lambda t, d: (_copy(t, d), mx.nd.save(
        f"{d}-0000.params", {"w": mx.nd.ones(1)})), ["convert", "{m}", "--dtype", "bfloat16"],
        "{m}-0000.params has parameter names without 'arg:'/'aux:' prefixes"),
    "missing parameter": (lambda t, d: _params_without(t, d, "dense0_weight"),
                          ["convert", "{m}", "--dtype", "bfloat16", *SHAPE],
                          "no parameter in {m}-0000.params and no --shape for the inputs "
                          "['dense0_weight']"),
    "parameter of wrong shape": (lambda t, d: _params_without(t, d, "dense0_weight",
                                                              mx.nd.ones((4, 9))),
                                 ["convert", "{m}", "--dtype", "bfloat16", *SHAPE],
                                 "parameter 'dense0_weight' has shape (4, 9) in "
                                 "{m}-0000.params, but the graph needs (4, 8) for the data shapes of --shape"),
    "shape that does not parse": (_copy, ["convert", "{m}", "--dtype", "bfloat16", "--shape",
                                          "data:1,x,8"],
                                  "Invalid value for '--shape': 'data:1,x,8' is not "
                                  "NAME:D1,D2,..."),
    "shape over 2^31 elements": (_copy, ["convert", "{m}", "--dtype", "bfloat16", "--shape",
                                         "data:1,3,65536,65536"],
                                 "Invalid value for '--shape': 'data:1,3,65536,65536' has "
                                 "12884901888 elements; this MXNet build holds at most "
                                 "2147483647 in one array (built without INT64_TENSOR_SIZE)"),
    "zoo shape over 2^31 elements": (None, ["zoo", "cifar_resnet20_v1", "--dtype", "bfloat16",
                                            "--shape", "1,3,65536,65536", "--out", "{m}"],
                                     "Invalid value for '--shape': '1,3,65536,65536' has "
                                     "12884901888 elements"),
    "shape of an unknown input": (_copy, ["convert", "{m}", "--dtype", "bfloat16", "--shape",
                                          "image:1,3,8,8"],
                                  "--shape names ['image'], which are not inputs"),
    "shape that does not fit": (_copy, ["convert", "{m}", "--dtype", "bfloat16", "--shape",
                                        "data:1,5,8,8"],
                                "parameter 'conv0_weight' has shape (8, 3, 3, 3) in "
                                "{m}-0000.params, but the graph needs (8, 5, 3, 3) for the data shapes of "
                                "--shape"),
    "no shape for the data input": (_copy, ["convert", "{m}", "--dtype", "bfloat16"],
                                    "no --shape for the inputs ['data']"),
    "wrong dtype": (_copy, ["convert", "{m}", "--dtype", "float8", *SHAPE],
                    "Invalid value for '--dtype': 'float8' is not a dtype mxamp converts to: "
                    "float16 (fp16, half) or bfloat16 (bf16); did you mean 'float16'?"),
    "unknown operator": (_copy, ["convert", "{m}", "--dtype", "float16", *SHAPE, "--fp32-op",
                                 "Convolutoin"],
                         "--fp32-op names operators MXNet does not know: 'Convolutoin' (did "
                         "you mean 'Convolution' or 'Convolution_v1' or 'Deconvolution'?)"),
    "already converted": (_converted, ["convert", "{m}", "--dtype", "bfloat16", *SHAPE],
                          "the model is already converted"),
    "epoch without params": (_copy, ["convert", "{m}", "--dtype", "bfloat16", "--epoch", "3"],
                             "file not found: {m}-0003.params"),
    "empty graph": (_empty_graph, ["convert", "{m}", "--dtype", "bfloat16", *SHAPE],
                    "the symbol has no operators, only the inputs ['data']"),
    "output exists": (lambda t, d: (_copy(t, d), _copy(t, f"{d}-bfloat16")),
                      ["convert", "{m}", "--dtype", "bfloat16", *SHAPE],
                      "{m}-bfloat16-symbol.json exists; pass --overwrite to replace it"),
    "inspect missing file": (None, ["inspect", "{m}"], "file not found: {m}-symbol.json"),
    "unknown model": (None, ["zoo", "resnet50_v9", "--dtype", "bfloat16", "--out", "{m}"],
                      "unknown model 'resnet50_v9'; did you mean resnet50_v2, resnet50_v1, "
                      "resnet50_v1s?"),
    "zoo output exists": (lambda t, d: os.mkdir(d),
                          ["zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--out", "{m}"],
                          "{m} exists; pass --overwrite to replace it"),
    "missing dtype": (_copy, ["convert", "{m}", *SHAPE],
                      "Missing option '--dtype'. Choose from: float16, bfloat16"),
    "zoo without --out": (None, ["zoo", "cifar_resnet20_v1", "--dtype", "bfloat16"],
                          "--dtype and --out are required (unless --list)"),
    "zoo without a selection": (None, ["zoo", "--dtype", "bfloat16", "--out", "{m}"],
                                "give MODEL names, --family or --all (one of them)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case, tiny, tmp_path):
    prepare, args, message = BAD[case]
    model = str(tmp_path / "m")
    if prepare:
        prepare(tiny, model)
    before = sorted(os.listdir(tmp_path))
    result = run(*[a.format(m=model) for a in args])
    assert result.exit_code != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert message.format(m=model) in lines[0]
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temporary left


def test_overwrite_replaces_output(tiny, tmp_path):
    out = tmp_path / "out"
    for _ in range(2):
        result = run("convert", tiny, "--dtype", "float16", *SHAPE, "--out", out, "--overwrite")
        assert result.exit_code == 0
    assert listing(tmp_path) == [".out.mxamp", "out-0000.params", "out-symbol.json"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file(tiny, tmp_path):
    model = str(tmp_path / "m")
    _copy(tiny, model)
    os.chmod(f"{model}-symbol.json", 0)
    result = run("convert", model, "--dtype", "bfloat16", *SHAPE)
    assert result.exit_code == 1
    assert result.stderr == f"Error: cannot read {model}-symbol.json: Permission denied\n"


def test_zoo_overwrite_replaces_the_directory(tmp_path):
    out = tmp_path / "out"
    args = ["zoo", "cifar_resnet20_v1", "--shape", "1,3,16,16", "--out", out, "--overwrite"]
    assert run(*args, "--dtype", "float16").exit_code == 0
    assert run(*args, "--dtype", "bfloat16").exit_code == 0
    assert json.loads((out / "report.json").read_text())["dtype"] == "bfloat16"
    assert not any("float16" in f.replace("bfloat16", "") for f in os.listdir(out))
    assert os.listdir(tmp_path) == ["out"]  # no staging or old copy left


# ---- concurrent runs into one output: one wins, nothing mixed, nothing left over ---------

def _race(*commands):
    """Runs the mxamp commands at once in separate processes; [(exit status,
    stdout, stderr)]."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(mxamp.__file__))}
    runs = [subprocess.Popen([sys.executable, "-m", "mxamp", *map(str, c)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for c in commands]
    return [(r.returncode, *r.communicate(timeout=600)) for r in runs if r.wait(timeout=600) or 1]


def _winner_and_loser(results, existing):
    assert sorted(code for code, _, _ in results) == [0, 1], results
    (_, stdout, _), = [r for r in results if r[0] == 0]
    (_, _, stderr), = [r for r in results if r[0] == 1]
    # Nothing else: no MXNet C++ log line ("[hh:mm:ss] ...cc:NN: ...") either.
    assert stderr.splitlines() == [f"Error: {existing} exists; pass --overwrite to replace it"]
    return stdout


def _pair_dtype(out):
    """The dtype of a converted pair, checked to be the same in the symbol
    (its casts) and the parameters (stored in low precision)."""
    sym, args, _ = mx.model.load_checkpoint(str(out), 0)
    dtype = "float16" if args["conv0_weight"].dtype == np.float16 else "bfloat16"
    assert f"amp_cast:{dtype}" in mxamp.summarize(sym)
    return dtype


def test_concurrent_converts_into_one_prefix(tiny, tmp_path):
    """Without --overwrite exactly one of two runs writes the pair (both
    exited 0 before, possibly leaving one's symbol beside the other's params)."""
    out = tmp_path / "out"
    results = _race(*[("convert", tiny, "--dtype", d, *SHAPE, "--out", out,
                       "--cast-optional-params") for d in ("float16", "bfloat16")])
    stdout = _winner_and_loser(results, f"{out}-symbol.json")
    assert stdout.startswith(f"converted {tiny} to {_pair_dtype(out)} ")
    assert listing(tmp_path) == [".out.mxamp", "out-0000.params", "out-symbol.json"]


def test_concurrent_overwriting_converts_write_one_pair(tiny, tmp_path):
    out = tmp_path / "out"
    results = _race(*[("convert", tiny, "--dtype", d, *SHAPE, "--out", out, "--overwrite",
                       "--cast-optional-params") for d in ("float16", "bfloat16")])
    assert [code for code, _, _ in results] == [0, 0], results
    _pair_dtype(out)
    assert listing(tmp_path) == [".out.mxamp", "out-0000.params", "out-symbol.json"]


def test_concurrent_reports_into_one_directory(tiny, tmp_path):
    """The losing run left its staging directory (rep.tmpPID) behind."""
    rep = tmp_path / "rep"
    _winner_and_loser(_race(("inspect", tiny, "--out", rep), ("inspect", tiny, "--out", rep)),
                      rep)
    assert os.listdir(tmp_path) == ["rep"]
    assert sorted(os.listdir(rep)) == ["inspect.html", "inspect.json", "inspect.md"]


def test_concurrent_zoo_runs_into_one_directory(tmp_path):
    out = tmp_path / "out"
    args = ("zoo", "cifar_resnet20_v1", "--dtype", "float16", "--shape", "1,3,16,16", "--out", out)
    _winner_and_loser(_race(args, args), out)
    assert os.listdir(tmp_path) == ["out"]
    assert json.loads((out / "report.json").read_text())["converted"] == 1


@pytest.mark.parametrize("slash", ["", "/"])
def test_overwriting_a_symlinked_directory_leaves_nothing_behind(tiny, tmp_path, slash):
    """The link is replaced by the new directory; what it pointed to stays
    (the renamed link, lnk.oldPID, was left behind)."""
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "keep").write_text("x")
    os.symlink(tmp_path / "target", tmp_path / "lnk")
    assert run("inspect", tiny, "--out", f"{tmp_path / 'lnk'}{slash}", "--overwrite").exit_code == 0
    assert sorted(os.listdir(tmp_path)) == ["lnk", "target"]
    assert not os.path.islink(tmp_path / "lnk") and (tmp_path / "lnk" / "inspect.json").exists()
    assert os.listdir(tmp_path / "target") == ["keep"]


def test_tensors_after_nms_are_marked():
    """A two-stage detector's second NMS reads tensors computed from the first
    NMS's selection: zoo's max_error leaves them out (see mxamp.zoo)."""
    first = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=6, name="fc1")
    boxes = mx.sym.contrib.box_nms(mx.sym.reshape(first, shape=(1, -1, 6), name="r1"),
                                   name="nms1")
    second = mx.sym.FullyConnected(boxes, num_hidden=6, name="fc2")
    out = mx.sym.contrib.box_nms(mx.sym.reshape(second, shape=(1, -1, 6), name="r2"),
                                 name="nms2")
    assert after_selection(out) == {"fc2", "r2", "nms2"}
