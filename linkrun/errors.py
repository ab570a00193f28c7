"""One root error: what went wrong, and what to do about it.

Imports nothing of ours, so every process (serve, supervisor, sweep) can use it.
"""


class LinkRunError(Exception):
    """A failure worth telling a person: `message` says what, `hint` what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class UsageError(LinkRunError):
    """A bad or missing flag: named in one line, exit 2."""

    exit_code = 2


class Refused(LinkRunError):
    """A tool call refused before anything ran: answered as a tool error."""
