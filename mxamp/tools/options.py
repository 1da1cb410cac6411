"""The command line's parameters: click types for dtypes, parsers of shapes
and operator names, the options several commands share (which model, how to
convert, verbosity, JSON output) and each command's option groups, and the
parameters translated into what the library takes (devices, conversion
options, dtypes)."""
import difflib
import functools
import logging
import math
import re

import click
import mxnet as mx

from .. import backends, cpu
from ..dtypes import LOW_DTYPES
from ..errors import OptionError
from ..registry import check_op_names

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "f16": "float16", "half": "float16"}


class _Dtype(click.Choice):
    """float16 / bfloat16, or a common short name for one (bf16, fp16, half)."""

    def __init__(self):
        super().__init__(LOW_DTYPES, case_sensitive=False)

    def convert(self, value, param, ctx):
        name = DTYPE_ALIASES.get(str(value).lower(), value)
        if str(name).lower() in ("float32", "fp32", "f32"):
            self.fail(f"{value!r} is the model's own dtype: convert to float16 or bfloat16 "
                      "(fp16, bf16)", param, ctx)
        if str(name).lower() not in LOW_DTYPES:
            close = difflib.get_close_matches(str(value).lower(),
                                              [*LOW_DTYPES, *DTYPE_ALIASES], n=1, cutoff=0.5)
            hint = f"; did you mean {DTYPE_ALIASES.get(close[0], close[0])!r}?" if close else ""
            self.fail(f"{value!r} is not a dtype mxamp converts to: float16 (fp16, half) or "
                      f"bfloat16 (bf16){hint}", param, ctx)
        return super().convert(name, param, ctx)


DTYPES = _Dtype()


class RestDtype(click.Choice):
    """float32 / bfloat16 for what stays out of INT8, or a short name (fp32, bf16)."""

    ALIASES = {"fp32": "float32", "f32": "float32", "bf16": "bfloat16"}

    def __init__(self):
        super().__init__(["float32", "bfloat16"], case_sensitive=False)

    def convert(self, value, param, ctx):
        return super().convert(self.ALIASES.get(str(value).lower(), value), param, ctx)


CTX = click.Choice(["any", "cpu"])
# MXNet's pip builds index arrays with 32-bit integers (no INT64_TENSOR_SIZE).
MAX_ELEMENTS = None if mx.runtime.Features().is_enabled("INT64_TENSOR_SIZE") else 2**31 - 1
CTX_HELP = ("any: the full graph for any device; cpu: ops without a low-precision kernel on "
            "this CPU stay float32. Verified with this CPU's kernels where it has them all, "
            "else with low-precision ops emulated in float32")


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


# tvmc: "data:[1,3,224,224] mask:[1,4]"; OpenVINO ovc: "data[1,3,224,224],mask[1,4]"
SHAPE_STYLES = {"input_shapes": (re.compile(r"\s*([^\s\[\]]+):\[([\d,\s]*)\]\s*"),
                                 "data:[1,3,224,224] mask:[1,4]"),
                "inputs": (re.compile(r"\s*([^\[\],]+)\[([\d,\s]*)\]\s*,?"),
                           "data[1,3,224,224],mask[1,4]")}


def _parse_shape_list(ctx, param, values):
    pattern, example = SHAPE_STYLES[param.name]
    shapes = {}
    for text in values:
        pos = 0
        while pos < len(text):
            match = pattern.match(text, pos)
            shape = match and _dims(match.group(2).replace(" ", ""))
            if not shape:
                raise click.BadParameter(f"{text!r} is not a list of NAME[D1,D2,...] with "
                                         f"positive integer dimensions (e.g. {example!r})")
            _check_size(text, shape)
            shapes[match.group(1)] = shape
            pos = match.end()
    return shapes


def data_shapes(command):
    """--shape, --input-shapes and --input: three spellings of the data
    inputs' shapes, merged into the command's `shapes` argument."""
    @functools.wraps(command)
    def run(*args, shapes, input_shapes, inputs, **kwargs):
        merged = {}
        for given in (shapes, input_shapes, inputs):
            twice = sorted(set(merged) & set(given))
            if twice:
                raise click.UsageError(f"the shape of {twice[0]!r} is given twice")
            merged.update(given)
        return command(*args, shapes=merged, **kwargs)
    return _apply(run, [
        click.option("--shape", "shapes", multiple=True, callback=_parse_named_shapes,
                     metavar="NAME:D1,D2,...", help="Shape of a data input (repeat for "
                     "several inputs)."),
        click.option("--input-shapes", "input_shapes", multiple=True,
                     callback=_parse_shape_list, metavar='"NAME:[D1,...] ..."',
                     help="The same, as TVM's tvmc writes it: "
                     '"data:[1,3,224,224] mask:[1,4]".'),
        click.option("--input", "inputs", multiple=True, callback=_parse_shape_list,
                     metavar='"NAME[D1,...],..."', help="The same, as OpenVINO's ovc "
                     'writes it: "data[1,3,224,224],mask[1,4]".')])


