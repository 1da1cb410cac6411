"""mxamp's version (pyproject.toml's): the package re-exports it as
`mxamp.__version__`; the commands, which sit below the package, read it
here."""
__version__ = "0.1.0"
