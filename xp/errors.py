"""Errors that end a run with one clear line instead of a traceback."""


class XPError(Exception):
    """An error whose message is meant for the user, printed as one line."""

    exit_code = 1


class ConfigError(XPError):
    """The experiment as configured cannot run: names the key, the value and what is valid."""

    exit_code = 2


class PluginError(XPError):
    """A backend plugin is missing, ambiguous or fails to import."""

    exit_code = 2


class Terminated(BaseException):
    """SIGTERM arrived (e.g. a spot interruption notice): end like Ctrl-C."""


def one_line(text: object) -> str:
    """Collapse a (possibly multi-line) message into one line."""
    return " ".join(str(text).split())
