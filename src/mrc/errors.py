"""The one exception type for bad input: its message is the one line the user sees."""


class MRCError(Exception):
    """Bad input or configuration. Message: '<file>: id <id>: <what is wrong>' where those apply."""
