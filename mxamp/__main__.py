"""``python -m mxamp``: the mxamp command line."""
from .cli import main

main(prog_name="mxamp")
