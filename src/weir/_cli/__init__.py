"""The parts of the `weir` command line that its commands share (weir.cli is the entry point)."""
