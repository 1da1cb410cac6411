"""bench/benchlib.py's reading of oneDNN's verbose lines, one parser for
oneDNN 3.2's (mxamp's, `onednn_verbose,`) and 2.4's (MXNet 1.9.1's own,
`dnnl_verbose,`); MXNet's verbose from a child process; and
bench/int8_speed.py's per-kind table of mxamp against MXNet INT8."""
import os
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

# Lines as each version writes them (3.2 from mxamp's backend, 2.4 from
# MXNet 1.9.1's quantized model): the same fields after the prefix; 3.2
# writes a memory descriptor's extra flags between its colons.
V3_CONV = ("onednn_verbose,exec,cpu,convolution,brgconv:avx512_core_vnni,forward_inference,"
           "src_u8:a:blocked:acdb::f0 wei_s8:a:blocked:AcdB32a4b::f0 bia_f32::blocked:a::f0 "
           "dst_u8:a:blocked:acdb::f0,attr-scales:wei:1 ,alg:convolution_direct,"
           "mb4_ic16oc32_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1,0.026123")
V3_DW = ("onednn_verbose,exec,cpu,convolution,brdgmm_dw:avx512_core_vnni,forward_inference,"
         "src_u8:a:blocked:acdb::f0 wei_s8:a:blocked:debcA16a::f0 bia_f32::blocked:a::f0 "
         "dst_u8:a:blocked:acdb::f0,attr-scales:wei:3 ,alg:convolution_direct,"
         "g32mb4_ic32oc32_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1,0.013916")
V3_REORDER = ("onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd::f0 "
              "dst_u8::blocked:abcd::f0,attr-scales:src0:0 ,,4x16x16x16,0.0100098")
V2_CONV = ("dnnl_verbose,exec,cpu,convolution,brgconv:avx512_core_vnni,forward_inference,"
           "src_u8::blocked:acdb:f0 wei_s8:p:blocked:AcdB32a4b:f0 bia_f32::blocked:a:f0 "
           "dst_u8::blocked:acdb:f0,attr-oscale:2 ,alg:convolution_direct,"
           "mb4_ic16oc32_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1,0.0290527")
V2_DW = ("dnnl_verbose,exec,cpu,convolution,jit_dw:avx512_core,forward_inference,"
         "src_u8::blocked:acdb:f0 wei_s8:p:blocked:Goihw16g:f0 bia_f32::blocked:a:f0 "
         "dst_u8::blocked:acdb:f0,attr-oscale:2 attr-post-ops:eltwise_relu ,"
         "alg:convolution_direct,g32mb4_ic32oc32_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1,"
         "0.0170898")
V2_REORDER = ("dnnl_verbose,exec,cpu,reorder,jit:uni,undef,src_f32::blocked:abcd:f0 "
              "dst_u8::blocked:acdb:f0,attr-oscale:0 ,,4x16x16x16,0.0148926")
INFO = ["onednn_verbose,info,oneDNN v3.2.0 (commit 40112196287e8866a7259df35f817229454d0c96)",
        "dnnl_verbose,info,prim_template:operation,engine,primitive,implementation,prop_kind,"
        "memory_descriptors,attributes,auxiliary,problem_desc,exec_time",
        "=== mxnet_verbose call", "some other line, exec, of a library"]
CONV_PROBLEM = "mb4_ic16oc32_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1"
DW_PROBLEM = "g32mb4_ic32oc32_ih16oh16kh3sh1dh0ph1_iw16ow16kw3sw1dw0pw1"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import benchlib
    return benchlib


@pytest.mark.parametrize("line, parsed", [
    (V3_CONV, ("convolution", "brgconv:avx512_core_vnni", "u8,s8->u8", CONV_PROBLEM, 0.026123)),
    (V2_CONV, ("convolution", "brgconv:avx512_core_vnni", "u8,s8->u8", CONV_PROBLEM, 0.0290527)),
    (V2_DW, ("convolution", "jit_dw:avx512_core", "u8,s8->u8", DW_PROBLEM, 0.0170898)),
    (V3_REORDER, ("reorder", "jit:uni", "f32->u8", "4x16x16x16", 0.0100098)),
    (V2_REORDER, ("reorder", "jit:uni", "f32->u8", "4x16x16x16", 0.0148926)),
])
def test_one_parser_reads_both_versions(bench, line, parsed):
    assert bench.verbose_primitive(line) == parsed


def test_only_exec_lines_are_primitives(bench):
    log = "\n".join([INFO[0], V2_REORDER, *INFO[1:], V3_CONV, ""])
    assert [p[0] for p in bench.verbose_primitives(log)] == ["reorder", "convolution"]
    assert all(bench.verbose_primitive(line) is None for line in INFO)


