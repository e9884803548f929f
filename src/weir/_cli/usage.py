"""The one error type a command raises for a problem it reports as one line."""


class UsageError(Exception):
    """A problem with how weir was called or installed, reported as one line."""
