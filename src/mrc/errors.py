"""The one exception type for bad input: its message is the one line the user sees."""


class MRCError(Exception):
    """Bad input or configuration. Message: '<file>: id <id>: <what is wrong>' where those apply."""


def first_line(err: Exception) -> str:
    """'<Type>: <first line of the message>' (200 characters at most): a foreign exception inside an MRCError."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"