def test_totals_of_either_version_group_by_kind_implementation_and_types(bench):
    """The same network's calls, one per version's lines: the depthwise
    convolution is its own kind with the multiply-accumulates of its
    groups, each primitive at its fastest call, the CPU time the fastest."""
    runs = {"3.2": [V3_REORDER, V3_CONV, V3_DW], "2.4": [V2_REORDER, V2_CONV, V2_DW]}
    conv_macs, dw_macs = 4 * 16 * 32 * 16 * 16 * 9, 4 * 32 * 16 * 16 * 9
    for version, lines in runs.items():
        slow = [line.rsplit(",", 1)[0] + ",5.0" for line in lines]  # a preempted call
        calls = [(9.0, bench.verbose_primitives("\n".join(slow))),
                 (2.5, bench.verbose_primitives("\n".join(lines)))]
        totals, sums = bench.primitive_totals(calls, dtypes=True)
        impls = {key[0]: key[1] for key in totals}
        assert set(impls) == {"reorder", "convolution", "grouped_convolution"}, version
        conv = totals[("convolution", impls["convolution"], "u8,s8->u8")]
        dw = totals[("grouped_convolution", impls["grouped_convolution"], "u8,s8->u8")]
        assert conv[0] == dw[0] == 1 and conv[2] == conv_macs and dw[2] == dw_macs
        fastest = [bench.verbose_primitive(line)[-1] for line in lines]
        assert sums == {"calls": 2, "primitives": 3, "min_ms": pytest.approx(sum(fastest)),
                        "median_ms": pytest.approx(sum(fastest) / 2 + 7.5), "cpu_ms": 2.5}


@pytest.mark.cpu
def test_mxnet_verbose_comes_from_a_child_process(bench, tiny, tmp_path):
    """MXNet's own oneDNN 2.4 logs each marked call of the exported model in
    the child (DNNL_VERBOSE set there only); the CPU time is the call's here."""
    x = np.ones((1, 3, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    block = mx.gluon.SymbolBlock.imports(f"{tiny}-symbol.json", ["data"],
                                         f"{tiny}-0000.params")
    ran = []

    def run():
        ran.append(1)
        return block(mx.nd.array(x)).asnumpy()

    runs = bench.mxnet_verbose_runs(tiny, str(tmp_path / "x.npy"), run, calls=3)
    assert len(runs) == 3 and len(ran) == 3
    for cpu_ms, primitives in runs:
        assert cpu_ms > 0
        kinds = {(kind, types): problem for kind, _, types, problem, _ in primitives}
        assert kinds[("convolution", "f32,f32->f32")].startswith("mb1_ic3oc8_ih8oh8kh3")
        assert ("inner_product", "f32,f32->f32") in kinds
    assert "DNNL_VERBOSE" not in os.environ


def test_a_failing_child_names_its_error(bench, tmp_path):
    with pytest.raises(RuntimeError, match=r"bench/mxnet_verbose.py failed: .*missing"):
        bench.mxnet_verbose_runs(str(tmp_path / "missing"), str(tmp_path / "x.npy"),
                                 lambda: None, calls=1)


def test_side_by_side_puts_mxnet_int8_beside_mxamp_by_kind(bench, capsys):
    """mxamp's breakdown (verbose 3.2 primitives, operators left on MXNet)
    against MXNet INT8's profile (2.4 primitives), per kind: ms, count,
    GMAC/s on the same work."""
    import int8_speed
    ours, _ = bench.primitive_totals([(2.0, bench.verbose_primitives(
        "\n".join([V3_REORDER, V3_CONV, V3_DW])))], dtypes=True)
    theirs, sums = bench.primitive_totals([(3.0, bench.verbose_primitives(
        "\n".join([V2_REORDER, V2_CONV, V2_DW, V2_DW])))], dtypes=True)
    breakdown = {"primitives": {" ".join(k): v for k, v in ours.items()},
                 "operators": {"Flatten": (1, 0.5), "_mxamp_onednn_region": (1, 1.9)},
                 "sums": {"cpu_ms": 2.0}}
    peer = {"layers": {" ".join(k): (n, ms) for k, (n, ms, _) in theirs.items()}, "sums": sums}
    rows = int8_speed.side_by_side(breakdown, peer, {"gmacs": 100.0},
                                   int8_speed.NAIVE, int8_speed.MXNET_INT8)["by_kind"]
    dw = rows["grouped (depthwise) convolutions"]
    assert (dw["count"], dw["peer_count"]) == (1, 2)
    assert dw["ms"] == pytest.approx(0.013916) and dw["peer_ms"] == pytest.approx(2 * 0.0170898)
    assert rows["convolutions, inner products"]["macs"] == 4 * 16 * 32 * 16 * 16 * 9
    assert rows["reorders, transposes, (de)quantize"]["peer_ms"] == pytest.approx(0.0148926)
    assert rows["other: flatten"]["ms"] == 0.5
    assert "_mxamp_onednn_region" not in str(rows)
    out = capsys.readouterr().out
    assert "d mxamp int8 naive against c mxnet int8 by kind" in out
    assert "grouped_convolution jit_dw:avx512_core u8,s8->u8" in out
