"""What a new user meets first, run as they run it: the command
line in a subprocess (a pseudo-terminal where the output depends on one),
the Python API in a fresh process with MXNet's default logging.

- quantizing a converted model says what to do, on the command line and in
  the Python API;
- the Python API prints nothing of MXNet's (C++ log lines, warnings about
  mxamp's own graphs);
- progress bars for calibration, tuning and optimize's candidates on a
  terminal, and in the Python API with progress=True;
- `zoo --list` alone, dtype aliases, a usage error (2) for an unknown network;
- the converter's kept-in-float32 warning once, in the command's options;
- channels-last calibration data named as such; --out directories made;
- `quantize --max-drop` (tune_int8 on labelled calibration data)."""
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import numpy as np
import pytest

import mxamp
from mxamp.quantization import quantize_model, quantize_net_v2
from published import listing

SHAPE = ["--shape", "data:1,3,8,8"]
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # graphs.py
# A tqdm bar: "DESC: ... N UNIT" with a rate or a percentage
BAR = "{desc}: .*{unit}"


def cli(*args, cwd=None, env=None):
    """`python -m mxamp ARGS` with stdout and stderr as pipes."""
    return subprocess.run([sys.executable, "-m", "mxamp", *map(str, args)], text=True,
                          capture_output=True, timeout=600, cwd=cwd,
                          env={**os.environ, **(env or {})})


