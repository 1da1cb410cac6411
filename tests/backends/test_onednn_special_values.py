"""NaN and +-Inf through the oneDNN backend's regions: what MXNet's float32
operators give, the backend gives, in every compute type.

The reference is MXNet 1.9.1's float32 on its own kernels
(MXNET_MKLDNN_ENABLED=0), where its operators are defined: relu and clip
keep NaN, GELU of +Inf is +Inf, softmax of a row holding NaN or +Inf is NaN,
max pooling passes NaN by. MXNet's oneDNN kernels differ among themselves
(its unfused relu gives 0 for NaN, its fused one NaN for -Inf), so the
checks run in a child Python with them off.

Each operator of the backend's table (a case of test_onednn_table.CASES),
and the chains that met these values (a convolution with BatchNorm and relu
before max pooling, GELU), runs on data holding one NaN, one +Inf, one -Inf,
or NaN over half its values (whole pooling windows), and with a
FullyConnected weight that is NaN (a convolution's border reads its padding,
which MXNet's own kernel multiplies by the weight and oneDNN's skips: MXNet's
oneDNN kernel skips it too). Every output MXNet gives as NaN, +Inf or -Inf,
the backend gives so;
the others agree within the compute type's tolerance. INT8 rounds a weight
of a channel's smallest to 0, where Inf times it is NaN rather than +-Inf:
for INT8 the non-finite outputs agree, and NaN exactly on NaN data.
"""
import json
import os
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from isa import needs, require_onednn3

require_onednn3()

COMPUTES = [pytest.param("float32", marks=pytest.mark.cpu),
            pytest.param("bfloat16", marks=needs("bf16")), pytest.param("int8", marks=needs("avx2"))]
# max |got - ref| over the finite outputs, relative to max |ref| there.
TOL = {"float32": 1e-4, "bfloat16": 3e-2, "int8": 6e-2}
DATA = ("nan", "+inf", "-inf", "nan_half", "nan_weight")


def _extra_cases():
    """Chains beyond one operator per row."""
    from test_onednn_table import IMAGE, TOKENS, _conv, _fc
    D = mx.sym.var("data")
    pooled = mx.sym.Pooling(mx.sym.relu(mx.sym.BatchNorm(_conv(D), fix_gamma=False, name="bn")),
                            kernel=(2, 2), stride=(2, 2), pool_type="max")
    return {
        "conv_bn_relu_maxpool": (pooled, IMAGE),
        "conv_avgpool": (mx.sym.Pooling(_conv(D), kernel=(2, 2), stride=(2, 2), pool_type="avg"),
                         IMAGE),
        "gelu": (mx.sym.LeakyReLU(_fc(D), act_type="gelu"), TOKENS),
        "add_relu": (mx.sym.relu(_conv(D) + _conv(D, "c2")), IMAGE),
    }


def _special(shape, kind, rs):
    x = rs.uniform(-1, 1, shape).astype(np.float32)
    if kind == "nan_half":
        x.reshape(-1)[:x.size // 2] = np.nan
    elif kind != "nan_weight":
        x.reshape(-1)[[1, x.size // 2]] = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf}[kind]
    return x


def _backend(sym, args, aux, shapes, compute, rs):
    import mxamp.backends
    from mxamp import quantization
    if compute != "int8":
        return mxamp.backends.get("onednn").apply_backend(sym, args, aux, compute=compute)
    calib = {n: mx.nd.array(rs.uniform(-1, 1, s)) for n, s in shapes.items()}
    return quantization.quantize_model(
        sym, args, aux, data_names=sorted(shapes), label_names=(), calib_mode="naive",
        calib_data=mx.io.NDArrayIter(calib, batch_size=next(iter(shapes.values()))[0]))


def _compare(ref, got, compute, kind):
    """What differs between MXNet's output and the backend's: '' if nothing."""
    masks = [("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)]
    if compute == "int8" and kind not in ("nan", "nan_half"):
        masks = [("non-finite", lambda a: ~np.isfinite(a))]
    for name, mask in masks:
        if not np.array_equal(mask(ref), mask(got)):
            return f"{name} at {int(mask(ref).sum())} outputs in MXNet, {int(mask(got).sum())} here"
    finite = np.isfinite(ref)
    if finite.any():
        error = np.abs(got[finite] - ref[finite]).max() / max(np.abs(ref[finite]).max(), 1e-6)
        if error > TOL[compute]:
            return f"error {error} over the finite outputs"
    return ""


def _case(sym, shapes, compute, rs):
    """{data kind: what differs} for one case."""
    from test_onednn_backend import _params, _run
    args, aux, _ = _params(sym, shapes)
    model = _backend(sym, args, aux, shapes, compute, rs)
    found = {}
    for kind in DATA:
        data = {n: mx.nd.array(_special(s, kind, rs)) for n, s in shapes.items()}
        ref_args, run = args, model
        if kind == "nan_weight":
            weight = sorted(n for n in args if n.startswith("fc") and n.endswith("weight"))[:1]
            if not weight or compute == "int8":  # INT8: the weights are quantized
                continue
            bad = args[weight[0]].asnumpy()
            bad.reshape(-1)[0] = np.nan
            ref_args = {**args, weight[0]: mx.nd.array(bad)}
            # the backend applied to them: the region reads them packed
            run = _backend(sym, ref_args, aux, shapes, compute, rs)
        found[kind] = _compare(_run(sym, ref_args, aux, data)[0], _run(*run, data)[0],
                               compute, kind)
    return found


def _child(compute):
    """Every case's differences in `compute`, as JSON on stdout."""
    from test_onednn_table import CASES
    rs = np.random.RandomState(0)
    cases = {**CASES, **_extra_cases()}
    print(json.dumps({name: _case(sym, shapes, compute, rs)
                      for name, (sym, shapes) in sorted(cases.items())}))


_REPORTS = {}


def _report(compute):
    """The child's findings for `compute`, run once per module."""
    if compute not in _REPORTS:
        tests = os.path.dirname(os.path.abspath(__file__))
        env = {**os.environ, "MXNET_MKLDNN_ENABLED": "0",
               "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.path.dirname(tests),
                                                           os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, __file__, compute], env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        _REPORTS[compute] = json.loads(done.stdout.splitlines()[-1])
    return _REPORTS[compute]


@pytest.mark.parametrize("compute", COMPUTES)
def test_special_values_keep_mxnets_answers(compute):
    report = _report(compute)
    from test_onednn_table import CASES
    assert set(CASES) < set(report)  # every row of the table
    differ = {case: {k: v for k, v in found.items() if v} for case, found in report.items()}
    assert not {case: found for case, found in differ.items() if found}
    assert all(set(found) >= set(DATA) - {"nan_weight"} for found in report.values())
    if compute != "int8":
        assert sum("nan_weight" in found for found in report.values()) >= 10


if __name__ == "__main__":
    _child(sys.argv[1])