def parse_shape(ctx, param, value):
    if value is None:
        return None
    shape = _dims(value)
    if shape is None:
        raise click.BadParameter(f"{value!r} is not D1,D2,... with positive integer "
                                 "dimensions (e.g. 1,3,64,64)")
    _check_size(value, shape)
    return shape


def check_ops(ctx, param, values):
    """Operator names as MXNet registers them, checked before any work."""
    try:
        check_op_names(values, param.opts[0])
    except OptionError as err:
        raise click.UsageError(str(err)) from None
    return values


def _apply(command, options):
    """`command` with `options` (click decorators), in the order listed."""
    for option in reversed(options):
        command = option(command)
    return command


def _set_verbosity(ctx, param, value):
    if value:
        quiet = param.name == "quiet"
        ctx.meta["mxamp.quiet"] = quiet
        for name in ("mxamp", "mxnet"):
            logging.getLogger(name).setLevel(logging.ERROR if quiet else logging.INFO)


def verbosity(command):
    """-v / -q, accepted before or after the command name."""
    return _apply(command, [
        click.option("-v", "--verbose", is_flag=True, expose_value=False,
                     callback=_set_verbosity,
                     help="Log the converter's decisions (logger mxamp)."),
        click.option("-q", "--quiet", is_flag=True, expose_value=False,
                     callback=_set_verbosity, help="Only errors and warnings; no progress bar.")])


def quiet():
    """Whether -q was given."""
    return click.get_current_context().meta.get("mxamp.quiet", False)


def json_option(command):
    return click.option("--json", "as_json", is_flag=True,
                        help="Print the results as JSON on stdout, instead of text.")(command)


def overwrite_option(what):
    return click.option("--overwrite", is_flag=True, help=f"Replace {what}.")


def model_options(command):
    """The options convert and inspect share: which checkpoint, and how to convert."""
    return _apply(command, [
        click.argument("prefix"),
        click.option("--epoch", type=click.IntRange(0, 9999), default=0, show_default=True,
                     help="Reads PREFIX-NNNN.params for this epoch."),
        click.option("--exclude", multiple=True, metavar="NODE",
                     help="Keep this node in float32 (repeatable)."),
        click.option("--fp32-op", "fp32_ops", multiple=True, metavar="OP", callback=check_ops,
                     help="Add this operator to the float32 list (repeatable)."),
        click.option("--cast-optional-params", is_flag=True, help="Store parameters in low "
                     "precision where every consumer reads them so."),
        ctx_option])


ctx_option = click.option("--ctx", type=CTX, default="any", show_default=True, help=CTX_HELP)


def model_source(verb):
    """PREFIX, or --zoo NAME, and --epoch: the model a command reads."""
    def options(command):
        @functools.wraps(command)
        def run(*args, prefix, zoo_name, **kwargs):
            if bool(prefix) == bool(zoo_name):
                raise click.UsageError("give PREFIX or --zoo NAME (one of them)")
            return command(*args, prefix=prefix, zoo_name=zoo_name, **kwargs)
        return _apply(run, [
            click.argument("prefix", required=False),
            click.option("--zoo", "zoo_name", metavar="NAME",
                         help=f"{verb} this GluonCV zoo network instead of PREFIX."),
            click.option("--epoch", type=click.IntRange(0, 9999), default=0,
                         show_default=True, help="Reads PREFIX-NNNN.params for this epoch.")])
    return options


def config_option(command):
    return click.option("--config", "config", type=click.Path(dir_okay=False),
                        help="A JSON or TOML policy file: operator lists, FOLLOW ops, "
                        "exclusions, attribute rules (see docs/cli.md).")(command)


def backend_option(command):
    return click.option(
        "--backend", type=click.Choice(backends.NAMES), default=None,
        help="Plan the conversion for this execution backend and run its regions there "
             "(bfloat16; see docs/onednn.md); the model written loads where "
             "mxamp.backends.get(NAME) has run.")(command)


