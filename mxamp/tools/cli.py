"""The ``mxamp`` commands: convert exported models, inspect what
conversion does, quantize to INT8, measure every way to run a model, and
convert GluonCV zoo networks in batch (see docs/cli.md). Their parameters
are in :mod:`.options`; their outputs are published whole by :mod:`.publish`."""
import contextlib
import functools
import json
import logging
import os
import sys
import time
import warnings

import click
import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from .. import address_space, cpu, verify
from ..backends import onednn
from ..convert import convert_model
from ..convert.marker import check_float32_graph
from ..dtypes import LOW_DTYPES, to_ndarray
from ..errors import OutOfMemory, is_out_of_memory, mxnet_logs_to_logging, mxnet_message
from ..graph import CAST_OPS, graph_json, summarize
from ..version import __version__
from . import (checkpoint, evaluation, inspection, loading, policy_file, publish, report,
               signals, streams)
from .options import (CTX, CTX_HELP, DTYPES, RestDtype, backend_option, check_ops,
                      config_option, data_shapes, json_option, model_options, model_source,
                      overwrite_option, parse_shape, quiet, verbosity)


class _Cli(click.Group):
    """Every error ends as one line on stderr and a non-zero exit status."""

    def main(self, args=None, prog_name=None, **extra):
        streams.guard()  # closed or quitting standard streams fail no command
        warnings.showwarning = _show_warning  # MXNet's own go to the logger below
        with mxnet_logs_to_logging():  # shown with -v
            self._main(args, prog_name, **extra)

    def _main(self, args, prog_name, **extra):
        try:
            with signals.deferred():  # stops at a safe point, staging removed
                status = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as err:
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx else ""
            click.echo(f"Error: {' '.join(err.format_message().split())}{where}", err=True)
            sys.exit(err.exit_code)
        except _NoMemory as err:
            click.echo(f"Error: {err.format_message()}", err=True)
            # MXNet may hold work for a thread it could not start, and its
            # shutdown then waits for it forever (a run hung at exit).
            streams.flush()
            os._exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"Error: {' '.join(err.format_message().split())}", err=True)
            sys.exit(err.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except signals.Interrupted as err:
            click.echo(err.message, err=True)
            sys.exit(128 + err.signum)
        sys.exit(status or 0)


class _NoMemory(click.ClickException):
    """A command that ran out of memory (or could not start a thread)."""


def _one_line_errors(command):
    """Turns the errors of bad input into a ClickException with the first
    line of their message (MXNet's carry C++ stack frames); one saying that
    memory ran out names the command and the address-space limit."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        short = address_space.shortfall()
        if short:  # MXNet would die starting its threads, with a signal
            raise _NoMemory(short)
        try:
            return command(*args, **kwargs)
        except (MXNetError, ValueError, TypeError, RuntimeError, OSError, MemoryError) as err:
            lines = (mxnet_message(err) if isinstance(err, MXNetError) else
                     str(err)).strip().splitlines()
            line = lines[0] if lines else type(err).__name__
            if isinstance(err, OutOfMemory):
                raise _NoMemory(line) from None
            if is_out_of_memory(err):
                raise _NoMemory(f"out of memory in 'mxamp {command.__name__}'"
                                f"{address_space.note()}: {line}") from None
            raise click.ClickException(line) from None
    return run


def _show_warning(message, *_args, **_kwargs):
    click.echo(f"Warning: {message}", err=True)


@contextlib.contextmanager
def _progress():
    """Whether the library's progress bars show (on a terminal, not with -q);
    log lines meanwhile print above the bars."""
    from tqdm.contrib.logging import logging_redirect_tqdm
    shown = not quiet() and sys.stderr.isatty()
    with logging_redirect_tqdm() if shown else contextlib.nullcontext():
        yield shown


def _echo_json(data):
    click.echo(json.dumps(data, indent=2, default=str))


EXAMPLES = """\b
Examples:
  mxamp zoo resnet50_v1 --dtype bfloat16 --out zoo_out
  mxamp convert model --dtype bfloat16 --input-shapes "data:[1,3,224,224]"
  mxamp inspect model --dtype float16 --out report
  mxamp quantize model --calib calib.npz --calib-mode entropy
"""


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=EXAMPLES)
@click.version_option(__version__, prog_name="mxamp")
@verbosity
def main():
    """Automatic mixed precision for MXNet models: float32 to float16 /
    bfloat16, and INT8 quantization."""
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # MXNet logs every bind otherwise
    logging.basicConfig(format="%(levelname)s: %(name)s: %(message)s")
    ctx = click.get_current_context()
    command = main.commands.get(ctx.invoked_subcommand)
    has_ctx = command is not None and any(p.name == "ctx" for p in command.params)
    terms = _KeptFloat32InCommandTerms(
        "; --ctx any keeps them in {dtype} (for a device that has the kernels)" if has_ctx
        else "")
    converter_log = logging.getLogger("mxamp.convert.api")
    converter_log.addFilter(terms)
    ctx.call_on_close(lambda: converter_log.removeFilter(terms))


class _KeptFloat32InCommandTerms(logging.Filter):
    """The converter's WARNING about operators kept in float32 for want of
    kernels, once per dtype and reason, with advice in the command's own
    options (`advice`) instead of the Python API's ctx / target_device."""

    def __init__(self, advice):
        super().__init__()
        self.advice, self.seen = advice, set()

    def filter(self, record):
        kept = getattr(record, "kept_float32", None)
        if kept is None:
            return True
        dtype, reason, counted = kept
        if (dtype, reason) in self.seen:
            return False
        self.seen.add((dtype, reason))
        record.msg = "%s: kept in float32 (%s): %s%s"
        record.args = (dtype, reason, counted, self.advice.format(dtype=dtype))
        return True


def _params_note(sizes, cast_optional_params):
    """Why the parameters take as much memory as in float32, if they do."""
    if sizes[0] != sizes[1] or cast_optional_params:
        return ""
    return ("stored float32, cast when read, as MXNet's AMP does; --cast-optional-params "
            "stores them in the low dtype where every reader takes them so")


def _shape_text(shapes):
    return ", ".join(f"{n}:{','.join(map(str, s))}" for n, s in shapes.items())


def _counts(counts):
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _errors_text(result):
    text = _fmt_errors(result["errors"])
    if result["pre_nms"]:
        text += "; fed into NMS " + ", ".join(f"{e:.2e}" for e in result["pre_nms"].values())
    return text + ("" if result["finite"] else "; NOT FINITE")


def _context(ctx):
    return mx.cpu() if ctx == "cpu" else None


def _conversion_options(dtype, config, fp32_ops=(), exclude=(), cast_optional_params=False):
    """convert_model keyword arguments from the policy file and the flags."""
    options = policy_file.read(config) if config else {}
    listed = sorted({"fp32_ops", "target_dtype_ops", "conditional_fp32_ops"} & set(options))
    if fp32_ops and listed:
        raise click.UsageError(f"--fp32-op and a --config that sets {', '.join(listed)}: "
                               "put the operator in the config's lists")
    if fp32_ops:
        options.update({k: v for k, v in inspection.policy_options(dtype, fp32_ops).items()
                        if k != "excluded_sym_names"})
    excluded = [*options.get("excluded_sym_names", []), *exclude]
    if excluded:
        options["excluded_sym_names"] = excluded
    if cast_optional_params:
        options["cast_optional_params"] = True
    return options


def _backend_counts(sym):
    """{"backend regions": n, "on MXNet": operators outside them} of a
    partitioned graph, what `operators` reports for it."""
    outside = [n for n in graph_json(sym)["nodes"]
               if n["op"] not in ("null", onednn.REGION_OP) + CAST_OPS]
    return {"backend regions": len(onednn.regions(sym)), "on MXNet": len(outside)}


def _unchanged(dtype, ctx):
    """Why a conversion that put no operator in `dtype` gave a float32 model."""
    if ctx == "cpu" and not (dtype == "bfloat16" and cpu.mxnet_has_bfloat16()):
        # The converter's warning, just before, says what --ctx any does.
        return (f"no operator runs in {dtype}: this CPU has no {dtype} kernels for them in "
                f"MXNet (mxamp.cpu.features('mxnet'): {cpu.features('mxnet')})")
    return f"no operator runs in {dtype}: the lists and exclusions keep every one in float32"


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
@_one_line_errors
def convert(prefix, epoch, exclude, fp32_ops, cast_optional_params, ctx, config, dtype,
            out_prefix, shapes, keep_io_types, backend, overwrite, as_json):
    """Convert PREFIX-symbol.json + PREFIX-NNNN.params, write the converted
    pair, reload it and run it against float32 on random inputs of the
    data shapes."""
    out_prefix = checkpoint.output_prefix(out_prefix, f"{prefix}-{dtype}")
    outputs = checkpoint.checkpoint_files(out_prefix, epoch)
    publish.refuse_existing(outputs, overwrite)
    options = _conversion_options(dtype, config, fp32_ops, exclude, cast_optional_params)
    if keep_io_types is not None:
        options["keep_io_types"] = keep_io_types
    reference = _read_float32(prefix, epoch, "convert")
    checkpoint.check_inputs(*reference, shapes, checkpoint.checkpoint_files(prefix, epoch)[1])
    converted = convert_model(*reference, target_dtype=dtype, data_names=list(shapes),
                              ctx=_context(ctx), backend=backend, **options)
    signals.safe_point()
    operators = inspection.precision_counts(converted)
    if backend:
        operators = _backend_counts(converted[0])
    elif not operators.get(dtype):
        warnings.warn(f"{_unchanged(dtype, ctx)}; the model written is float32")
    # an INT8 report published at this prefix describes another model
    stale_report = report.int8_report_files(*os.path.split(out_prefix))
    with checkpoint.publishing(out_prefix, epoch, overwrite, gone=stale_report) as staged:
        checkpoint.save_checkpoint(staged, *converted, epoch=epoch)
        reloaded = checkpoint.load_checkpoint(staged, epoch)
        result = verify.compare(reference, reloaded, verify.feeds_for(reloaded[0], shapes))
        signals.safe_point()
    sizes = [checkpoint.param_bytes(*model[1:]) for model in (reference, converted)]
    if as_json:
        _echo_json({"model": prefix, "dtype": dtype, "ctx": ctx, "files": list(outputs),
                    "operators": operators, "casts": summarize(converted[0]),
                    "param_bytes": {"float32": sizes[0], "converted": sizes[1]},
                    "input_shapes": shapes, **result})
        return 0 if result["finite"] else 1
    device = f"{backend} backend on this CPU" if backend else f"{ctx} device"
    click.echo(f"converted {prefix} to {dtype} (for {device}): {outputs[0]}, {outputs[1]}")
    click.echo(f"operators: {_counts(operators)}")
    click.echo(f"casts: {_counts(summarize(converted[0]))}")
    note = _params_note(sizes, cast_optional_params)
    click.echo(f"parameters: {report.size(sizes[0])} float32 -> {report.size(sizes[1])}"
               f"{f' ({note})' if note else ''}")
    how = ("native kernels" if result["verified"] == "native" else
           f"emulated in float32: no kernel here for {', '.join(result['emulated_ops'])}")
    click.echo(f"reloaded and ran on {_shape_text(shapes) or 'no data inputs'} ({how}): "
               f"relative error vs float32 {_errors_text(result)}")
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
@_one_line_errors
def inspect(prefix, epoch, exclude, fp32_ops, cast_optional_params, ctx, dtype, out_dir,
            overwrite, as_json):
    """Per-operator precision of a model (float32 or converted) and why,
    with cast counts and parameter memory before and after conversion."""
    if out_dir:
        publish.refuse_existing([out_dir], overwrite)
    *model, model_format = loading.read(prefix, epoch)
    if model_format not in ("float32", *LOW_DTYPES):
        return _inspect_packed(prefix, model, model_format, out_dir, as_json, ctx=ctx,
                               dtype=dtype, exclude=exclude, fp32_op=fp32_ops,
                               cast_optional_params=cast_optional_params)
    summary, converted = inspection.inspect_model(
        *model, dtype=dtype, ctx=_context(ctx), fp32_ops=fp32_ops,
        excluded=exclude, cast_optional_params=cast_optional_params)
    if as_json:
        _echo_json(summary)
    else:
        _print_summary(prefix, summary)
    if out_dir:
        with publish.output([out_dir], overwrite, directory=True) as staging:
            graph = graph_json(converted[0])
            report.write_inspect_report(staging, os.path.basename(prefix), summary, graph,
                                        set(converted[1]) | set(converted[2]))
        click.echo(f"report: {os.path.join(out_dir, 'inspect.html')}", err=as_json)
    return 0


def _inspect_packed(prefix, model, model_format, out_dir, as_json, **conversion):
    """inspect of a model on the oneDNN backend or in MXNet's INT8 format:
    its regions and the operators outside them."""
    given = [f"--{k.replace('_', '-')}" for k, v in conversion.items()
             if v and v != "any"]
    if given or out_dir:
        raise click.UsageError(f"{prefix} is {model_format}: inspecting it takes no "
                               f"{', '.join(given or ['--out'])} (options for float32 and "
                               "float16 / bfloat16 models)")
    summary = inspection.packed_summary(*model, model_format)
    if as_json:
        _echo_json(summary)
        return 0
    click.echo(f"{prefix}: {model_format}")
    for region in summary["regions"]:
        click.echo(f"region {region['name']} ({region['compute']}): "
                   f"{_counts(region['operators'])}")
    click.echo(f"outside the regions: {_counts(summary['operators_outside_regions'])}")
    click.echo(f"parameters: {_sizes(summary['param_bytes_by_dtype'])}")
    return 0


def _sizes(by_dtype):
    """'1.2 KiB (int8 1.0 KiB, float32 200 B)', or '1.2 KiB float32' for one dtype."""
    total = report.size(sum(by_dtype.values()))
    if len(by_dtype) == 1:
        return f"{total} {next(iter(by_dtype))}"
    return f"{total} ({', '.join(f'{t} {report.size(n)}' for t, n in sorted(by_dtype.items()))})"


def _read_float32(prefix, epoch, verb):
    """The float32 model at `prefix`; an error names the format of one that
    is quantized, on the oneDNN backend or converted already, before any
    other check (a converted model without --shape was told to give one)."""
    *model, model_format = loading.read(prefix, epoch)
    if model_format not in ("float32", *LOW_DTYPES):
        raise click.ClickException(f"{prefix} is {model_format}; {verb} the original float32 "
                                   "model instead")
    sym, arg_params, aux_params = model
    check_float32_graph(graph_json(sym), verb, {**arg_params, **aux_params})
    return tuple(model)


def _print_summary(prefix, summary):
    click.echo(report.text_table(report.OPERATOR_HEADERS, report.operator_rows(summary)))
    kind = "converted" if summary["was_converted"] else "float32, converted here"
    click.echo(f"\n{prefix} ({kind}) -> {summary['dtype']}")
    click.echo(f"operators: {_counts(summary['ops_by_precision'])}")
    click.echo(f"casts: {_counts(summary['casts'])}")
    click.echo(f"parameters: {report.size(summary['param_bytes']['float32'])} float32 -> "
               f"{report.size(summary['param_bytes']['converted'])}")




@main.command(short_help="Convert GluonCV zoo networks in batch, verify and report.",
              epilog="""\b
Examples:
  mxamp zoo resnet50_v1 --dtype bfloat16 --out zoo_out
  mxamp zoo --family classification --dtype float16 --dtype bfloat16 --out zoo_out --workers 2
  mxamp zoo --family detection --list
""")
@verbosity
@click.argument("models", nargs=-1)
@click.option("--all", "all_models", is_flag=True, help="Every zoo network of every family.")
@click.option("--family", type=click.Choice(["classification", "detection", "segmentation",
                                              "pose", "action"]),
              help="Every zoo network of this family.")
@click.option("--dtype", "dtypes", type=DTYPES, multiple=True,
              help="Low-precision dtype (fp16, bf16 too; repeat for both); required unless "
              "--list.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory for the converted models and report.{json,md,html}.")
@click.option("--workers", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Convert in this many processes.")
@click.option("--scheduler", metavar="tcp://HOST:PORT",
              help="Run each network as a task on this Dask distributed scheduler.")
@click.option("--ctx", type=CTX, default="any", show_default=True, help=CTX_HELP)
@click.option("--shape", type=str, callback=parse_shape, metavar="D1,D2,...",
              help="Input shape for every network [default: the family's usual one].")
@click.option("--cast-optional-params", is_flag=True, help="Store parameters in low "
              "precision where every consumer reads them so (smaller files).")
@config_option
@click.option("--list", "list_only", is_flag=True, help="Print the selected names and stop.")
@overwrite_option("an existing --out directory")
@json_option
@_one_line_errors
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
    _check_zoo_names(zoo_lib, models)
    names = list(dict.fromkeys(models)) or zoo_lib.model_names(family)
    if list_only:
        _echo_json(names) if as_json else click.echo("\n".join(names))
        return 0
    if not dtypes or not out_dir:
        raise click.UsageError("--dtype and --out are required (unless --list)")
    publish.refuse_existing([out_dir], overwrite)
    options = _conversion_options(dtypes[0], config, cast_optional_params=cast_optional_params)
    with publish.output([out_dir], overwrite, directory=True) as staging:
        results = _zoo_batch(zoo_lib, staging, names, dtypes, ctx, shape, workers, scheduler,
                             options)
        meta = {"dtype": ", ".join(dtypes), "ctx": ctx, "models": len(names),
                **_zoo_counts(results), "workers": workers, "scheduler": scheduler,
                "mxamp": __version__, "cpu": cpu.describe(),
                "seconds": round(time.perf_counter() - start, 1)}
        report.write_zoo_report(staging, results, meta)
    for r in _zoo_outcomes(results)["unchanged"]:
        warnings.warn(f"{r['model']} ({r['dtype']}): {_unchanged(r['dtype'], ctx)}; the "
                      "exported model is float32")
    status = 1 if meta["failed"] or not meta["converted"] else 0
    if as_json:
        _echo_json({**meta, "report": os.path.join(out_dir, "report.html"), "results": results})
    else:
        _print_zoo(results, meta, out_dir, cast_optional_params, time.perf_counter() - start)
    return status


def _zoo_batch(zoo_lib, staging, names, dtypes, ctx, shape, workers, scheduler, options):
    """Converts the networks `names`, with a progress bar; their files go
    into `staging`; returns the results, sorted."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm
    results = []
    with logging_redirect_tqdm(), tqdm(total=len(names), unit="model", file=sys.stderr,
                                       disable=True if quiet() else None) as bar:
        def stage(name, what):
            signals.safe_point()
            bar.set_postfix_str(f"{name}: {what}")
        for model_results in zoo_lib.run_batch(names, list(dtypes), ctx, shape, workers,
                                               scheduler, options, stage):
            signals.safe_point()
            for result in model_results:
                files = result.pop("files", {})
                for file_name, data in files.items():
                    with open(os.path.join(staging, file_name), "wb") as f:
                        f.write(data)
                result["files"] = sorted(files)
                results.append(result)
            bar.set_postfix_str(f"{model_results[0]['model']}: done")
            bar.update()
    return sorted(results, key=lambda r: (r["model"], r["dtype"]))


def _zoo_outcomes(results):
    """The results that failed, whose float32 network failed, and that
    converted without an operator in the low dtype."""
    return {"failed": [r for r in results
                       if r["status"] != "ok" and r["failed_in"] != "float32"],
            "float32_failed": [r for r in results if r["failed_in"] == "float32"],
            "unchanged": [r for r in results if r["status"] == "ok"
                          and not r["ops_by_precision"].get(r["dtype"])]}


def _zoo_counts(results):
    outcomes = _zoo_outcomes(results)
    return {"converted": sum(r["status"] == "ok" for r in results) - len(outcomes["unchanged"]),
            **{k: len(v) for k, v in outcomes.items()}}


def _print_zoo(results, meta, out_dir, cast_optional_params, seconds):
    click.echo(report.text_table(report.ZOO_HEADERS, report.zoo_rows(results)))
    outcomes = _zoo_outcomes(results)
    for r in outcomes["float32_failed"] + outcomes["failed"]:
        click.echo(f"{r['model']} ({r['dtype']}) failed in {r['failed_in']}: {r['error']}")
    weights = sorted({r["weights"] for r in results})
    click.echo(f"weights: {'; '.join(weights)}")
    converted = [r for r in results if r["status"] == "ok"]
    if converted and all(r["param_bytes"]["float32"] == r["param_bytes"]["converted"]
                         for r in converted):
        click.echo(f"parameters: {_params_note((0, 0), cast_optional_params)}")
    click.echo(f"{meta['converted']} converted, {meta['failed']} failed, "
               f"{meta['float32_failed']} float32 network(s) not runnable here; {seconds:.1f} s "
               f"in all ('convert s': convert_model alone); report: "
               f"{os.path.join(out_dir, 'report.html')}")


def _check_zoo_names(zoo_lib, names):
    """An unknown network name is a usage error (exit status 2)."""
    try:
        zoo_lib.check_names(names)
    except ValueError as err:
        raise click.UsageError(str(err)) from None


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
@click.option("--calib-mode", type=click.Choice(["naive", "entropy"]), default="entropy",
              show_default=True, help="naive: the largest magnitude seen; entropy: MXNet's "
              "KL-divergence threshold.")
@click.option("--num-calib-examples", type=click.IntRange(min=1),
              help="Calibrate on at most this many examples [default: all].")
@click.option("--exclude", multiple=True, metavar="NODE",
              help="Keep this layer out of INT8 (repeatable).")
@click.option("--exclude-op", "exclude_ops", multiple=True, metavar="OP", callback=check_ops,
              help="Keep every node of this operator out of INT8 (repeatable).")
@click.option("--rest-dtype", type=RestDtype(), default="float32",
              show_default=True, help="dtype of what stays out of INT8 (excluded layers, "
              "non-linear operators) inside the oneDNN regions; bfloat16 needs a CPU with "
              "bfloat16 instructions, float32 is used (and said) elsewhere.")
@data_shapes
@click.option("--max-drop", type=click.FloatRange(min=0), metavar="ACCURACY",
              help="Keep the fewest layers in float32 such that top-1 accuracy on the "
              "labelled calibration data (a .npz with a 'label' array) drops by at most "
              "this much (mxamp.quantization.tune_int8).")
@click.option("--out", "out_prefix", help="Output prefix [default: PREFIX-int8, or NAME-int8].")
@overwrite_option("existing output files")
@json_option
@_one_line_errors
def quantize(prefix, zoo_name, epoch, calib, calib_mode, num_calib_examples, exclude,
             exclude_ops, rest_dtype, shapes, max_drop, out_prefix, overwrite, as_json):
    """INT8 post-training quantization of PREFIX-symbol.json +
    PREFIX-NNNN.params (or of a --zoo network) with calibration data, run on
    mxamp's oneDNN 3 backend; writes the quantized pair (mxamp.load(OUT)
    loads it) and compares it with float32 on the calibration data (top-1
    accuracy too when labels are given). --max-drop keeps the fewest layers
    in float32 within a top-1 accuracy budget on labelled data."""
    from . import calib_data
    if bool(prefix) == bool(zoo_name):
        raise click.UsageError("give PREFIX or --zoo NAME (one of them)")
    out_prefix = checkpoint.output_prefix(out_prefix, f"{prefix or zoo_name}-int8")
    where, name = os.path.split(out_prefix)  # the INT8 report: PREFIX.html / .json beside them
    outputs = [*checkpoint.checkpoint_files(out_prefix, epoch),
               *report.int8_report_files(where, name)]
    publish.refuse_existing(outputs, overwrite)
    reference, data_names, shapes = _quantize_source(prefix, zoo_name, epoch, shapes)
    arrays, labels = calib_data.load(calib, data_names, shapes)
    _check_calibration(reference, arrays, calib)
    if max_drop is not None and labels is None:
        raise click.UsageError("--max-drop measures top-1 accuracy: give --calib a .npz file "
                               "with a 'label' array (one class per example)")
    options = {"calib_mode": calib_mode, "num_calib_examples": num_calib_examples,
               "exclude": exclude, "exclude_ops": exclude_ops,
               "rest_dtype": _rest_dtype(rest_dtype)}
    quantized, tuning = _quantized(reference, data_names, arrays, labels, options, max_drop)
    scores = evaluation.int8_against_float32(reference, quantized, arrays, labels)
    with checkpoint.publishing(out_prefix, epoch, overwrite, outputs[2:]) as staged:
        checkpoint.save_checkpoint(staged, *quantized, epoch=epoch)
        report.write_int8_report(os.path.dirname(staged), name, reference, quantized,
                                 {n: (1, *a.shape[1:]) for n, a in arrays.items()}, name=name)
    count = len(next(iter(arrays.values())))
    result = {"model": prefix or zoo_name, "files": list(outputs), "calib_mode": calib_mode,
              "rest_dtype": options["rest_dtype"],
              "calibration_examples": min(count, num_calib_examples or count),
              "int8_regions": len(onednn.regions(quantized[0])),
              "param_bytes": {"float32": checkpoint.param_bytes(*reference[1:]),
                              "int8_model": checkpoint.param_bytes_by_dtype(*quantized[1:])},
              **scores, **({"tuning": tuning} if tuning else {})}
    if as_json:
        _echo_json(result)
    else:
        _print_int8(result, count)
    return 0


def _rest_dtype(rest_dtype):
    """--rest-dtype, or float32 (with a warning) where the CPU lacks bfloat16."""
    from ..quantization.api import rest_dtype_unavailable
    if rest_dtype == "bfloat16" and not cpu.features("onednn").bf16:
        click.echo(f"Warning: {rest_dtype_unavailable('--rest-dtype')}", err=True)
        return "float32"
    return rest_dtype


def _quantized(reference, data_names, arrays, labels, options, max_drop):
    """(the INT8 model, what --max-drop's tuning found or None)."""
    from ..quantization import quantize_model, tune_int8
    from ..quantization.api import excluded_nodes
    count = len(next(iter(arrays.values())))
    calib_iter = mx.io.NDArrayIter({n: to_ndarray(a, np.float32) for n, a in arrays.items()},
                                   batch_size=min(count, 32))
    exclude, exclude_ops = options["exclude"], options["exclude_ops"]
    common = {"num_calib_examples": options["num_calib_examples"],
              "rest_dtype": options["rest_dtype"], "data_names": data_names}
    with _progress() as progress:
        if max_drop is None:
            return quantize_model(*reference, label_names=(), calib_mode=options["calib_mode"],
                                  calib_data=calib_iter, excluded_sym_names=list(exclude) or None,
                                  excluded_op_names=list(exclude_ops) or None,
                                  progress=progress, **common), None

        def accuracy(model):
            return evaluation.top1(evaluation.outputs(model, arrays)[0], labels)
        tuned = tune_int8(
            reference, calib_iter, accuracy, max_drop, options["calib_mode"], exclude_layers=[
                *exclude, *excluded_nodes(reference[0], None, None, exclude_ops)] or None,
            progress=progress, **common)
    return tuned.model, {"max_drop": max_drop, "float32_layers": tuned.excluded,
                         "accuracy_drop": tuned.metric_drop, "evaluations": tuned.evaluations}


def _print_int8(result, count):
    files, rest_dtype = result["files"], result["rest_dtype"]
    click.echo(f"quantized {result['model']} to INT8 ({result['calib_mode']} calibration on "
               f"{result['calibration_examples']} examples): {files[0]}, {files[1]}; "
               f"report: {files[3]}")
    click.echo(f"oneDNN INT8 regions: {result['int8_regions']} (the rest in {rest_dtype}); "
               f"relative error vs float32 {_fmt_errors(result['errors'])}")
    click.echo(f"parameters: {report.size(result['param_bytes']['float32'])} float32 -> "
               f"{_sizes(result['param_bytes']['int8_model'])}")
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
@_one_line_errors
def optimize(prefix, zoo_name, epoch, calib, max_error, runs, shapes, report_dir, as_json):
    """Builds every way mxamp can run the model on this CPU (float32 on the
    oneDNN backend, bfloat16 on MXNet and on the backend, INT8), times them
    interleaved and prints the table with the fastest whose error is within
    --max-error (mxamp.optimize). Writes no model (convert or quantize with
    the chosen way); --report writes the INT8 candidate's report."""
    from ..gluon import symbol_block
    from ..tools.optimize import optimize as measure
    from . import calib_data
    if bool(prefix) == bool(zoo_name):
        raise click.UsageError("give PREFIX or --zoo NAME (one of them)")
    (sym, args, aux), data_names, shapes = _quantize_source(prefix, zoo_name, epoch, shapes)
    arrays, _ = calib_data.load(calib, data_names, shapes)
    _check_calibration((sym, args, aux), arrays, calib)
    count = min(len(next(iter(arrays.values()))), 32)
    batches = [[to_ndarray(arrays[n][:count], np.float32) for n in data_names]]
    net = symbol_block(sym, [mx.sym.var(n) for n in data_names], args, aux, mx.cpu())
    net.hybridize(static_alloc=True, static_shape=True)
    with _progress() as progress:
        result = measure(net, batches, max_error=max_error, runs=runs, progress=progress)
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
        _echo_json({"model": prefix or zoo_name, "chosen": result.name, "max_error": max_error,
                    "cpu": cpu.describe(), "candidates": [
                        {"name": c.name, "ms": c.ms, "error": c.error, "note": c.note}
                        for c in result.candidates]})
        return 0
    click.echo(result.table())
    return 0


def _check_calibration(model, arrays, calib):
    """The calibration arrays fit the model's data inputs. An image batch in
    channels-last layout (N, H, W, C) is named as such: the model's
    parameters are right, the data is not."""
    shapes = {n: (1, *a.shape[1:]) for n, a in arrays.items()}
    try:
        checkpoint.check_inputs(*model, shapes, "the model's parameters",
                                f"its examples ({_shape_text(shapes)})")
    except ValueError as err:
        for name, shape in shapes.items():
            if len(shape) != 4:
                continue
            channels_first = (1, shape[3], shape[1], shape[2])
            with contextlib.suppress(ValueError):
                checkpoint.check_inputs(*model, {**shapes, name: channels_first}, "")
                raise click.ClickException(
                    f"calibration data {calib}: {name!r} has shape {arrays[name].shape}, "
                    f"channels last (N, H, W, C); the model reads channels first (N, C, H, W), "
                    f"here (N, {', '.join(map(str, channels_first[1:]))}): transpose it, "
                    "e.g. numpy.transpose(x, (0, 3, 1, 2))") from None
        raise click.ClickException(f"calibration data {calib} does not fit the model: "
                                   f"{err}") from None


def _quantize_source(prefix, zoo_name, epoch, shapes):
    """((sym, arg_params, aux_params), data names, data shapes) of the model
    to quantize; a zoo network's data shape is its family's usual one unless
    given."""
    if zoo_name:
        from ..gluon import model_of
        from . import zoo as zoo_lib
        _check_zoo_names(zoo_lib, [zoo_name])
        shape = next(iter(shapes.values()), None) or zoo_lib.input_shape(zoo_name)
        net, _ = zoo_lib.build(zoo_name, shape)
        *model, data_names = model_of(net, "quantizing it")
        return tuple(model), list(data_names), {data_names[0]: shape}
    model = _read_float32(prefix, epoch, "quantize")
    params = {**model[1], **model[2]}
    return model, [n for n in model[0].list_inputs() if n not in params], shapes


def _fmt_errors(errors):
    return ", ".join(f"output {i} {e:.2e}" for i, e in enumerate(errors))
