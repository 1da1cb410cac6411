"""Mixed INT8 + bfloat16 (``rest_dtype='bfloat16'``): what an INT8 region
does not quantize (excluded layers, layers tune_int8 keeps, the non-linear
operators) computes in bfloat16 inside the same region, converted there.

Checked on nets.small_net (c1-bn1-r1, c2-bn2 + r1, r2, pool, fc) with c2
excluded: the partitioned graph (one region, nothing left on MXNet, no
casts), what the region records and what oneDNN runs (ONEDNN_VERBOSE), the
numerics, tune_int8, the command line in a subprocess, the one line on a CPU
without bfloat16 (and a result equal to rest_dtype='float32'), bad values.

Tolerances, relative L2 error against float32: a region computing in
bfloat16 alone (every layer excluded) below 1e-2 (bfloat16 keeps 8 bits,
about 4e-3 per rounding, over a few layers) and above 1e-4 (it does round);
in float32 below 1e-4. INT8 with the rest in bfloat16: at most INT8 with the
rest in float32 plus 1e-2, and within 2e-2 of it.

Run as a script (`python test_mixed.py CASE`) it runs one case and prints
what the test reads: 'verbose' one forward marked in oneDNN's log, 'avx2' the
comparison with rest_dtype='float32' as JSON.
"""
import json
import logging
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

import mxamp
from mxamp import cpu
from mxamp.dtypes import to_numpy
from mxamp.errors import OptionError
from mxamp.graph import CAST_OPS, graph_json
from mxamp.quantization import quantize_model, quantize_net_v2, tune_int8
from mxamp.verify import relative_error

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for isa and onednn_verbose as a script
import onednn_verbose as verbose  # noqa: E402
from isa import needs, require_onednn3  # noqa: E402

import nets  # noqa: E402

require_onednn3()

