"""The ``mxamp`` command line: convert exported models, inspect what
conversion does, and convert GluonCV zoo networks in batch (see docs/cli.md)."""
import contextlib
import fcntl
import functools
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import warnings

import click
import mxnet as mx
from mxnet.base import MXNetError

from .. import __version__, cpu, verify
from ..convert import convert_model
from ..dtypes import LOW_DTYPES
from ..errors import mxnet_message
from ..graph import graph_json, summarize
from . import checkpoint, inspection, report

DTYPES = click.Choice(LOW_DTYPES)
CTX = click.Choice(["any", "cpu"])
# MXNet's pip builds index arrays with 32-bit integers (no INT64_TENSOR_SIZE).
MAX_ELEMENTS = None if mx.runtime.Features().is_enabled("INT64_TENSOR_SIZE") else 2**31 - 1
CTX_HELP = ("any: the full graph for any device; cpu: ops without a low-precision kernel on "
            "this CPU stay float32. Verified with this CPU's kernels where it has them all, "
            "else with low-precision ops emulated in float32")


class _Cli(click.Group):
    """Every error ends as one line on stderr and a non-zero exit status."""

    def main(self, args=None, prog_name=None, **extra):
        try:
            with checkpoint.signals_raise():  # so that staging directories are removed
                status = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as err:
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx else ""
            click.echo(f"Error: {' '.join(err.format_message().split())}{where}", err=True)
            sys.exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"Error: {' '.join(err.format_message().split())}", err=True)
            sys.exit(err.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except checkpoint.Interrupted as err:
            click.echo("Terminated." if err.signum == signal.SIGTERM else "Aborted.", err=True)
            sys.exit(128 + err.signum)
        sys.exit(status or 0)


def _one_line_errors(command):
    """Turns the errors of bad input into a ClickException with the first
    line of their message (MXNet's carry C++ stack frames)."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except MXNetError as err:
            raise click.ClickException(mxnet_message(err)) from None
        except (ValueError, TypeError, RuntimeError, OSError, MemoryError) as err:
            lines = str(err).strip().splitlines()
            raise click.ClickException(lines[0] if lines else type(err).__name__) from None
    return run


def _dims(text):
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        return None
    return dims if dims and min(dims) > 0 else None


def _check_size(text, shape):
    size = math.prod(shape)
    if MAX_ELEMENTS is not None and size > MAX_ELEMENTS:
        raise click.BadParameter(f"{text!r} has {size} elements; this MXNet build holds at most "
                                 f"{MAX_ELEMENTS} in one array (built without INT64_TENSOR_SIZE)")


def _parse_named_shapes(ctx, param, values):
    shapes = {}
    for text in values:
        name, _, dims = text.rpartition(":")
        shape = _dims(dims)
        if not name or shape is None:
            raise click.BadParameter(f"{text!r} is not NAME:D1,D2,... with positive integer "
                                     "dimensions (e.g. data:1,3,224,224)")
        _check_size(text, shape)
        shapes[name] = shape
    return shapes


def _parse_shape(ctx, param, value):
    if value is None:
        return None
    shape = _dims(value)
    if shape is None:
        raise click.BadParameter(f"{value!r} is not D1,D2,... with positive integer "
                                 "dimensions (e.g. 1,3,64,64)")
    _check_size(value, shape)
    return shape


def _show_warning(message, *_args, **_kwargs):
    click.echo(f"Warning: {message}", err=True)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mxamp")
@click.option("-v", "--verbose", is_flag=True, help="Log the converter's decisions.")
def main(verbose):
    """Automatic mixed precision for MXNet models: float32 to float16 / bfloat16."""
    warnings.showwarning = _show_warning
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # MXNet logs every bind otherwise
    if verbose:
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")


def _refuse_existing(paths, overwrite):
    existing = [p for p in paths if os.path.lexists(p)]
    if existing and not overwrite:
        raise click.ClickException(f"{existing[0]} exists; pass --overwrite to replace it")
    parent = os.path.dirname(os.path.abspath(paths[0]))
    if not os.path.isdir(parent):
        raise click.ClickException(f"output directory {parent} does not exist")


def _shape_text(shapes):
    return ", ".join(f"{n}:{','.join(map(str, s))}" for n, s in shapes.items())


def _counts(counts):
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"


def _errors_text(result):
    text = ", ".join(f"output {i} {e:.2e}" for i, e in enumerate(result["errors"]))
    if result["pre_nms"]:
        text += "; fed into NMS " + ", ".join(f"{e:.2e}" for e in result["pre_nms"].values())
    return text + ("" if result["finite"] else "; NOT FINITE")


def _model_options(command):
    """The options convert and inspect share: which checkpoint, and how to convert."""
    options = [
        click.argument("prefix"),
        click.option("--epoch", type=click.IntRange(0, 9999), default=0, show_default=True,
                     help="Reads PREFIX-NNNN.params for this epoch."),
        click.option("--exclude", multiple=True, metavar="NODE",
                     help="Keep this node in float32 (repeatable)."),
        click.option("--fp32-op", "fp32_ops", multiple=True, metavar="OP",
                     help="Add this operator to the float32 list (repeatable)."),
        click.option("--cast-optional-params", is_flag=True, help="Store parameters in low "
                     "precision where every consumer reads them so."),
        click.option("--ctx", type=CTX, default="any", show_default=True, help=CTX_HELP)]
    for option in reversed(options):
        command = option(command)
    return command


def _context(ctx):
    return mx.cpu() if ctx == "cpu" else None


@main.command()
@_model_options
@click.option("--dtype", type=DTYPES, required=True, help="Low-precision dtype.")
@click.option("--out", "out_prefix", help="Output prefix [default: PREFIX-DTYPE].")
@click.option("--shape", "shapes", multiple=True, callback=_parse_named_shapes,
              metavar="NAME:D1,D2,...", help="Shape of a data input, to verify the "
              "converted model on (repeat for several inputs).")
@click.option("--keep-io-types/--no-keep-io-types", default=True, show_default=True,
              help="Data inputs and outputs stay float32.")
@click.option("--overwrite", is_flag=True, help="Replace existing output files.")
@_one_line_errors
def convert(prefix, epoch, exclude, fp32_ops, cast_optional_params, ctx, dtype, out_prefix,
            shapes, keep_io_types, overwrite):
    """Convert PREFIX-symbol.json + PREFIX-NNNN.params, write the converted
    pair, reload it and run it against float32 on random inputs."""
    out_prefix = checkpoint.output_prefix(out_prefix, f"{prefix}-{dtype}")
    outputs = checkpoint.checkpoint_files(out_prefix, epoch)
    _refuse_existing(outputs, overwrite)
    reference = checkpoint.load_checkpoint(prefix, epoch)
    checkpoint.check_inputs(*reference, shapes, checkpoint.checkpoint_files(prefix, epoch)[1])
    converted = convert_model(
        *reference, target_dtype=dtype, data_names=list(shapes), ctx=_context(ctx),
        cast_optional_params=cast_optional_params, keep_io_types=keep_io_types,
        **inspection.policy_options(dtype, fp32_ops, exclude))
    parent = os.path.dirname(os.path.abspath(out_prefix))
    with _staging_dir(parent, os.path.basename(out_prefix)) as staging:
        staged = os.path.join(staging, os.path.basename(out_prefix))
        written = checkpoint.save_checkpoint(staged, *converted, epoch=epoch)
        reloaded = checkpoint.load_checkpoint(staged, epoch)
        result = verify.compare(reference, reloaded, verify.feeds_for(reloaded[0], shapes))
        with _directory_lock(parent):  # another run may have written the pair meanwhile
            _refuse_existing(outputs, overwrite)
            checkpoint.publish(written, outputs)
    click.echo(f"converted {prefix} to {dtype} (for {ctx} device): {outputs[0]}, {outputs[1]}")
    click.echo(f"operators: {_counts(inspection.precision_counts(converted))}")
    click.echo(f"casts: {_counts(summarize(converted[0]))}")
    click.echo(f"parameters: {report.size(checkpoint.param_bytes(*reference[1:]))} float32 -> "
               f"{report.size(checkpoint.param_bytes(*converted[1:]))}")
    how = ("native kernels" if result["verified"] == "native" else
           f"emulated in float32: no kernel here for {', '.join(result['emulated_ops'])}")
    click.echo(f"reloaded and ran on {_shape_text(shapes) or 'no data inputs'} ({how}): "
               f"relative error vs float32 {_errors_text(result)}")
    return 0 if result["finite"] else 1


@main.command()
@_model_options
@click.option("--dtype", type=DTYPES, help="For a float32 model: the dtype to convert to "
              "[default: bfloat16]. A converted model's own dtype is read off its casts.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Also write inspect.json / .md / .html (with a picture of the graph).")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out directory.")
@_one_line_errors
def inspect(prefix, epoch, exclude, fp32_ops, cast_optional_params, ctx, dtype, out_dir,
            overwrite):
    """Per-operator precision of a model (float32 or converted) and why,
    with cast counts and parameter memory before and after conversion."""
    if out_dir:
        _refuse_existing([out_dir], overwrite)
    model = checkpoint.load_checkpoint(prefix, epoch)
    summary, converted = inspection.inspect_model(
        *model, dtype=dtype, ctx=_context(ctx), fp32_ops=fp32_ops,
        excluded=exclude, cast_optional_params=cast_optional_params)
    click.echo(report.text_table(report.OPERATOR_HEADERS, report.operator_rows(summary)))
    kind = "converted" if summary["was_converted"] else "float32, converted here"
    click.echo(f"\n{prefix} ({kind}) -> {summary['dtype']}")
    click.echo(f"operators: {_counts(summary['ops_by_precision'])}")
    click.echo(f"casts: {_counts(summary['casts'])}")
    click.echo(f"parameters: {report.size(summary['param_bytes']['float32'])} float32 -> "
               f"{report.size(summary['param_bytes']['converted'])}")
    if out_dir:
        with _staged_dir(out_dir, overwrite) as staging:
            graph = graph_json(converted[0])
            report.write_inspect_report(staging, os.path.basename(prefix), summary, graph,
                                        set(converted[1]) | set(converted[2]))
        click.echo(f"report: {os.path.join(out_dir, 'inspect.html')}")
    return 0


@contextlib.contextmanager
def _staging_dir(parent, name):
    """A new hidden directory in `parent` (named after `name`), removed
    with whatever is left in it when the block ends."""
    staging = tempfile.mkdtemp(prefix=f".{name}.mxamp-", dir=parent)
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _directory_lock(directory):
    """An exclusive lock on `directory` while a run checks and moves its
    results into it, so concurrent runs cannot interleave those steps. It
    is an flock on the directory itself: no lock file is left behind, and
    the lock goes with the process."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def _staged_dir(path, overwrite):
    """A temporary sibling directory that replaces `path` only once
    everything in it is written; removed if anything fails. With
    `overwrite`, what was at `path` (a symlink is replaced, not followed)
    is removed once the new directory is in place."""
    path = os.path.normpath(path)  # "lnk/" would follow a symbolic link
    parent = os.path.dirname(os.path.abspath(path))
    with _staging_dir(parent, os.path.basename(os.path.abspath(path))) as staging:
        yield staging
        old = f"{staging}.old"
        with _directory_lock(parent), checkpoint.signals_held():  # both renames or neither
            _refuse_existing([path], overwrite)  # another run may have made it meanwhile
            if os.path.lexists(path):
                os.rename(path, old)
            os.rename(staging, path)
    if os.path.isdir(old) and not os.path.islink(old):
        shutil.rmtree(old)
    elif os.path.lexists(old):
        os.remove(old)


@main.command()
@click.argument("models", nargs=-1)
@click.option("--all", "all_models", is_flag=True, help="Every zoo network of every family.")
@click.option("--family", type=click.Choice(["classification", "detection", "segmentation",
                                              "pose", "action"]),
              help="Every zoo network of this family.")
@click.option("--dtype", "dtypes", type=DTYPES, multiple=True,
              help="Low-precision dtype (repeat for both); required unless --list.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory for the converted models and report.{json,md,html}.")
@click.option("--workers", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Convert in this many processes.")
@click.option("--scheduler", metavar="tcp://HOST:PORT",
              help="Run each network as a task on this Dask distributed scheduler.")
@click.option("--ctx", type=CTX, default="any", show_default=True, help=CTX_HELP)
@click.option("--shape", type=str, callback=_parse_shape, metavar="D1,D2,...",
              help="Input shape for every network [default: the family's usual one].")
@click.option("--list", "list_only", is_flag=True, help="Print the selected names and stop.")
@click.option("--overwrite", is_flag=True, help="Replace an existing --out directory.")
@_one_line_errors
def zoo(models, all_models, family, dtypes, out_dir, workers, scheduler, ctx, shape,
        list_only, overwrite):
    """Convert GluonCV zoo networks (MODELS, a --family, or --all), verify
    each against float32 and export it. Weights come from the GluonCV cache
    (~/.mxnet/models) when there, else are random; nothing is downloaded.
    Exit status 1 if any conversion failed (networks whose float32 forward
    fails are listed, not counted)."""
    from tqdm import tqdm

    from . import zoo as zoo_lib
    if sum(map(bool, (models, all_models, family))) != 1:
        raise click.UsageError("give MODEL names, --family or --all (one of them)")
    if workers > 1 and scheduler:
        raise click.UsageError("--workers and --scheduler exclude each other")
    zoo_lib.check_names(models)
    names = list(dict.fromkeys(models)) or zoo_lib.model_names(family)
    if list_only:
        click.echo("\n".join(names))
        return 0
    if not dtypes or not out_dir:
        raise click.UsageError("--dtype and --out are required (unless --list)")
    _refuse_existing([out_dir], overwrite)
    results = []
    with _staged_dir(out_dir, overwrite) as staging:
        batch = zoo_lib.run_batch(names, list(dtypes), ctx, shape, workers, scheduler)
        with tqdm(total=len(names), unit="model", file=sys.stderr, disable=None) as bar:
            for model_results in batch:
                for result in model_results:
                    files = result.pop("files", {})
                    for file_name, data in files.items():
                        with open(os.path.join(staging, file_name), "wb") as f:
                            f.write(data)
                    result["files"] = sorted(files)
                    results.append(result)
                bar.set_postfix_str(model_results[0]["model"])
                bar.update()
        results.sort(key=lambda r: (r["model"], r["dtype"]))
        failed = [r for r in results if r["status"] != "ok" and r["failed_in"] != "float32"]
        fp32_failed = [r for r in results if r["failed_in"] == "float32"]
        meta = {"dtype": ", ".join(dtypes), "ctx": ctx, "models": len(names),
                "converted": sum(r["status"] == "ok" for r in results),
                "failed": len(failed), "float32_failed": len(fp32_failed),
                "workers": workers, "scheduler": scheduler, "mxamp": __version__,
                "cpu": cpu.describe()}
        report.write_zoo_report(staging, results, meta)
    click.echo(report.text_table(report.ZOO_HEADERS, report.zoo_rows(results)))
    for r in fp32_failed + failed:
        click.echo(f"{r['model']} ({r['dtype']}) failed in {r['failed_in']}: {r['error']}")
    weights = sorted({r["weights"] for r in results})
    click.echo(f"weights: {'; '.join(weights)}")
    click.echo(f"{meta['converted']} converted, {len(failed)} failed, {len(fp32_failed)} "
               f"float32 network(s) not runnable here; report: "
               f"{os.path.join(out_dir, 'report.html')}")
    return 1 if failed else 0

