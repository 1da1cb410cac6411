"""Naive and entropy calibration give one oneDNN plan.

Only a tensor's threshold depends on the calibration mode; its sign (s8, or
u8 from 0) comes from the minimum seen, which both modes share. These tests
quantize the same networks both ways through quantize_model
(quantized_dtype 'auto', as the bench's quantize_net_v2), on Student-t
data (tails heavier than a normal's, so that entropy clips), and check that the regions run
the same primitives (kind, implementation, data types, layouts, attribute
masks, zero points, problem) with only post-op constants differing, and
that both stay close to float32. Run as a script (by the verbose test) it
logs one call of each network in each mode.
"""
import re

import mxnet as mx
import numpy as np

import onednn_verbose as verbose
from isa import needs
from mxamp import quantization
from test_onednn_int8 import CASES, _error, _params, _run, onednn  # noqa: F401 (a fixture)

pytestmark = needs("avx2")

MODES = ("naive", "entropy")
# The networks with every encoding the plan chooses by range: a signed stem,
# clipped relu6, residual sums and zero points 128 (inverted_residuals), and
# GELU's u8 with a zero point at its floor read by a FullyConnected (ffn).
NETWORKS = ("inverted_residuals", "ffn")
BATCH, CALIB_BATCHES = 4, 4
# Relative L2 against float32, either mode (measured here: naive 1.8e-2 /
# 1.7e-2, entropy 2.2e-2 / 4.6e-2; random weights and 16 calibration
# examples, where entropy's clipping costs more than on trained networks).
RTOL = 6e-2
# A post-op's float constants (a sum's scale, a linear's shift) follow the
# thresholds; integers (zero points, a linear's alpha of 1) are the plan's.
FLOAT = re.compile(r"-?\d+\.\d*(e-?\d+)?")


def _quantized(case, mode):
    """(quantized sym, args, aux, float32 args, aux, test batch) of a CASES
    network calibrated in `mode` on Student-t data (df 10: tails heavier than a normal's)."""
    sym, shape = CASES[case][:2]
    args, aux, _ = _params(sym, shape, -1)
    rs = np.random.RandomState(7)
    calib = mx.nd.array(rs.standard_t(10, size=(BATCH * CALIB_BATCHES,) + shape[1:]))
    qsym, qargs, qaux = quantization.quantize_model(
        sym, args, aux, label_names=(), calib_mode=mode, quantized_dtype="auto",
        calib_data=mx.io.NDArrayIter(calib, batch_size=BATCH))
    test = {"data": mx.nd.array(rs.standard_t(10, size=(BATCH,) + shape[1:]))}
    return qsym, qargs, qaux, args, aux, test


def _plan(fields):
    """A verbose exec line without its time, post-op float constants masked."""
    return FLOAT.sub("#", ",".join(fields[2:-1]))


def test_both_modes_match_float32(onednn):
    """Entropy clips (some thresholds below naive's), and both modes stay
    within RTOL of float32 on data of the calibration's distribution."""
    amax = {}
    for case in NETWORKS:
        for mode in MODES:
            qsym, qargs, qaux, args, aux, test = _quantized(case, mode)
            ref = _run(CASES[case][0], args, aux, test)[0]
            assert _error(_run(qsym, qargs, qaux, test)[0], ref) < RTOL, (case, mode)
            amax[case, mode] = re.findall(r'"__mxamp_amax__": "([^"]+)"', qsym.tojson())
        naive, entropy = (np.array(amax[case, m], dtype=float) for m in MODES)
        assert naive.shape == entropy.shape and (entropy < naive).any(), case


def test_verbose_both_modes_run_one_plan(onednn):
    """One steady call of each network per mode: the same primitives in the
    same order, post-op float constants aside; the zero points (128 on
    VNNI) and u8 outputs are there in both."""
    logs = verbose.run([__file__])
    for case in NETWORKS:
        naive, entropy = ([_plan(f) for f in logs[f"{case} {mode}"]] for mode in MODES)
        assert naive == entropy, case
        assert len(naive) > 2 and any("dst_u8" in line for line in naive), naive


if __name__ == "__main__":
    for _case in NETWORKS:
        for _mode in MODES:
            _qsym, _qargs, _qaux, _, _, _test = _quantized(_case, _mode)
            _ex = _qsym.bind(mx.cpu(), {**_qargs, **_test}, aux_states=_qaux, grad_req="null")
            verbose.call(_ex, 2, f"{_case} {_mode}")
