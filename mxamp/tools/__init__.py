"""The command line and what it is made of: checkpoint files, inspection of
a conversion, the GluonCV zoo batch and the reports."""
