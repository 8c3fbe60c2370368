"""User-facing errors: the one exception type the CLI turns into a one-line message and exit code 2."""


class SpeedlimitError(Exception):
    """Bad input or an unusable environment, with a message that says what to do.

    Raised anywhere in the library; `speedlimit.cli` prints ``error: <message>`` and exits 2,
    never a traceback.
    """
