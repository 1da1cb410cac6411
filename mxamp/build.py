"""`python -m mxamp.build`: compile mxamp's C++ graph pass into the cache."""
import argparse

from . import _lib


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mxamp.build", description=__doc__)
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    print(_lib.build(force=args.force))


if __name__ == "__main__":
    main()
