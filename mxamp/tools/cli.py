"""The ``mxamp`` commands: convert exported models, inspect what
conversion does, quantize to INT8, measure every way to run a model, and
convert GluonCV zoo networks in batch (see docs/cli.md). Their parameters
are in :mod:`.options`, how they meet the terminal in :mod:`.console`, what
they print in :mod:`.text`; their outputs are published whole by
:mod:`.publish`."""
import logging
import os
import time
import warnings

import click
import mxnet as mx
import numpy as np

from .. import cpu, verify
from ..backends import onednn
from ..convert.api import convert_model_with
from ..convert.options import ConversionOptions
from ..dtypes import LOW_DTYPES, to_ndarray
from ..graph import graph_json, summarize
from ..version import __version__
from . import checkpoint, evaluation, inspection, loading, publish, report, signals, text
from .console import Cli, advise_in_command_terms, echo_json, one_line_errors, progress
from .models import check_calibration, quantized, read_float32, read_source
from .options import (DTYPES, available_rest_dtype, backend_option, check_zoo_names,
                      config_option, context, conversion_fields, ctx_option, data_shapes,
                      int8_options, json_option, model_options, model_source,
                      overwrite_option, parse_shape, quiet, refuse_conversion_flags, verbosity,
                      zoo_selection)

EXAMPLES = """\b
Examples:
  mxamp zoo resnet50_v1 --dtype bfloat16 --out zoo_out
  mxamp convert model --dtype bfloat16 --input-shapes "data:[1,3,224,224]"
  mxamp inspect model --dtype float16 --out report
  mxamp quantize model --calib calib.npz --calib-mode entropy
"""


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=EXAMPLES)
@click.version_option(__version__, prog_name="mxamp")
@verbosity
def main():
    """Automatic mixed precision for MXNet models: float32 to float16 /
    bfloat16, and INT8 quantization."""
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # MXNet logs every bind otherwise
    logging.basicConfig(format="%(levelname)s: %(name)s: %(message)s")
    advise_in_command_terms(main.commands.get(click.get_current_context().invoked_subcommand))


@main.command(short_help="Convert an exported model to float16 / bfloat16 and verify it.",
              epilog="""\b
Examples:
  mxamp convert model --dtype bfloat16 --shape data:1,3,224,224
  mxamp convert model --dtype float16 --input "data[1,3,224,224],mask[1,4]"
  mxamp convert model --dtype bfloat16 --ctx cpu --config policy.toml --json
""")
@verbosity
@model_options
@config_option
@click.option("--dtype", type=DTYPES, required=True,
              help="Low-precision dtype (fp16, half, bf16 too).")
@click.option("--out", "out_prefix", help="Output prefix [default: PREFIX-DTYPE].")
@data_shapes
@click.option("--keep-io-types/--no-keep-io-types", default=None,
              help="Data inputs and outputs stay float32 [default: keep].")
@backend_option
@overwrite_option("existing output files")
@json_option
@one_line_errors
def convert(prefix, epoch, exclude, fp32_ops, cast_optional_params, ctx, config, dtype,
            out_prefix, shapes, keep_io_types, backend, overwrite, as_json):
    """Convert PREFIX-symbol.json + PREFIX-NNNN.params, write the converted
    pair, reload it and run it against float32 on random inputs of the
    data shapes."""
    out_prefix = checkpoint.output_prefix(out_prefix, f"{prefix}-{dtype}")
    outputs = checkpoint.checkpoint_files(out_prefix, epoch)
    publish.refuse_existing(outputs, overwrite)
    fields = conversion_fields(dtype, config, fp32_ops, exclude, cast_optional_params,
                               keep_io_types)
    reference = read_float32(prefix, epoch, "convert")
    checkpoint.check_inputs(*reference, shapes, checkpoint.checkpoint_files(prefix, epoch)[1])
    converted = convert_model_with(*reference, ConversionOptions(
        dtype, data_names=list(shapes), ctx=context(ctx), backend=backend, **fields))
    signals.safe_point()
    operators = inspection.precision_counts(converted)
    if backend:
        operators = text.backend_counts(converted[0])
    elif not operators.get(dtype):
        warnings.warn(f"{text.unchanged(dtype, ctx)}; the model written is float32")
    # an INT8 report published at this prefix describes another model
    stale_report = report.int8_report_files(*os.path.split(out_prefix))
    with checkpoint.publishing(out_prefix, epoch, overwrite, gone=stale_report) as staged:
        checkpoint.save_checkpoint(staged, *converted, epoch=epoch)
        reloaded = checkpoint.load_checkpoint(staged, epoch)
        result = verify.compare(reference, reloaded, verify.feeds_for(reloaded[0], shapes))
        signals.safe_point()
    sizes = [checkpoint.param_bytes(*model[1:]) for model in (reference, converted)]
    result = {"model": prefix, "dtype": dtype, "ctx": ctx, "files": list(outputs),
              "operators": operators, "casts": summarize(converted[0]),
              "param_bytes": {"float32": sizes[0], "converted": sizes[1]},
              "input_shapes": shapes, **result}
    if as_json:
        echo_json(result)
    else:
        device = f"{backend} backend on this CPU" if backend else f"{ctx} device"
        text.print_converted(result, device, cast_optional_params)
    return 0 if result["finite"] else 1