def on_terminal(*args):
    """(exit status, what a 160-column terminal showed on stderr) of
    `python -m mxamp ARGS`; stdout is a pipe."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    done = subprocess.run([sys.executable, "-m", "mxamp", *map(str, args)], stderr=follower,
                          stdout=subprocess.PIPE, timeout=600)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the other end is closed and drained
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return done.returncode, shown.decode(errors="replace")


# MXNet's defaults: the command line, run in this process by click's
# CliRunner elsewhere, sets MXNET_SUBGRAPH_VERBOSE=0 for itself.
DEFAULT_ENV = {k: v for k, v in os.environ.items() if k != "MXNET_SUBGRAPH_VERBOSE"}


def python(code, cwd):
    """A fresh Python process running `code` (MXNet's default logging)."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=DEFAULT_ENV)


@pytest.fixture(scope="module")
def calib(tmp_path_factory):
    """Calibration files for the tiny model: channels first (.npy), channels
    last (.npy), four channels (.npy) and labelled (.npz)."""
    folder = tmp_path_factory.mktemp("calib")
    rng = np.random.RandomState(0)
    x = rng.uniform(size=(40, 3, 8, 8)).astype("float32")
    np.save(folder / "nchw.npy", x)
    np.save(folder / "nhwc.npy", x.transpose(0, 2, 3, 1))
    np.savez(folder / "labelled.npz", data=x, label=rng.randint(0, 4, 40))
    np.save(folder / "c4.npy", rng.uniform(size=(6, 4, 8, 8)).astype("float32"))
    return folder


# ---- 1: a converted model is not quantized -------------------------------------------

def test_quantize_refuses_a_converted_model(tiny, tmp_path, calib):
    assert cli("convert", tiny, "--dtype", "bfloat16", *SHAPE, "--out",
               tmp_path / "bf16").returncode == 0
    done = cli("quantize", tmp_path / "bf16", "--calib", calib / "nchw.npy")
    assert done.returncode == 1
    assert done.stderr == ("Error: the model is already converted to bfloat16 (its inputs carry "
                           "mxamp's __mxamp_converted__ attribute); quantize the original float32 "
                           "model instead\n")
    assert listing(tmp_path) == [".bf16.mxamp", "bf16-0000.params", "bf16-symbol.json"]


def test_python_quantization_refuses_a_converted_model(tiny):
    import mxnet as mx
    model = mx.model.load_checkpoint(tiny, 0)
    converted = mxamp.convert_model(*model, target_dtype="bfloat16")
    x = mx.nd.random.uniform(shape=(4, 3, 8, 8))
    with pytest.raises(ValueError, match=r"^the model is already converted to bfloat16 .*; "
                                         "quantize the original float32 model instead$"):
        quantize_model(*converted, label_names=(), calib_data=[[x]], calib_mode="naive")
    net = mx.gluon.SymbolBlock.imports(f"{tiny}-symbol.json", ["data"], f"{tiny}-0000.params")
    net.hybridize()
    net(x)
    block = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", target_device="any")
    with pytest.raises(ValueError, match="quantize the original float32 model instead"):
        quantize_net_v2(block, calib_data=[[x]], calib_mode="naive")


# ---- 2: the Python API is quiet ------------------------------------------------------

def test_python_api_prints_nothing_of_mxnets(tiny, tmp_path):
    """Conversion for this CPU (kernel probes bind ~10 graphs, each logged
    'Subgraph backend MKLDNN is activated.' before), quantize_net_v2 (warned
    'Cannot decide type for the following arguments'), the oneDNN backend
    and optimize; then the user's own bind still logs as MXNet does."""
    done = python(f"""
import sys
sys.path.insert(0, {TESTS!r})
import mxnet as mx
import mxamp
from graphs import tiny_net
from mxamp.quantization import quantize_net_v2
net = tiny_net()
x = mx.nd.random.uniform(shape=(4, 3, 8, 8))
amp = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")
amp(x).wait_to_read()
q = quantize_net_v2(net, calib_data=[[x]], calib_mode="naive")
q(x).wait_to_read()
mxamp.gluon.apply_backend_block(net, compute="float32")(x).wait_to_read()
mxamp.optimize(net, [[x]], runs=1)
print("done")
y = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2)
y.simple_bind(mx.cpu(), data=(1, 3)).forward()
""", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    # Only the user's own bind reaches stderr, besides mxamp's own warnings
    # (a CPU without bfloat16 kernels: operators kept in float32).
    mxnets = "".join(line for line in done.stderr.splitlines(keepends=True)
                     if not line.startswith("mxamp "))
    assert re.fullmatch(r"\[\d\d:\d\d:\d\d\] \S+graph_executor.cc:\d+: Subgraph backend MKLDNN "
                        r"is activated.\n", mxnets), done.stderr


def test_mxnet_lines_reach_the_logger_mxnet(tiny, tmp_path):
    """Not lost: at INFO they are the logger "mxnet"'s, without their time."""
    done = python(f"""
import logging
logging.basicConfig(level=logging.INFO, format="%(name)s|%(message)s")
import mxnet as mx
import mxamp
sym, args, aux = mx.model.load_checkpoint("{tiny}", 0)
mxamp.convert_model(sym, args, aux, target_dtype="bfloat16", ctx=mx.cpu())
""", tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "mxnet|../src/executor/graph_executor.cc:2072: Subgraph backend MKLDNN is " \
           "activated." in [re.sub(r"cc:\d+:", "cc:2072:", line) for line in lines]
    assert not [line for line in lines if line.startswith("[")]


# ---- 3: progress bars ----------------------------------------------------------------

def test_quantize_shows_calibration_progress_on_a_terminal(tiny, tmp_path, calib):
    status, shown = on_terminal("quantize", tiny, "--calib", calib / "nchw.npy",
                                "--out", tmp_path / "q")
    assert status == 0, shown
    assert re.search(BAR.format(desc="calibration", unit="batch"), shown), shown
    piped = cli("quantize", tiny, "--calib", calib / "nchw.npy", "--out", tmp_path / "q2")
    assert piped.returncode == 0 and piped.stderr == ""  # no bar into a pipe or a file
    status, shown = on_terminal("-q", "quantize", tiny, "--calib", calib / "nchw.npy",
                                "--out", tmp_path / "q3")
    assert status == 0 and shown == ""


def test_tuning_and_optimize_show_progress_on_a_terminal(tiny, tmp_path, calib):
    status, shown = on_terminal("quantize", tiny, "--calib", calib / "labelled.npz",
                                "--max-drop", "0.5", "--out", tmp_path / "q")
    assert status == 0, shown
    assert re.search(BAR.format(desc="tune_int8", unit="evaluation"), shown), shown
    status, shown = on_terminal("optimize", tiny, "--calib", calib / "nchw.npy", "--runs", "2")
    assert status == 0, shown
    assert re.search(BAR.format(desc="candidates", unit="candidate"), shown), shown
    assert re.search(BAR.format(desc="timing", unit="round"), shown), shown


def test_python_api_progress_option(tiny, tmp_path):
    code = f"""
import mxnet as mx
import mxamp
from mxamp.quantization import quantize_model
sym, args, aux = mx.model.load_checkpoint("{tiny}", 0)
x = mx.nd.random.uniform(shape=(4, 3, 8, 8))
quantize_model(sym, args, aux, label_names=(), calib_data=[[x], [x]], calib_mode="naive",
               progress=PROGRESS)
"""
    shown = python(code.replace("PROGRESS", "True"), tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"calibration: .*2 ?batch", shown.stderr), shown.stderr
    hidden = python(code.replace("PROGRESS", "False"), tmp_path)
    assert hidden.returncode == 0 and hidden.stderr == ""


# ---- 4, 5, 11: zoo --list, dtype names, usage errors ---------------------------------

def test_zoo_list_needs_no_models():
    done = cli("zoo", "--list")
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert {"resnet50_v1", "ssd_512_resnet50_v1_voc", "simple_pose_resnet18_v1b"} <= set(names)
    assert names == sorted(names) and done.stderr == ""


@pytest.mark.parametrize("alias, dtype", [("bf16", "bfloat16"), ("FP16", "float16"),
                                          ("half", "float16")])
def test_dtype_aliases(tiny, tmp_path, alias, dtype):
    done = cli("convert", tiny, "--dtype", alias, *SHAPE, "--out", tmp_path / "c")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"converted {tiny} to {dtype} ")


@pytest.mark.parametrize("given, message", [
    ("bf17", "'bf17' is not a dtype mxamp converts to: float16 (fp16, half) or bfloat16 (bf16); "
             "did you mean 'bfloat16'?"),
    ("fp32", "'fp32' is the model's own dtype: convert to float16 or bfloat16 (fp16, bf16)")])
def test_bad_dtype_names_the_choices(tiny, tmp_path, given, message):
    done = cli("convert", tiny, "--dtype", given, *SHAPE, "--out", tmp_path / "c")
    assert done.returncode == 2
    assert done.stderr == f"Error: Invalid value for '--dtype': {message} (see 'mxamp convert " \
                          "--help')\n"


def test_unknown_zoo_network_is_a_usage_error(tmp_path):
    done = cli("zoo", "resnet50_v9", "--dtype", "bf16", "--out", tmp_path / "z")
    assert done.returncode == 2
    assert done.stderr.startswith("Error: unknown model 'resnet50_v9'; did you mean ")
    done = cli("quantize", "--zoo", "resnet50_v9", "--calib", tmp_path)
    assert done.returncode == 2
    assert os.listdir(tmp_path) == []


# ---- 6: warnings in the command's terms, once ----------------------------------------

@pytest.mark.parametrize("workers", ["1", "2"])
def test_kept_float32_warning_once_in_the_commands_terms(tmp_path, workers):
    """float16 for this CPU: MXNet 1.9.1 has no float16 Convolution /
    FullyConnected on any CPU, in both networks. Worker processes' records
    are this process's (they printed the Python API's advice, once each)."""
    done = cli("zoo", "cifar_resnet20_v1", "cifar_resnet20_v2", "--dtype", "fp16",
               "--ctx", "cpu", "--workers", workers, "--out", tmp_path / "z")
    kept = [line for line in done.stderr.splitlines() if "kept in float32" in line]
    assert kept == ["WARNING: mxamp.convert.api: float16: kept in float32 (no float16 kernel on "
                    "cpu(0)): Convolution x21, FullyConnected x1; --ctx any keeps them in "
                    "float16 (for a device that has the kernels)"], done.stderr
    assert "target_device" not in done.stderr and "convert without ctx" not in done.stderr
    assert done.stderr.count("--ctx any") == 1
    unchanged = [line for line in done.stderr.splitlines() if "no operator runs" in line]
    assert [line.split(":")[0:2] for line in unchanged] == [
        ["Warning", " cifar_resnet20_v1 (float16)"], ["Warning", " cifar_resnet20_v2 (float16)"]]


# ---- 7: calibration layout, output directories ---------------------------------------

@pytest.mark.parametrize("name, message", [
    ("nhwc.npy", "{file}: 'data' has shape (40, 8, 8, 3), channels last (N, H, W, C); the model "
     "reads channels first (N, C, H, W), here (N, 3, 8, 8): transpose it, e.g. "
     "numpy.transpose(x, (0, 3, 1, 2))"),
    # was: "... has shape (8, 3, 3, 3) ... but the symbol needs (8, 4, 3, 3)", as if the
    # model's parameters were wrong
    ("c4.npy", "{file} does not fit the model: parameter 'conv0_weight' has shape (8, 3, 3, 3) "
     "in the model's parameters, but the graph needs (8, 4, 3, 3) for the data shapes of its "
     "examples (data:1,4,8,8)")])
def test_calibration_data_that_does_not_fit_is_named(tiny, tmp_path, calib, name, message):
    done = cli("quantize", tiny, "--calib", calib / name, "--out", tmp_path / "q" / "m")
    assert done.returncode == 1
    assert done.stderr == f"Error: calibration data {message.format(file=calib / name)}\n"
    assert os.listdir(tmp_path) == []  # the --out directory is not left behind


@pytest.mark.parametrize("command", [["quantize", "--calib", "{calib}"],
                                     ["convert", "--dtype", "bf16", *SHAPE]])
def test_out_directories_are_made(tiny, tmp_path, calib, command):
    args = [a.format(calib=calib / "nchw.npy") for a in command]
    done = cli(command[0], tiny, *args[1:], "--out", tmp_path / "a" / "b" / "m")
    assert done.returncode == 0, done.stderr
    report = ["m.html", "m.json"] if command[0] == "quantize" else []  # the INT8 report
    assert listing(tmp_path / "a" / "b") == [".m.mxamp", "m-0000.params", "m-symbol.json",
                                             *report]


# ---- 11: quantize --max-drop ---------------------------------------------------------

def test_quantize_max_drop_tunes_on_labelled_data(tiny, tmp_path, calib):
    done = cli("quantize", tiny, "--calib", calib / "labelled.npz", "--max-drop", "0",
               "--exclude", "dense0_fwd", "--calib-mode", "naive", "--json",
               "--out", tmp_path / "q")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    tuning = result["tuning"]
    assert tuning["max_drop"] == 0 and tuning["accuracy_drop"] <= 0
    assert "dense0_fwd" in tuning["float32_layers"] and tuning["evaluations"] >= 1
    assert result["accuracy"]["int8"] >= result["accuracy"]["float32"]
    done = cli("quantize", tiny, "--calib", calib / "nchw.npy", "--max-drop", "0.01")
    assert done.returncode == 2
    assert done.stderr.startswith("Error: --max-drop measures top-1 accuracy: give --calib a "
                                  ".npz file with a 'label' array")


# ---- 8: parameter sizes explained; mxamp.load reads every format -----------------------

def test_convert_says_why_parameters_stay_float32(tiny, tmp_path):
    done = cli("convert", tiny, "--dtype", "bf16", *SHAPE, "--out", tmp_path / "a")
    assert "parameters: 1.1 KiB float32 -> 1.1 KiB (stored float32, cast when read, as " \
           "MXNet's AMP does; --cast-optional-params stores them in the low dtype where every " \
           "reader takes them so)\n" in done.stdout
    done = cli("convert", tiny, "--dtype", "bf16", *SHAPE, "--out", tmp_path / "b",
               "--cast-optional-params")
    assert re.search(r"^parameters: 1.1 KiB float32 -> 6\d\d B$", done.stdout, re.M)


@pytest.fixture(scope="module")
def every_format(tiny, tmp_path_factory, calib):
    """{prefix: (format mxamp.load names, tolerance vs float32 or None: not
    run here)} of one model in each format mxamp writes."""
    import mxnet as mx
    from mxamp import cpu
    from mxamp.quantization import quantize_model_mkldnn
    from mxamp.tools.checkpoint import save_checkpoint
    folder = tmp_path_factory.mktemp("formats")
    x = mx.nd.array(np.load(calib / "nchw.npy")[:8])
    formats = {tiny: ("float32", 0)}

    def export(block, name, model_format, tolerance):
        block(x)  # a SymbolBlock exports its parameters once it has run
        block.export(str(folder / name))
        formats[str(folder / name)] = (model_format, tolerance)

    sym, args, aux = mx.model.load_checkpoint(tiny, 0)
    # For any device; runnable here where MXNet has bfloat16 kernels (MXNet
    # 1.9.1 has no float16 Convolution on CPUs).
    for dtype, tolerance in (("bfloat16", 3e-2 if cpu.mxnet_has_bfloat16() else None),
                             ("float16", None)):
        save_checkpoint(str(folder / dtype), *mxamp.convert_model(
            sym, args, aux, target_dtype=dtype, cast_optional_params=True))
        formats[str(folder / dtype)] = (dtype, tolerance)
    net = mx.gluon.SymbolBlock.imports(f"{tiny}-symbol.json", ["data"], f"{tiny}-0000.params")
    net.hybridize()
    net(x)
    export(mxamp.gluon.apply_backend_block(net, compute="float32"), "fp32-backend",
           "float32 on the oneDNN backend", 1e-5)
    if cpu.features("onednn").bf16:
        bf16 = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", target_device="any")
        export(mxamp.gluon.apply_backend_block(bf16, compute="bfloat16"), "bf16-backend",
               "bfloat16 on the oneDNN backend", 3e-2)
    assert cli("quantize", tiny, "--calib", calib / "nchw.npy", "--calib-mode", "naive",
               "--out", folder / "int8").returncode == 0
    formats[str(folder / "int8")] = ("int8 on the oneDNN backend", 5e-2)
    model = quantize_model_mkldnn(sym, args, aux, label_names=(), calib_data=[[x]],
                                  calib_mode="naive")
    mx.model.save_checkpoint(str(folder / "mxnet-int8"), 0, *model)
    formats[str(folder / "mxnet-int8")] = ("int8 in MXNet's format", 5e-2)
    return formats


@pytest.mark.cpu
def test_load_reads_every_format_in_a_fresh_process(every_format, calib, tmp_path):
    """INT8 and backend models loaded in a process that never called
    mxamp.backends.get("onednn") ("Operator _mxamp_onednn_region is not
    registered" before); INT8 within 5e-2 of float32 (measured 1e-2 to
    2e-2), bfloat16 3e-2, float32 on the backend 1e-5."""
    done = python(f"""
import mxnet as mx
import numpy as np
import mxamp
x = mx.nd.array(np.load({str(calib / 'nchw.npy')!r})[:8])
reference = None
for prefix, run in {[(p, t is not None) for p, (_, t) in every_format.items()]!r}:
    net = mxamp.load(prefix)
    error = ""
    if run:
        y = net(x)
        reference = y if reference is None else reference
        error = float(mxamp.verify.relative_error(y, reference))
    print(prefix, "|", net.mxamp_format, "|", error)
""", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for line in done.stdout.splitlines():
        prefix, found, error = line.split(" | ")
        expected, tolerance = every_format[prefix]
        assert found == expected
        if tolerance is not None:
            assert float(error) <= tolerance, (prefix, error)


def test_inspect_reads_every_format(every_format):
    for prefix, (model_format, _) in every_format.items():
        done = cli("inspect", prefix, "--json")
        assert done.returncode == 0, (prefix, done.stderr)
        summary = json.loads(done.stdout)
        if model_format in ("float32", "float16", "bfloat16"):
            assert summary["dtype"] == ("bfloat16" if model_format == "float32" else model_format)
            assert summary["was_converted"] == (model_format != "float32")
        else:
            assert summary["format"] == model_format
            computes = [r["compute"] for r in summary["regions"]]
            assert computes == ([] if "MXNet" in model_format else [model_format.split()[0]])