REGION = "_mxamp_onednn_region"
SHAPE = (4, 3, 12, 12)
AVX2 = {"DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def model():
    sym = nets.small_net()
    return (sym, *nets.random_params(sym, SHAPE))


def calibration():
    return mx.nd.array(np.random.RandomState(1).normal(0, 1, (2 * SHAPE[0],) + SHAPE[1:]))


def quantize(rest_dtype, excluded=("c2",), excluded_ops=None, **kwargs):
    options = {"calib_mode": "naive", **kwargs}
    return quantize_model(*model(), label_names=(),
                          calib_data=mx.io.NDArrayIter(calibration(), batch_size=SHAPE[0]),
                          excluded_sym_names=list(excluded), excluded_op_names=excluded_ops,
                          rest_dtype=rest_dtype, **options)


def run(quantized):
    return mxamp.verify.run(quantized, {"data": calibration()[:SHAPE[0]]})[0].asnumpy()


def regions(sym):
    return [n for n in graph_json(sym)["nodes"] if n["op"] == REGION]


@needs("bf16")
def test_one_region_holds_the_excluded_layer_no_casts():
    sym, args, aux = quantize("bfloat16")
    original = [n["name"] for n in graph_json(model()[0])["nodes"] if n["op"] != "null"]
    nodes = graph_json(sym)["nodes"]
    assert [n["op"] for n in nodes if n["op"] != "null"] == [REGION]  # nothing on MXNet
    region, = regions(sym)
    assert region["attrs"]["compute"] == "int8" and region["attrs"]["rest_dtype"] == "bfloat16"
    inner = {n["name"]: n for n in region["subgraphs"][0]["nodes"] if n["op"] != "null"}
    # The INT8 layers read s8 weights cut from the region's packs, each pack
    # dequantized (a Cast and its piece of the scales); bn1 is folded into
    # c1's; the excluded c2 reads its float parameters from packs of their
    # own; nothing else was added: conversions are the region's own.
    weights = {"_op0_weight_s8_3x3x3", "_op0_weight_s8_288"}
    packs = weights | {"_op0_weight_scales_4d", "_op0_weight_scales_2d", "_op0_bias_folded",
                       "_op0_params_8x3x3", "_op0_params"}
    dequantized = {f"{p}_{step}" for p in weights for step in ("float", "dequantized")}
    assert sorted(inner) == sorted(set(original) - {"bn1"} | dequantized |
                                   {f"{p}_split" for p in packs})
    assert not any(n["op"] in CAST_OPS for n in inner.values())
    assert [k for k, n in inner.items() if n.get("attrs", {}).get("__mxamp_float__")] == ["c2"]
    assert {k for k, a in args.items() if a.dtype == np.int8} == {
        "_op0_weight_s8_3x3x3", "_op0_weight_s8_288"}
    assert all(a.dtype == np.float32 for k, a in {**args, **aux}.items()
               if "_weight_s8" not in k)
    # The same graph as rest_dtype='float32' but for what the region records.
    plain = graph_json(quantize("float32")[0])
    assert regions_without_rest(plain) == regions_without_rest(graph_json(sym))
    assert regions(quantize("float32")[0])[0]["attrs"]["rest_dtype"] == "float32"


def regions_without_rest(graph):
    for node in graph["nodes"]:
        node.get("attrs", {}).pop("rest_dtype", None)
    return graph


def _verbose(rest_dtype):
    """oneDNN's exec lines of one forward of the quantized small net, each
    as (primitive kind, {argument: data type})."""
    lines = verbose.run([__file__, "verbose", rest_dtype])["forward"]
    return [(verbose.kind(f), verbose.types(f)) for f in lines]


@needs("bf16")
def test_what_the_region_runs_in_bfloat16():
    """INT8 layers write bfloat16 (their reader is excluded, or the region's
    output), the excluded convolution and the pooling compute in bfloat16;
    float32 only enters (quantized at once) and leaves (the one bf16 -> f32
    reorder at the output)."""
    steps = _verbose("bfloat16")
    computes = [(kind, {k: v for k, v in t.items() if k != "bia"}) for kind, t in steps
                if kind != "reorder"]
    # c1 and fc: their signed float sources quantized to u8 with zero point
    # 128 with VNNI
    signed = "u8" if cpu.features("onednn").vnni else "s8"
    assert computes == [
        ("convolution", {"src": signed, "wei": "s8", "dst": "bf16"}),  # c1 (+bn1, r1)
        ("convolution", {"src": "bf16", "wei": "bf16", "dst": "bf16"}),  # c2 excluded (+add, r2)
        ("pooling", {"src": "bf16", "dst": "bf16", "ws": "undef"}),
        ("inner_product", {"src": signed, "wei": "s8", "dst": "bf16"})]
    reorders = [(t["src"], t["dst"]) for kind, t in steps if kind == "reorder"]
    assert reorders[0] == ("f32", signed) and reorders[-1] == ("bf16", "f32")
    assert all("f32" not in r for r in reorders[1:-1]), reorders
    # rest_dtype='float32': the same chain with float32 where bfloat16 was.
    assert not any("bf16" in t.values() for _, t in _verbose("float32"))


@needs("bf16")
def test_numerics_against_float32():
    sym, args, aux = model()
    reference = mxamp.verify.run((sym, args, aux), {"data": calibration()[:SHAPE[0]]})[0]
    reference = reference.asnumpy()
    every_layer = ["Convolution", "FullyConnected"]
    assert relative_error(run(quantize("float32", (), every_layer)), reference) < 1e-4
    bf16_alone = relative_error(run(quantize("bfloat16", (), every_layer)), reference)
    assert 1e-4 < bf16_alone < 1e-2
    int8_f32, int8_bf16 = run(quantize("float32")), run(quantize("bfloat16"))
    assert relative_error(int8_bf16, reference) <= relative_error(int8_f32, reference) + 1e-2
    assert relative_error(int8_bf16, int8_f32) < 2e-2


@needs("bf16")
def test_quantize_net_v2_and_tune_int8_keep_layers_in_bfloat16():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, activation="relu"), mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    batches = [calibration()[:SHAPE[0]]]
    block = quantize_net_v2(net, calib_data=batches, calib_mode="naive",
                            exclude_layers_match=["dense"], rest_dtype=to_numpy(12))
    sym = mxamp.gluon.model_of(block, "testing it")[0]
    assert [r["attrs"]["rest_dtype"] for r in regions(sym)] == ["bfloat16"]
    assert relative_error(block(batches[0]), net(batches[0])) < 5e-2

    sym, args, aux = model()
    seen = []

    def only_with_c2_kept(candidate):  # a metric that needs c2 out of INT8
        if candidate[0] is sym:
            return 1.0
        region, = regions(candidate[0])
        seen.append(region["attrs"]["rest_dtype"])
        kept = {n["name"] for n in region["subgraphs"][0]["nodes"]
                if n.get("attrs", {}).get("__mxamp_float__")}
        return float("c2" in kept)
    result = tune_int8((sym, args, aux), batches, only_with_c2_kept, 0.0,
                       rest_dtype="bfloat16")
    assert result.excluded == ["c2"] and result.int8_layers == ["c1", "fc"]
    assert seen and set(seen) == {"bfloat16"}


