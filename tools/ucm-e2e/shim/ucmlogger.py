"""Stands in for UCM's compiled logger, ucm.shared.infra.ucmlogger (a pybind11 module over
spdlog that ucm/logger.py imports): the same functions and Level enum, writing each record to
stderr instead of UCM's rotating log files. The e2e runner copies it to
ucm/shared/infra/ucmlogger.py in the UCM tree it extracts; it is the only part of UCM replaced."""

import enum
import sys


class Level(enum.IntEnum):
    """UCM's log levels (spdlog's order)."""

    DEBUG = 1
    INFO = 2
    WARNING = 3
    ERROR = 4
    CRITICAL = 5
    FATAL = 5


_threshold = Level.INFO


def setup(path, max_files, max_size):
    """UCM's setup(log_path, max_files, max_size_mb): nothing to set up for stderr."""


def flush():
    """Flushes stderr."""
    sys.stderr.flush()


def isEnabledFor(level):  # noqa: N802 - UCM's name
    """True for INFO and above."""
    return level >= _threshold


def log(level, file, func, line, msg):
    """Writes one record to stderr when its level is enabled."""
    if level >= _threshold:
        sys.stderr.write("[ucm %s] %s:%d %s: %s\n" % (Level(level).name, file, line, func, msg))


def log_rate_limit(level, file, func, line, msg):
    """As log (no rate limit: the scripts log little)."""
    log(level, file, func, line, msg)
