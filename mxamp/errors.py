"""The errors mxamp raises for bad options, and MXNet's error text made short."""
import re

# Lines MXNet wraps around a message: Python-style traceback headers and
# frames of C++ source files, and C++ stack traces.
_FRAME_PREFIXES = ("Traceback (most recent call last):", 'File "', "[bt]", "Stack trace")
_TAG = "MXNetError: "


# An extension library's own message follows this header, as
# "[0] /path/file.cc[123]: message"; what MXNet says before it is generic.
_EXTENSION = "Extension Traceback:"
_EXTENSION_FRAME = re.compile(r"^\[\d+\] \S+\[\d+\]: ")


def mxnet_message(err):
    """The line of an MXNetError that says what went wrong: MXNet wraps its
    messages in traceback headers, source frames and stack traces, and
    repeats the ``MXNetError:`` tag when a message is raised again. For an
    error raised by an extension library (mxamp's backend), its own message."""
    text = str(err)
    if _EXTENSION in text:
        frames = [_EXTENSION_FRAME.sub("", line.strip())
                  for line in text.split(_EXTENSION, 1)[1].splitlines()
                  if _EXTENSION_FRAME.match(line.strip())]
        if frames:
            return frames[-1]  # MXNet keeps earlier calls' messages before it
    lines = [line.strip() for line in text.splitlines()]
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


class BackendError(RuntimeError):
    """A failure inside an execution backend's native library, with its
    message cut to one line (see :func:`mxnet_message`)."""
