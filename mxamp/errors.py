"""Error text shared by the converter and the command line."""


def mxnet_message(err):
    """The line of an MXNetError that says what went wrong (MXNet prepends
    a traceback and C++ stack frames to some messages)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    tagged = [line for line in lines if line.startswith("MXNetError:")]
    line = tagged[-1] if tagged else lines[0] if lines else type(err).__name__
    return line.replace("MXNetError: ", "", 1)