@main.command(short_help="Show each operator's precision and why, casts and memory.",
              epilog="""\b
Examples:
  mxamp inspect model --dtype bfloat16 --ctx cpu
  mxamp inspect model-bfloat16 --out report --overwrite
""")
@verbosity
@model_options
@click.option("--dtype", type=DTYPES, help="For a float32 model: the dtype to convert to "
              "[default: bfloat16]. A converted model's own dtype is read off its casts.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Also write inspect.json / .md / .html (with a picture of the graph).")
@overwrite_option("an existing --out directory")
@json_option
@one_line_errors
def inspect(prefix, epoch, exclude, fp32_ops, cast_optional_params, ctx, dtype, out_dir,
            overwrite, as_json):
    """Per-operator precision of a model (float32 or converted) and why,
    with cast counts and parameter memory before and after conversion."""
    if out_dir:
        publish.refuse_existing([out_dir], overwrite)
    *model, model_format = loading.read(prefix, epoch)
    if model_format not in ("float32", *LOW_DTYPES):
        # on the oneDNN backend or in MXNet's INT8 format: its regions
        refuse_conversion_flags(prefix, model_format, out_dir, ctx=ctx, dtype=dtype,
                                exclude=exclude, fp32_op=fp32_ops,
                                cast_optional_params=cast_optional_params)
        summary = inspection.packed_summary(*model, model_format)
        echo_json(summary) if as_json else text.print_packed(prefix, model_format, summary)
        return 0
    summary, converted = inspection.inspect_model(
        *model, dtype=dtype, ctx=context(ctx), fp32_ops=fp32_ops,
        excluded=exclude, cast_optional_params=cast_optional_params)
    if as_json:
        echo_json(summary)
    else:
        text.print_summary(prefix, summary)
    if out_dir:
        with publish.output([out_dir], overwrite, directory=True) as staging:
            graph = graph_json(converted[0])
            report.write_inspect_report(staging, os.path.basename(prefix), summary, graph,
                                        set(converted[1]) | set(converted[2]))
        click.echo(f"report: {os.path.join(out_dir, 'inspect.html')}", err=as_json)
    return 0


@main.command(short_help="Convert GluonCV zoo networks in batch, verify and report.",
              epilog="""\b
Examples:
  mxamp zoo resnet50_v1 --dtype bfloat16 --out zoo_out
  mxamp zoo --family classification --dtype float16 --dtype bfloat16 --out zoo_out --workers 2
  mxamp zoo --family detection --list
""")
@verbosity
@zoo_selection
@ctx_option
@click.option("--shape", type=str, callback=parse_shape, metavar="D1,D2,...",
              help="Input shape for every network [default: the family's usual one].")
@click.option("--cast-optional-params", is_flag=True, help="Store parameters in low "
              "precision where every consumer reads them so (smaller files).")
