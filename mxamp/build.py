"""`python -m mxamp.build`: make mxamp's C++ libraries ready and print where
they are (the graph pass, and the oneDNN backend when oneDNN 3 is
installed). An installed wheel ships them; a source checkout compiles them
into the cache."""
import argparse
import sys

from . import native


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mxamp.build", description=__doc__)
    parser.add_argument("--force", action="store_true",
                        help="rebuild from the sources even if up to date")
    args = parser.parse_args(argv)
    try:
        print(native.library_file(native.PASS, force=args.force))
        if not native.shipped(native.ONEDNN) or args.force:
            try:
                native.onednn_prefix()
            except RuntimeError as err:
                print(f"skipping the oneDNN backend: {err}", file=sys.stderr)
                return
        print(native.library_file(native.ONEDNN, force=args.force))
    except RuntimeError as err:  # no compiler, compile errors, unusable cache
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
