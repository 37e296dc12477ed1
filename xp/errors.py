"""Errors that end a run with one clear line instead of a traceback."""

import logging
import re


class XPError(Exception):
    """An error whose message is meant for the user, printed as one line."""

    exit_code = 1


class ConfigError(XPError):
    """The experiment as configured cannot run: names the key, the value and what is valid."""

    exit_code = 2


class PluginError(XPError):
    """A backend plugin is missing, ambiguous or fails to import."""

    exit_code = 2


class Diverged(XPError):
    """The training loss became NaN or infinite: the run stops at that batch (exit code 1)."""

    exit_code = 1


class Terminated(BaseException):
    """SIGTERM arrived (e.g. a spot interruption notice): end like Ctrl-C."""


_CREDENTIALS = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^:/@\s]*):([^@\s]+)@")


def redact(text: str) -> str:
    """Hide the password of every URL in `text` (postgresql://user:secret@host -> postgresql://user:***@host)."""
    return _CREDENTIALS.sub(r"\1:***@", text)


def one_line(text: object) -> str:
    """Collapse a (possibly multi-line) message into one line, passwords hidden."""
    return redact(" ".join(str(text).split()))


class RedactFilter(logging.Filter):
    """Logging filter (conf/config.yaml's job_logging): passwords in URLs never reach a log."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        hidden = redact(message)
        if hidden != message:
            record.msg, record.args = hidden, ()
        return True
