"""Errors that end a command with one line naming what was wrong."""


class ServingError(Exception):
    """A user-facing failure: bad profile, bad flag value, engine that would not start.

    The message is shown as-is on one line, so it names the field and the reason.
    """