@config_option
@click.option("--list", "list_only", is_flag=True, help="Print the selected names and stop.")
@overwrite_option("an existing --out directory")
@json_option
@one_line_errors
def zoo(models, all_models, family, dtypes, out_dir, workers, scheduler, ctx, shape,
        cast_optional_params, config, list_only, overwrite, as_json):
    """Convert GluonCV zoo networks (MODELS, a --family, or --all), verify
    each against float32 and export it. Weights come from the GluonCV cache
    (~/.mxnet/models) when there, else are random; nothing is downloaded.
    Exit status 1 if any conversion failed or none converted (networks whose
    float32 forward fails are listed, not counted as failed)."""
    start = time.perf_counter()
    from . import zoo as zoo_lib
    if sum(map(bool, (models, all_models, family))) > 1 or \
            not (list_only or models or all_models or family):
        raise click.UsageError("give MODEL names, --family or --all (one of them)")
    if workers > 1 and scheduler:
        raise click.UsageError("--workers and --scheduler exclude each other")
    check_zoo_names(zoo_lib, models)
    names = list(dict.fromkeys(models)) or zoo_lib.model_names(family)
    if list_only:
        echo_json(names) if as_json else click.echo("\n".join(names))
        return 0
    if not dtypes or not out_dir:
        raise click.UsageError("--dtype and --out are required (unless --list)")
    publish.refuse_existing([out_dir], overwrite)
    options = ConversionOptions(dtypes[0], **conversion_fields(
        dtypes[0], config, cast_optional_params=cast_optional_params))
    with publish.output([out_dir], overwrite, directory=True) as staging:
        results = zoo_lib.write_batch(staging, names, dtypes, ctx, shape, workers, scheduler,
                                      options, quiet())
        meta = {"dtype": ", ".join(dtypes), "ctx": ctx, "models": len(names),
                **zoo_lib.counts(results), "workers": workers, "scheduler": scheduler,
                "mxamp": __version__, "cpu": cpu.describe(),
                "seconds": round(time.perf_counter() - start, 1)}
        report.write_zoo_report(staging, results, meta)
    for r in zoo_lib.outcomes(results)["unchanged"]:
        warnings.warn(f"{r['model']} ({r['dtype']}): {text.unchanged(r['dtype'], ctx)}; the "
                      "exported model is float32")
    if as_json:
        echo_json({**meta, "report": os.path.join(out_dir, "report.html"), "results": results})
    else:
        text.print_zoo(results, meta, out_dir, cast_optional_params, time.perf_counter() - start)
    return 1 if meta["failed"] or not meta["converted"] else 0


@main.command(short_help="Quantize an exported model or a zoo network to INT8.",
              epilog="""\b
Examples:
  mxamp quantize model --calib calib.npz --calib-mode entropy --out model-int8
  mxamp quantize --zoo resnet18_v1 --calib images/ --shape data:1,3,224,224
  mxamp quantize model --calib x.npy --exclude dense0_fwd --json
""")
@verbosity
@model_source("Quantize")
@click.option("--calib", required=True, type=click.Path(exists=True),
              help="Calibration data: a .npy file (the one data input), a .npz file (one "
              "array per data input, and an optional 'label' array for accuracy) or a "
              "folder of images (resized to the input shape, scaled to [0, 1]).")
@int8_options
@click.option("--out", "out_prefix", help="Output prefix [default: PREFIX-int8, or NAME-int8].")
@overwrite_option("existing output files")
@json_option
@one_line_errors
def quantize(prefix, zoo_name, epoch, calib, calib_mode, num_calib_examples, exclude,
             exclude_ops, rest_dtype, shapes, max_drop, out_prefix, overwrite, as_json):
    """INT8 post-training quantization of PREFIX-symbol.json +
    PREFIX-NNNN.params (or of a --zoo network) with calibration data, run on
    mxamp's oneDNN 3 backend; writes the quantized pair (mxamp.load(OUT)
    loads it) and compares it with float32 on the calibration data (top-1
    accuracy too when labels are given). --max-drop keeps the fewest layers
    in float32 within a top-1 accuracy budget on labelled data."""
    from . import calib_data
    out_prefix = checkpoint.output_prefix(out_prefix, f"{prefix or zoo_name}-int8")
    where, name = os.path.split(out_prefix)  # the INT8 report: PREFIX.html / .json beside them
    outputs = [*checkpoint.checkpoint_files(out_prefix, epoch),
               *report.int8_report_files(where, name)]
    publish.refuse_existing(outputs, overwrite)
    reference, data_names, shapes = read_source(prefix, zoo_name, epoch, shapes)
    arrays, labels = calib_data.load(calib, data_names, shapes)
    check_calibration(reference, arrays, calib)
    if max_drop is not None and labels is None:
        raise click.UsageError("--max-drop measures top-1 accuracy: give --calib a .npz file "
                               "with a 'label' array (one class per example)")
    options = {"calib_mode": calib_mode, "num_calib_examples": num_calib_examples,
               "exclude": exclude, "exclude_ops": exclude_ops,
               "rest_dtype": available_rest_dtype(rest_dtype)}
    int8, tuning = quantized(reference, data_names, arrays, labels, options, max_drop)
    scores = evaluation.int8_against_float32(reference, int8, arrays, labels)
    with checkpoint.publishing(out_prefix, epoch, overwrite, outputs[2:]) as staged:
        checkpoint.save_checkpoint(staged, *int8, epoch=epoch)
        report.write_int8_report(os.path.dirname(staged), name, reference, int8,
                                 {n: (1, *a.shape[1:]) for n, a in arrays.items()}, name=name)
    count = len(next(iter(arrays.values())))
    result = {"model": prefix or zoo_name, "files": list(outputs), "calib_mode": calib_mode,
              "rest_dtype": options["rest_dtype"],
              "calibration_examples": min(count, num_calib_examples or count),
              "int8_regions": len(onednn.regions(int8[0])),
              "param_bytes": {"float32": checkpoint.param_bytes(*reference[1:]),
                              "int8_model": checkpoint.param_bytes_by_dtype(*int8[1:])},
              **scores, **({"tuning": tuning} if tuning else {})}
    echo_json(result) if as_json else text.print_int8(result, count)
    return 0