def int8_options(command):
    """How mxamp quantize calibrates, what it keeps out of INT8 and its
    accuracy budget."""
    return _apply(command, [
        click.option("--calib-mode", type=click.Choice(["naive", "entropy"]), default="entropy",
                     show_default=True, help="naive: the largest magnitude seen; entropy: "
                     "MXNet's KL-divergence threshold."),
        click.option("--num-calib-examples", type=click.IntRange(min=1),
                     help="Calibrate on at most this many examples [default: all]."),
        click.option("--exclude", multiple=True, metavar="NODE",
                     help="Keep this layer out of INT8 (repeatable)."),
        click.option("--exclude-op", "exclude_ops", multiple=True, metavar="OP",
                     callback=check_ops,
                     help="Keep every node of this operator out of INT8 (repeatable)."),
        click.option("--rest-dtype", type=RestDtype(), default="float32",
                     show_default=True, help="dtype of what stays out of INT8 (excluded "
                     "layers, non-linear operators) inside the oneDNN regions; bfloat16 needs "
                     "a CPU with bfloat16 instructions, float32 is used (and said) elsewhere."),
        data_shapes,
        click.option("--max-drop", type=click.FloatRange(min=0), metavar="ACCURACY",
                     help="Keep the fewest layers in float32 such that top-1 accuracy on the "
                     "labelled calibration data (a .npz with a 'label' array) drops by at most "
                     "this much (mxamp.quantization.tune_int8).")])


ZOO_FAMILIES = ["classification", "detection", "segmentation", "pose", "action"]


def zoo_selection(command):
    """Which zoo networks mxamp zoo converts, and how many at once."""
    return _apply(command, [
        click.argument("models", nargs=-1),
        click.option("--all", "all_models", is_flag=True,
                     help="Every zoo network of every family."),
        click.option("--family", type=click.Choice(ZOO_FAMILIES),
                     help="Every zoo network of this family."),
        click.option("--dtype", "dtypes", type=DTYPES, multiple=True,
                     help="Low-precision dtype (fp16, bf16 too; repeat for both); required "
                     "unless --list."),
        click.option("--out", "out_dir", type=click.Path(file_okay=False),
                     help="Directory for the converted models and report.{json,md,html}."),
        click.option("--workers", type=click.IntRange(1, 1024), default=1, show_default=True,
                     help="Convert in this many processes."),
        click.option("--scheduler", metavar="tcp://HOST:PORT",
                     help="Run each network as a task on this Dask distributed scheduler.")])


def check_zoo_names(zoo_lib, names):
    """An unknown network name is a usage error (exit status 2)."""
    try:
        zoo_lib.check_names(names)
    except ValueError as err:
        raise click.UsageError(str(err)) from None


def refuse_conversion_flags(prefix, model_format, out_dir, **conversion):
    """Inspecting a model on a backend or in INT8 (`model_format`) takes
    none of the options that convert (`conversion`: {flag: value}), nor --out."""
    given = [f"--{k.replace('_', '-')}" for k, v in conversion.items()
             if v and v != "any"]
    if given or out_dir:
        raise click.UsageError(f"{prefix} is {model_format}: inspecting it takes no "
                               f"{', '.join(given or ['--out'])} (options for float32 and "
                               "float16 / bfloat16 models)")


def context(ctx):
    """--ctx as convert_model's `ctx`: the CPU, or None for any device."""
    return mx.cpu() if ctx == "cpu" else None


def conversion_fields(dtype, config, fp32_ops=(), exclude=(), cast_optional_params=False,
                      keep_io_types=None):
    """ConversionOptions fields from the policy file and the flags (the
    dtype, data names, device and backend are each command's own)."""
    from .inspection import policy_options
    from .policy_file import read
    fields = read(config) if config else {}
    listed = sorted({"fp32_ops", "target_dtype_ops", "conditional_fp32_ops"} & set(fields))
    if fp32_ops and listed:
        raise click.UsageError(f"--fp32-op and a --config that sets {', '.join(listed)}: "
                               "put the operator in the config's lists")
    if fp32_ops:
        fields.update({k: v for k, v in policy_options(dtype, fp32_ops).items()
                       if k != "excluded_sym_names"})
    excluded = [*fields.get("excluded_sym_names", []), *exclude]
    if excluded:
        fields["excluded_sym_names"] = excluded
    if cast_optional_params:
        fields["cast_optional_params"] = True
    if keep_io_types is not None:
        fields["keep_io_types"] = keep_io_types
    return fields


def available_rest_dtype(value):
    """--rest-dtype, or float32 (with a warning) where the CPU lacks bfloat16."""
    from ..quantization.api import rest_dtype_unavailable
    if value == "bfloat16" and not cpu.features("onednn").bf16:
        click.echo(f"Warning: {rest_dtype_unavailable('--rest-dtype')}", err=True)
        return "float32"
    return value
