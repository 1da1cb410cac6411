"""What the commands print, as text: counts, sizes and errors in one line
each, and each command's summary."""
import os

import click

from .. import cpu
from ..backends import onednn
from ..graph import CAST_OPS, graph_json
from . import report


def counts(by_name):
    return ", ".join(f"{k} {v}" for k, v in by_name.items()) or "none"


def shape_text(shapes):
    return ", ".join(f"{n}:{','.join(map(str, s))}" for n, s in shapes.items())


def errors(values):
    return ", ".join(f"output {i} {e:.2e}" for i, e in enumerate(values))


def sizes(by_dtype):
    """'1.2 KiB (int8 1.0 KiB, float32 200 B)', or '1.2 KiB float32' for one dtype."""
    total = report.size(sum(by_dtype.values()))
    if len(by_dtype) == 1:
        return f"{total} {next(iter(by_dtype))}"
    return f"{total} ({', '.join(f'{t} {report.size(n)}' for t, n in sorted(by_dtype.items()))})"


def params_note(param_sizes, cast_optional_params):
    """Why the parameters take as much memory as in float32, if they do."""
    if param_sizes[0] != param_sizes[1] or cast_optional_params:
        return ""
    return ("stored float32, cast when read, as MXNet's AMP does; --cast-optional-params "
            "stores them in the low dtype where every reader takes them so")


def unchanged(dtype, ctx):
    """Why a conversion that put no operator in `dtype` gave a float32 model."""
    if ctx == "cpu" and not (dtype == "bfloat16" and cpu.mxnet_has_bfloat16()):
        # The converter's warning, just before, says what --ctx any does.
        return (f"no operator runs in {dtype}: this CPU has no {dtype} kernels for them in "
                f"MXNet (mxamp.cpu.features('mxnet'): {cpu.features('mxnet')})")
    return f"no operator runs in {dtype}: the lists and exclusions keep every one in float32"


def backend_counts(sym):
    """{"backend regions": n, "on MXNet": operators outside them} of a
    partitioned graph, what `operators` reports for it."""
    outside = [n for n in graph_json(sym)["nodes"]
               if n["op"] not in ("null", onednn.REGION_OP) + CAST_OPS]
    return {"backend regions": len(onednn.regions(sym)), "on MXNet": len(outside)}


def print_converted(result, device, cast_optional_params):
    """`mxamp convert`'s summary of `result` (its JSON form)."""
    outputs, param_bytes = result["files"], result["param_bytes"]
    click.echo(f"converted {result['model']} to {result['dtype']} (for {device}): "
               f"{outputs[0]}, {outputs[1]}")
    click.echo(f"operators: {counts(result['operators'])}")
    click.echo(f"casts: {counts(result['casts'])}")
    note = params_note((param_bytes["float32"], param_bytes["converted"]), cast_optional_params)
    click.echo(f"parameters: {report.size(param_bytes['float32'])} float32 -> "
               f"{report.size(param_bytes['converted'])}{f' ({note})' if note else ''}")
    how = ("native kernels" if result["verified"] == "native" else
           f"emulated in float32: no kernel here for {', '.join(result['emulated_ops'])}")
    click.echo(f"reloaded and ran on {shape_text(result['input_shapes']) or 'no data inputs'} "
               f"({how}): relative error vs float32 {_errors_text(result)}")


def _errors_text(result):
    text = errors(result["errors"])
    if result["pre_nms"]:
        text += "; fed into NMS " + ", ".join(f"{e:.2e}" for e in result["pre_nms"].values())
    return text + ("" if result["finite"] else "; NOT FINITE")


def print_summary(prefix, summary):
    """`mxamp inspect`'s table and summary of a float32 or converted model."""
    click.echo(report.text_table(report.OPERATOR_HEADERS, report.operator_rows(summary)))
    kind = "converted" if summary["was_converted"] else "float32, converted here"
    click.echo(f"\n{prefix} ({kind}) -> {summary['dtype']}")
    click.echo(f"operators: {counts(summary['ops_by_precision'])}")
    click.echo(f"casts: {counts(summary['casts'])}")
    click.echo(f"parameters: {report.size(summary['param_bytes']['float32'])} float32 -> "
               f"{report.size(summary['param_bytes']['converted'])}")


def print_packed(prefix, model_format, summary):
    """`mxamp inspect`'s summary of a model on the oneDNN backend or in
    MXNet's INT8 format: its regions and the operators outside them."""
    click.echo(f"{prefix}: {model_format}")
    for region in summary["regions"]:
        click.echo(f"region {region['name']} ({region['compute']}): "
                   f"{counts(region['operators'])}")
    click.echo(f"outside the regions: {counts(summary['operators_outside_regions'])}")
    click.echo(f"parameters: {sizes(summary['param_bytes_by_dtype'])}")


def print_int8(result, count):
    """`mxamp quantize`'s summary of `result` (its JSON form), with `count`
    calibration examples."""
    files, rest_dtype = result["files"], result["rest_dtype"]
    click.echo(f"quantized {result['model']} to INT8 ({result['calib_mode']} calibration on "
               f"{result['calibration_examples']} examples): {files[0]}, {files[1]}; "
               f"report: {files[3]}")
    click.echo(f"oneDNN INT8 regions: {result['int8_regions']} (the rest in {rest_dtype}); "
               f"relative error vs float32 {errors(result['errors'])}")
    click.echo(f"parameters: {report.size(result['param_bytes']['float32'])} float32 -> "
               f"{sizes(result['param_bytes']['int8_model'])}")
    if "accuracy" in result:
        acc = result["accuracy"]
        click.echo(f"top-1 accuracy on {count} labelled examples: float32 {acc['float32']:.4f}"
                   f", INT8 {acc['int8']:.4f}")
    if "tuning" in result:
        tuning = result["tuning"]
        kept = tuning["float32_layers"]
        click.echo(f"--max-drop {tuning['max_drop']:g}: {len(kept)} layer(s) kept in "
                   f"{rest_dtype} ({', '.join(kept) or 'none'}) after {tuning['evaluations']} "
                   "evaluations")


def print_zoo(results, meta, out_dir, cast_optional_params, seconds):
    """`mxamp zoo`'s table and summary of a batch."""
    from .zoo import outcomes
    click.echo(report.text_table(report.ZOO_HEADERS, report.zoo_rows(results)))
    found = outcomes(results)
    for r in found["float32_failed"] + found["failed"]:
        click.echo(f"{r['model']} ({r['dtype']}) failed in {r['failed_in']}: {r['error']}")
    weights = sorted({r["weights"] for r in results})
    click.echo(f"weights: {'; '.join(weights)}")
    converted = [r for r in results if r["status"] == "ok"]
    if converted and all(r["param_bytes"]["float32"] == r["param_bytes"]["converted"]
                         for r in converted):
        click.echo(f"parameters: {params_note((0, 0), cast_optional_params)}")
    click.echo(f"{meta['converted']} converted, {meta['failed']} failed, "
               f"{meta['float32_failed']} float32 network(s) not runnable here; {seconds:.1f} s "
               f"in all ('convert s': convert_model alone); report: "
               f"{os.path.join(out_dir, 'report.html')}")
