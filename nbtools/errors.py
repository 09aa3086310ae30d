"""The exceptions nbtools raises on purpose, each carrying what a learner needs to act on it."""


class NbtoolsError(Exception):
    """Base class for every error nbtools raises on purpose."""


class DeviceError(NbtoolsError):
    """The requested device is not here, or the setup to use it is broken."""


class CommandNotHere(NbtoolsError):
    """The written program does not exist on this machine (e.g. ``npu-smi`` off an Ascend host)."""


class ParameterError(NbtoolsError, ValueError):
    """A notebook or CLI parameter has a value that cannot work; says which and what is accepted."""


class LaunchError(NbtoolsError):
    """A launched command failed: non-zero exit, error marker in its output, or timeout."""

    def __init__(self, message: str, result=None, rank: int | None = None, line: str | None = None):
        super().__init__(message)
        self.result = result
        self.rank = rank  # the rank that failed first, where the output says (diagnose.judged)
        self.line = line  # its error line (``ValueError: ...``), where one was found


class LaunchTimeout(LaunchError):
    """The launched command ran past its timeout and was stopped with all its processes."""


class OutputMismatch(NbtoolsError, AssertionError):
    """An output did not match its expected block (the quick-start's `xxx` / `...` rules)."""


# The quick-start's 12 checked commands, in order.
