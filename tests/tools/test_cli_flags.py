"""The mxamp command line as users run it (a subprocess, or click's
CliRunner where only the output matters): -v / -q anywhere, --json, help
texts, shapes in tvmc / ovc spelling, --config policy files,
--cast-optional-params, exit statuses of batches that convert nothing,
MXNet's C++ log lines kept off the terminal, and `mxamp quantize`.

Tolerances: INT8 on the digits MLP: accuracy within 0.03 of float32 and
relative error of the scores under 5e-2 (measured ~1e-2)."""
import json
import os
import re
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from click.testing import CliRunner

import mxamp
from mxamp.tools import zoo
from mxamp.tools.cli import main
from mxamp.graph import graph_json
from mxamp.tools.inspection import precisions
from test_cli_first_hour import on_terminal

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "quantization"))
import digits  # noqa: E402 - tests/quantization/digits.py

MXNET_LOG = re.compile(r"^\[\d\d:\d\d:\d\d\] ", re.M)
SHAPE = ["--shape", "data:1,3,8,8"]
AVX2 = {"DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory):
    """Prefix of a model with data inputs `a` (1, 4) and `b` (1, 6)."""
    a, b = mx.sym.var("a"), mx.sym.var("b")
    out = mx.sym.FullyConnected(a, num_hidden=3, name="fa") + \
        mx.sym.FullyConnected(b, num_hidden=3, name="fb")
    rng = np.random.RandomState(0)
    args = {n: mx.nd.array(rng.uniform(size=s)) for n, s in
            (("fa_weight", (3, 4)), ("fa_bias", (3,)), ("fb_weight", (3, 6)), ("fb_bias", (3,)))}
    prefix = str(tmp_path_factory.mktemp("two") / "two")
    mx.model.save_checkpoint(prefix, 0, out, args, {})
    return prefix


def cli(*args, env=None, cwd=None):
    """Runs `python -m mxamp ARGS` as a user would; the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "mxamp", *map(str, args)], text=True,
                          capture_output=True, timeout=600, cwd=cwd,
                          env={**os.environ, **(env or {})})


def invoke(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


# ---- -v / -q, --json, help -----------------------------------------------------------

@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_and_quiet_anywhere(tiny, tmp_path, where):
    def run(flag, out):
        args = ["convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out", tmp_path / out]
        return cli(*([flag, *args] if where == "before" else [*args, flag]))
    loud, quiet = run("-v", "loud"), run("-q", "quiet")
    assert loud.returncode == quiet.returncode == 0
    # -v: the converter's decisions (logger mxamp at INFO)
    assert re.search(r"^INFO: mxamp\.\S+: ", loud.stderr, re.M), loud.stderr
    assert quiet.stderr == ""
    assert quiet.stdout.startswith(f"converted {tiny} to bfloat16")


def test_convert_json(tiny, tmp_path):
    result = invoke("convert", tiny, "--dtype", "float16", *SHAPE, "--out", tmp_path / "o",
                    "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["files"] == [f"{tmp_path / 'o'}-symbol.json", f"{tmp_path / 'o'}-0000.params"]
    assert data["operators"] == {"float16": 5}
    assert data["casts"] == {"amp_cast:float16": 5, "amp_cast:float32": 1}
    assert data["input_shapes"] == {"data": [1, 3, 8, 8]}
    assert data["verified"] == "emulated"  # no float16 Convolution on any CPU in MXNet 1.9.1
    assert data["finite"] is True and 0 < data["errors"][0] < 1e-2


def test_inspect_and_zoo_list_json(tiny, tmp_path):
    result = invoke("inspect", tiny, "--dtype", "bfloat16", "--json", "--out", tmp_path / "r")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)  # the report's path goes to stderr
    assert summary["ops_by_precision"] == {"bfloat16": 5}
    assert [o["name"] for o in summary["operators"]] == [
        "conv0_fwd", "batchnorm0_fwd", "relu0_fwd", "pool0_fwd", "dense0_fwd"]
    assert result.stderr == f"report: {tmp_path / 'r' / 'inspect.html'}\n"
    listed = invoke("zoo", "--family", "pose", "--list", "--json")
    assert json.loads(listed.stdout) == zoo.model_names("pose")


def test_help_has_examples_and_whole_summaries():
    top = invoke("--help").stdout
    summaries = re.findall(r"^  (convert|inspect|quantize|zoo) +(.*)$", top, re.M)
    assert [c for c, _ in summaries] == ["convert", "inspect", "quantize", "zoo"]
    assert all(s.endswith(".") and "..." not in s for _, s in summaries), summaries
    assert "mxamp zoo resnet50_v1 --dtype bfloat16 --out zoo_out" in top
    for command in ("convert", "inspect", "quantize", "zoo"):
        assert re.search(rf"Examples:\n +mxamp {command} ", invoke(command, "--help").stdout)


# ---- shapes ---------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", [
    ["--shape", "a:1,4", "--shape", "b:1,6"],
    ["--input-shapes", "a:[1,4] b:[1,6]"],
    ["--input", "a[1,4],b[1,6]"],
    ["--input", "a[1,4]", "--input-shapes", "b:[1, 6]"]])
def test_shapes_in_every_spelling(two_inputs, tmp_path, spelling):
    result = invoke("convert", two_inputs, "--dtype", "bfloat16", *spelling,
                    "--out", tmp_path / "o", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["input_shapes"] == {"a": [1, 4], "b": [1, 6]}


@pytest.mark.parametrize("spelling, message", [
    (["--input-shapes", "a:[1,4] b:1,6"], "'a:[1,4] b:1,6' is not a list of NAME[D1,D2,...]"
                                          " with positive integer dimensions (e.g. "
                                          "'data:[1,3,224,224] mask:[1,4]')"),
    (["--input", "a[1,0],b[1,6]"], "'a[1,0],b[1,6]' is not a list of NAME[D1,D2,...] with "
                                   "positive integer dimensions (e.g. "
                                   "'data[1,3,224,224],mask[1,4]')"),
    (["--input", "a[1,4]", "--shape", "a:1,4", "--shape", "b:1,6"],
     "the shape of 'a' is given twice")])
def test_bad_shapes(two_inputs, tmp_path, spelling, message):
    result = invoke("convert", two_inputs, "--dtype", "bfloat16", *spelling,
                    "--out", tmp_path / "o")
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())
    assert not os.listdir(tmp_path)


# ---- --config --------------------------------------------------------------------------

TOML = """
follow_ops = ["Activation"]
excluded_sym_names = ["batchnorm0_fwd"]
cast_optional_params = true

[[rules]]
op = "Convolution"
attrs = {num_filter = 8, kernel = "(3, 3)"}
category = "FP32"
priority = 1
"""


@pytest.mark.parametrize("kind", ["toml", "json"])
def test_config_file_policy(tiny, tmp_path, kind):
    config = tmp_path / f"policy.{kind}"
    config.write_text(TOML if kind == "toml" else json.dumps({
        "follow_ops": ["Activation"], "excluded_sym_names": ["batchnorm0_fwd"],
        "cast_optional_params": True,
        "rules": [{"op": "Convolution", "attrs": {"num_filter": 8, "kernel": "(3, 3)"},
                   "category": "FP32", "priority": 1}]}))
    result = invoke("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out", tmp_path / "o",
                    "--config", config)
    assert result.exit_code == 0, result.stderr
    model = mx.model.load_checkpoint(str(tmp_path / "o"), 0)
    # Convolution float32 by the rule, BatchNorm by name, relu as a FOLLOW op
    # of a float32 input, the pooling runs in its input's dtype; the dense
    # layer stays in bfloat16 with its parameters stored so
    assert [(n, p) for n, _, p in precisions(*model)] == [
        ("conv0_fwd", "float32"), ("batchnorm0_fwd", "float32"), ("relu0_fwd", "float32"),
        ("pool0_fwd", "float32"), ("dense0_fwd", "bfloat16")]
    assert {n for n, a in model[1].items() if a.dtype != np.float32} == {"dense0_weight",
                                                                         "dense0_bias"}


def test_config_errors(tiny, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('fp32_op = ["softmax"]\n')
    result = invoke("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out", tmp_path / "o",
                    "--config", bad)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {bad}: unknown keys ['fp32_op']; allowed: "
                                    "target_dtype_ops, fp32_ops,")
    listed = tmp_path / "listed.json"
    listed.write_text('{"fp32_ops": ["softmax"]}')
    result = invoke("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out", tmp_path / "o",
                    "--config", listed, "--fp32-op", "Pooling")
    assert result.exit_code == 2
    assert "--fp32-op and a --config that sets fp32_ops" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad.toml", "listed.json"]


# ---- zoo: cast-optional-params, exit statuses, the terminal -----------------------------

def test_zoo_cast_optional_params_shrinks_the_model(tmp_path):
    result = invoke("zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--out", tmp_path / "z",
                    "--cast-optional-params", "--json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    sizes = data["results"][0]["param_bytes"]
    # every Convolution / Dense weight in bfloat16; BatchNorm statistics stay float32
    assert sizes["converted"] < 0.55 * sizes["float32"]
    assert data["converted"] == 1 and data["seconds"] > 0


def test_zoo_where_nothing_converts_fails(tmp_path):
    # resnet50_v1b_gn's GroupNorm fails in float32 on MXNet 1.9.1 itself
    done = cli("zoo", "resnet50_v1b_gn", "--dtype", "bfloat16", "--out", tmp_path / "z")
    assert done.returncode == 1
    assert "0 converted, 0 failed, 1 float32 network(s) not runnable here" in done.stdout


def test_darknet53_builds_offline():
    """mxamp's builder passed pretrained_base=False to a classifier that refuses it."""
    net = zoo.random_network("darknet53", (1, 3, 64, 64))
    assert net(mx.nd.zeros((1, 3, 64, 64))).shape == (1, 1000)


def test_bfloat16_for_a_cpu_without_kernels(tiny, tmp_path):
    """Under an AVX2 limit MXNet has no bfloat16 kernels: the model written
    for --ctx cpu would be float32, and both commands say so; zoo exits 1."""
    done = cli("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--ctx", "cpu",
               "--out", tmp_path / "c", env=AVX2)
    assert done.returncode == 0
    assert "Warning: no operator runs in bfloat16: this CPU has no bfloat16 kernels for them " \
           "in MXNet (mxamp.cpu.features('mxnet'): avx2 (limit DNNL_MAX_CPU_ISA=AVX2)); " \
           "the model written is float32" in done.stderr
    # The advice, once, in the command's options: the converter's warning before it.
    assert re.search(r"^WARNING: mxamp.convert.api: bfloat16: kept in float32 \(no bfloat16 "
                     r"kernel on cpu\(0\)\): .*; --ctx any keeps them in bfloat16 \(for a "
                     r"device that has the kernels\)$", done.stderr, re.M), done.stderr
    assert done.stderr.count("--ctx any") == 1
    done = cli("zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--ctx", "cpu",
               "--out", tmp_path / "z", env=AVX2)
    assert done.returncode == 1
    assert "Warning: cifar_resnet20_v1 (bfloat16): no operator runs in bfloat16" in done.stderr
    assert "0 converted, 0 failed" in done.stdout
    # The failed kernel probes' MXNet log lines stay off the terminal...
    assert not MXNET_LOG.search(done.stderr), done.stderr
    # ... and -v shows them, as the logger "mxnet"
    loud = cli("-v", "zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--ctx", "cpu",
               "--out", tmp_path / "z", "--overwrite", env=AVX2)
    assert re.search(r"^INFO: mxnet: \S+\.cc:\d+: ", loud.stderr, re.M)  # the time dropped


def test_zoo_terminal_has_no_mxnet_lines(tmp_path):
    done = cli("zoo", "cifar_resnet20_v1", "--dtype", "bfloat16", "--dtype", "float16",
               "--out", tmp_path / "z")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no progress bar either: stderr is not a terminal
    assert re.search(r"^2 converted, 0 failed, 0 float32 network\(s\) not runnable here; "
                     r"[\d.]+ s in all \('convert s': convert_model alone\)", done.stdout, re.M)
    assert re.search(r"verified +params +convert s$", done.stdout, re.M)


# ---- quantize ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def digits_model(tmp_path_factory):
    """(prefix of the exported trained digits MLP, test images, labels)."""
    net = digits.trained("mlp")
    prefix = str(tmp_path_factory.mktemp("digits") / "mlp")
    net.export(prefix)
    _, _, x, y = digits.data()
    return prefix, x, y


def test_quantize_with_labels(digits_model, tmp_path):
    prefix, x, y = digits_model
    np.savez(tmp_path / "calib.npz", data=x, label=y)
    done = cli("quantize", prefix, "--calib", tmp_path / "calib.npz", "--calib-mode", "naive",
               "--out", tmp_path / "q", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    data = json.loads(done.stdout)
    assert data["calibration_examples"] == len(x) and data["int8_regions"] == 1
    assert data["accuracy"]["float32"] > 0.9
    assert data["accuracy"]["int8"] > data["accuracy"]["float32"] - 0.03
    assert data["errors"][0] < 5e-2
    onednn = mxamp.backends.get("onednn")  # the quantized model needs the backend loaded
    sym, args, aux = mx.model.load_checkpoint(str(tmp_path / "q"), 0)
    assert len(onednn.regions(sym)) == 1


def test_quantize_images_and_exclusions(digits_model, tmp_path):
    import matplotlib.image
    prefix, x, _ = digits_model
    images = tmp_path / "images"
    images.mkdir()
    for i in range(6):
        matplotlib.image.imsave(images / f"{i}.png", x[i, 0], cmap="gray")
    result = invoke("quantize", prefix, "--calib", images, "--shape", "data:1,1,16,16",
                    "--exclude", "mlp_dense2_fwd", "--out", tmp_path / "q")
    assert result.exit_code == 0, result.stderr
    assert re.match(rf"quantized {re.escape(prefix)} to INT8 \(entropy calibration on 6 "
                    r"examples\)", result.stdout)
    mxamp.backends.get("onednn")
    sym, _, _ = mx.model.load_checkpoint(str(tmp_path / "q"), 0)
    region, = [n for n in graph_json(sym)["nodes"] if n["op"] == "_mxamp_onednn_region"]
    marked = {n["name"] for n in region["subgraphs"][0]["nodes"]
              if n.get("attrs", {}).get("__mxamp_float__") == "1"}
    assert marked == {"mlp_dense2_fwd"}  # runs in float32 inside the region


def test_quantize_zoo_network(tmp_path):
    np.save(tmp_path / "x.npy", np.random.RandomState(0).uniform(size=(4, 3, 32, 32)))
    result = invoke("quantize", "--zoo", "cifar_resnet20_v1", "--calib", tmp_path / "x.npy",
                    "--out", tmp_path / "q")
    assert result.exit_code == 0, result.stderr
    assert "oneDNN INT8 regions: " in result.stdout
    assert os.path.exists(tmp_path / "q-symbol.json")


@pytest.mark.parametrize("args, message", [
    (["--zoo", "cifar_resnet20_v1"], "give PREFIX or --zoo NAME (one of them)")])
def test_quantize_usage_errors(digits_model, tmp_path, args, message):
    np.save(tmp_path / "x.npy", digits_model[1][:4])
    result = invoke("quantize", digits_model[0], "--calib", tmp_path / "x.npy", *args)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


def test_quantize_zoo_network_from_images(tmp_path):
    """Images are resized to the zoo network's usual input (32x32 for CIFAR)."""
    import matplotlib.image
    rng = np.random.RandomState(0)
    for i in range(3):
        matplotlib.image.imsave(tmp_path / f"{i}.jpg", rng.uniform(size=(40, 50, 3)))
    result = invoke("quantize", "--zoo", "cifar_resnet20_v1", "--calib", tmp_path,
                    "--calib-mode", "naive", "--out", tmp_path / "q", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["calibration_examples"] == 3


def test_zoo_progress_names_each_stage(tmp_path):
    """On a terminal the bar shows the network and its stage."""
    status, shown = on_terminal("zoo", "cifar_resnet20_v1", "--dtype", "bfloat16",
                                "--out", tmp_path / "z")
    assert status == 0
    postfixes = re.findall(r"model/s, (cifar_resnet20_v1: [^\]]+)\]", shown)
    assert list(dict.fromkeys(postfixes)) == [
        f"cifar_resnet20_v1: {s}" for s in ("build", "bfloat16 convert", "bfloat16 verify",
                                            "bfloat16 export", "done")]


@pytest.mark.parametrize("arrays, message", [
    ({"data": 8, "label": 4}, "calibration data '{path}': its arrays hold different numbers of "
                              "examples: {{'data': 8, 'label': 4}}"),
    ({"x": 8, "y": 8}, "calibration data '{path}' has arrays ['x', 'y']; the model's data "
                       "inputs ['data'] are missing")])
def test_quantize_bad_calibration_data(digits_model, tmp_path, arrays, message):
    path = tmp_path / "calib.npz"
    images = digits_model[1]
    np.savez(path, **{k: images[:n] if k != "label" else np.zeros(n) for k, n in arrays.items()})
    result = invoke("quantize", digits_model[0], "--calib", path, "--out", tmp_path / "q")
    assert result.exit_code == 1
    assert result.stderr == f"Error: {message.format(path=path)}\n"
    assert sorted(os.listdir(tmp_path)) == ["calib.npz"]
