"""`python -m mxamp.build`: compile mxamp's C++ libraries into the cache (the
graph pass, and the oneDNN backend when the onednn packages are installed)."""
import argparse
import sys

from . import native


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mxamp.build", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    try:
        print(native.build(force=args.force))
        try:
            native.onednn_prefix()
        except RuntimeError as err:
            print(f"skipping the oneDNN backend: {err}", file=sys.stderr)
            return
        print(native.build(force=args.force, lib=native.ONEDNN))
    except RuntimeError as err:  # no compiler, compile errors, unusable cache
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