@main.command(short_help="Measure every way mxamp can run a model here; name the fastest.",
              epilog="""\b
Examples:
  mxamp optimize model --calib calib.npz --max-error 0.02
  mxamp optimize --zoo resnet18_v1 --calib images/ --shape data:8,3,224,224 --json
""")
@verbosity
@model_source("Measure")
@click.option("--calib", required=True, type=click.Path(exists=True),
              help="Calibration data, as for 'mxamp quantize'; its first batch of up to 32 "
              "examples is what every candidate is timed and compared on.")
@click.option("--max-error", type=click.FloatRange(min=0), default=0.05, show_default=True,
              help="The largest relative L2 error against float32 a candidate may have.")
@click.option("--runs", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Timed rounds (after one warm-up round).")
@data_shapes
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Also write int8.html / int8.json, the INT8 candidate's report, here.")
@json_option
@one_line_errors
def optimize(prefix, zoo_name, epoch, calib, max_error, runs, shapes, report_dir, as_json):
    """Builds every way mxamp can run the model on this CPU (float32 on the
    oneDNN backend, bfloat16 on MXNet and on the backend, INT8), times them
    interleaved and prints the table with the fastest whose error is within
    --max-error (mxamp.optimize). Writes no model (convert or quantize with
    the chosen way); --report writes the INT8 candidate's report."""
    from ..gluon import symbol_block
    from ..tools.optimize import optimize as measure
    from . import calib_data
    (sym, args, aux), data_names, shapes = read_source(prefix, zoo_name, epoch, shapes)
    arrays, _ = calib_data.load(calib, data_names, shapes)
    check_calibration((sym, args, aux), arrays, calib)
    count = min(len(next(iter(arrays.values()))), 32)
    batches = [[to_ndarray(arrays[n][:count], np.float32) for n in data_names]]
    net = symbol_block(sym, [mx.sym.var(n) for n in data_names], args, aux, mx.cpu())
    net.hybridize(static_alloc=True, static_shape=True)
    with progress() as shown:
        result = measure(net, batches, max_error=max_error, runs=runs, progress=shown)
    int8 = next(c for c in result.candidates if c.name == "int8")
    if report_dir and int8.block is None:
        click.echo(f"no INT8 report: the INT8 candidate {int8.note}", err=True)
    elif report_dir:
        from ..gluon import model_of
        files = report.int8_report_files(report_dir)
        with publish.output(files, overwrite=True, key="int8") as staging:
            report.write_int8_report(staging, prefix or zoo_name, (sym, args, aux),
                                     model_of(int8.block, "reporting it")[:3],
                                     {n: (1, *arrays[n].shape[1:]) for n in data_names})
        click.echo(f"report: {files[1]}", err=True)
    if as_json:
        echo_json({"model": prefix or zoo_name, "chosen": result.name, "max_error": max_error,
                    "cpu": cpu.describe(), "candidates": [
                        {"name": c.name, "ms": c.ms, "error": c.error, "note": c.note}
                        for c in result.candidates]})
        return 0
    click.echo(result.table())
    return 0
