"""The errors mxamp raises for bad options, and MXNet's error text made short."""

# Lines MXNet wraps around a message: Python-style traceback headers and
# frames of C++ source files, and C++ stack traces.
_FRAME_PREFIXES = ("Traceback (most recent call last):", 'File "', "[bt]", "Stack trace")
_TAG = "MXNetError: "


def mxnet_message(err):
    """The line of an MXNetError that says what went wrong: MXNet wraps its
    messages in traceback headers, source frames and stack traces, and
    repeats the ``MXNetError:`` tag when a message is raised again."""
    lines = [line.strip() for line in str(err).splitlines()]
    lines = [line for line in lines if line and not line.startswith(_FRAME_PREFIXES)]
    tagged = [line for line in lines if line.startswith(_TAG)]
    line = tagged[-1] if tagged else lines[0] if lines else type(err).__name__
    while line.startswith(_TAG):
        line = line[len(_TAG):]
    return line


class OptionError(ValueError, AssertionError):
    """An invalid option value. Also an AssertionError: mxnet.contrib.amp checks
    its options with assert, and code written for it catches that."""


class OptionTypeError(TypeError, AssertionError):
    """An option of the wrong type (an AssertionError too, as OptionError)."""
