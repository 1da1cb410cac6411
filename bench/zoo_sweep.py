"""Sweep GluonCV zoo networks through mxamp in both dtypes: `mxamp zoo` with
this benchmark's defaults (see docs/cli.md).

    python bench/zoo_sweep.py [MODEL ... | --family NAME | --all] [--workers N]
                              [--out DIR] [any other `mxamp zoo` option]

Defaults: --family classification when nothing is selected, both dtypes,
--out zoo_sweep (replaced if it exists). The results table, report.json,
report.md and report.html hold the per-network relative error against
float32; the exit status says whether any conversion failed.
"""
import sys

from mxamp.tools.cli import main


def with_defaults(args):
    args = list(args)
    if not args or args[0].startswith("-") and not {"--family", "--all"} & set(args):
        args = ["--family", "classification", *args]
    if "--dtype" not in args:
        args += ["--dtype", "bfloat16", "--dtype", "float16"]
    if "--out" not in args:
        args += ["--out", "zoo_sweep", "--overwrite"]
    return args


if __name__ == "__main__":
    main(["zoo", *with_defaults(sys.argv[1:])], prog_name="zoo_sweep.py")