AVX2_CASE = """
import json, logging, sys
sys.path.insert(0, {here!r})
import test_mixed
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("mxamp").addHandler(handler)
mixed = test_mixed.quantize("bfloat16")
plain = test_mixed.quantize("float32")
print(json.dumps({{"warnings": [r.getMessage() for r in records if r.levelno >= logging.WARNING],
                  "same_graph": mixed[0].tojson() == plain[0].tojson(),
                  "same_output": bool((test_mixed.run(mixed) == test_mixed.run(plain)).all())}}))
"""


@pytest.mark.cpu
def test_without_bfloat16_one_warning_and_the_float32_result():
    """Under an AVX2 limit (any CPU): one WARNING, then exactly what
    rest_dtype='float32' gives."""
    done = subprocess.run([sys.executable, "-c", AVX2_CASE.format(here=HERE)],
                          env={**os.environ, **AVX2}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["same_graph"] and found["same_output"]
    warning, = found["warnings"]
    assert warning.startswith("INT8: rest_dtype bfloat16 is not available on this CPU: oneDNN "
                              "uses avx2 (limit ")
    assert warning.endswith("the layers outside INT8 run in float32")


@needs("bf16")
def test_a_saved_mixed_model_fails_clearly_without_bfloat16(tmp_path):
    mx.model.save_checkpoint(str(tmp_path / "q"), 0, *quantize("bfloat16"))
    code = (f"import mxamp, mxnet as mx\n"
            f"net = mxamp.load({str(tmp_path / 'q')!r})\n"
            f"try:\n    net(mx.nd.ones({SHAPE})).wait_to_read()\n"
            f"except mx.base.MXNetError as err:\n    print(mxamp.errors.mxnet_message(err))\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **AVX2},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "this INT8 region computes what is not INT8 in bfloat16 (rest_dtype) but the CPU " \
           "(or ONEDNN_MAX_CPU_ISA) offers no AVX512-BF16/AMX; apply the backend to the model " \
           "without regions on this machine" in done.stdout


@pytest.mark.cpu
@pytest.mark.skipif(cpu.features("onednn").bf16, reason="for CPUs (or limits) without bfloat16")
def test_apply_backend_refuses_a_bfloat16_rest_without_bfloat16():
    with pytest.raises(OptionError, match=r"rest_dtype='bfloat16' needs bfloat16 instructions "
                                          r"in oneDNN \(AVX512-BF16 or AMX\); this CPU offers "):
        mxamp.backends.get("onednn").apply_backend(*model(), compute="int8",
                                                   rest_dtype="bfloat16")


def _cli(tmp_path, *args, env=None):
    sym, args_, aux = model()
    prefix = str(tmp_path / "small")
    mx.model.save_checkpoint(prefix, 0, sym, args_, aux)
    np.save(tmp_path / "x.npy", calibration().asnumpy())
    return subprocess.run([sys.executable, "-m", "mxamp", "quantize", prefix, "--calib",
                           str(tmp_path / "x.npy"), "--calib-mode", "naive", "--exclude", "c2",
                           "--out", str(tmp_path / "q"), "--json", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


@needs("bf16")
def test_command_line_rest_dtype(tmp_path):
    done = _cli(tmp_path, "--rest-dtype", "bf16")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    result = json.loads(done.stdout)
    assert result["rest_dtype"] == "bfloat16" and result["int8_regions"] == 1
    assert result["errors"][0] < 5e-2
    loaded = mxamp.load(str(tmp_path / "q"))
    assert loaded.mxamp_format == "int8 + bfloat16 on the oneDNN backend"
    report = json.loads((tmp_path / "q.json").read_text())
    assert {r["name"]: r["precision"] for r in report["operators"]}["c2"] == "bfloat16"


@pytest.mark.cpu
def test_command_line_without_bfloat16_says_so_in_one_line(tmp_path):
    done = _cli(tmp_path, "--rest-dtype", "bfloat16", env=AVX2)
    assert done.returncode == 0, done.stderr
    line, = done.stderr.splitlines()
    assert line.startswith("Warning: --rest-dtype bfloat16 is not available on this CPU")
    assert line.endswith("the layers outside INT8 run in float32")
    assert json.loads(done.stdout)["rest_dtype"] == "float32"


@pytest.mark.parametrize("call, message", [
    (lambda: quantize("float16"), r"rest_dtype 'float16' is not supported; allowed: float32, "
                                  r"bfloat16"),
    (lambda: quantize(np.float16), r"rest_dtype <class 'numpy.float16'> is not supported"),
    (lambda: quantize("bf16"), r"rest_dtype 'bf16' is not supported; allowed: float32, "
                               r"bfloat16"),
    (lambda: quantize("bfloat16", calib_mode="none"),
     r"rest_dtype='bfloat16' is what mxamp's oneDNN regions compute in outside INT8, and "
     r"this call makes none: calib_mode='none'"),
    (lambda: tune_int8(model(), [calibration()], lambda m: 1.0, 0.1, rest_dtype="int8"),
     r"rest_dtype 'int8' is not supported"),
    (lambda: mxamp.backends.get("onednn").apply_backend(*model(), compute="float32",
                                                        rest_dtype="bfloat16"),
     r"rest_dtype is what INT8 regions compute in where not INT8: it needs compute='int8', "
     r"got compute='float32'"),
    (lambda: mxamp.backends.get("onednn").apply_backend(*model(), compute="int8",
                                                        rest_dtype="half"),
     r"rest_dtype must be one of float32, bfloat16, got 'half'"),
])
def test_bad_values(call, message):
    with pytest.raises(OptionError, match=message):
        call()


def test_command_line_refuses_a_bad_value(tmp_path):
    done = _cli(tmp_path, "--rest-dtype", "float16")
    assert done.returncode == 2
    assert "Invalid value for '--rest-dtype': 'float16' is not one of 'float32', 'bfloat16'" \
        in done.stderr


def test_float32_aliases_are_float32():
    plain = quantize("float32")
    assert quantize(np.float32)[0].tojson() == plain[0].tojson()


def _print_verbose(rest_dtype):
    """Plans the region (a first forward packs its weights), then runs it
    once more, marked "forward"."""
    sym, args, aux = quantize(rest_dtype)
    args = {**args, "data": calibration()[:SHAPE[0]]}
    exe = sym.bind(mx.cpu(), {n: args[n] for n in sym.list_arguments()}, aux_states=aux,
                   grad_req="null")
    logging.disable(logging.CRITICAL)
    verbose.call(exe, 2, "forward")


if __name__ == "__main__":
    _print_verbose(sys.argv[2])
