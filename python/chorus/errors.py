"""The exceptions chorus raises: chorus::Error and its children of the C++ side, one class each.

Every class derives from :class:`chorus.Error`, and also from the built-in exception a Python
user would catch for the same trouble: ``ConfigError`` is a ``ValueError``, ``CommError`` a
``RuntimeError``, ``TimeoutError`` the built-in ``TimeoutError`` (``except TimeoutError`` catches
it), ``OutOfMemoryError`` a ``MemoryError``. The extension module builds them from the C++ error
(python/src/errors.cc), so they carry its fields: ``TimeoutError.missing_ranks`` names the ranks
that did not arrive, ``PeerFailure.ranks`` the peers believed lost.
"""

import builtins


class Error(Exception):
    """Base of every chorus error. ``file`` and ``line`` say where the C++ side raised it."""

    kind = "Error"

    def __init__(self, message, file="", line=0, **fields):
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        for name, value in fields.items():
            setattr(self, name, value)


class ConfigError(Error, ValueError):
    """A configuration, argument or device spec that cannot be used as given."""

    kind = "ConfigError"


class DeviceError(Error, RuntimeError):
    kind = "DeviceError"


class OutOfMemoryError(DeviceError, MemoryError):
    """A memory budget (real or emulated, ``cpu/512MiB``) exceeded."""

    kind = "OutOfMemoryError"


class CommError(Error, RuntimeError):
    """A failure of communication: store, transport or collective."""

    kind = "CommError"


class AuthError(CommError):
    kind = "AuthError"


class ProtocolError(CommError):
    kind = "ProtocolError"


class TimeoutError(CommError, builtins.TimeoutError):  # noqa: A001 (chorus.TimeoutError)
    """An operation missed its deadline: ``operation``, ``sequence`` and ``missing_ranks``."""

    kind = "TimeoutError"

    def __init__(self, message, file="", line=0, operation="", sequence=-1, missing_ranks=()):
        super().__init__(message, file, line, operation=operation, sequence=sequence,
                         missing_ranks=list(missing_ranks))


class PeerFailure(CommError):
    """A peer died or dropped its connection: ``ranks`` names the peers believed lost."""

    kind = "PeerFailure"

    def __init__(self, message, file="", line=0, ranks=()):
        super().__init__(message, file, line, ranks=list(ranks))


class CheckpointError(Error, RuntimeError):
    kind = "CheckpointError"


class LaunchError(Error, RuntimeError):
    kind = "LaunchError"


_CLASSES = {cls.kind: cls for cls in (
    Error, ConfigError, DeviceError, OutOfMemoryError, CommError, AuthError, ProtocolError,
    TimeoutError, PeerFailure, CheckpointError, LaunchError)}


def error_class(kind):
    """The class for a C++ error's kind() (the base class for a kind this file does not know)."""
    return _CLASSES.get(kind, Error)
