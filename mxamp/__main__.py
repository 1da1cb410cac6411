"""``python -m mxamp``: the mxamp command line."""
from .tools.cli import main

main(prog_name="mxamp")
