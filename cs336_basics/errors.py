"""User-facing errors: raised before any training starts, printed by the scripts without a traceback."""


class ConfigError(ValueError):
    """A configuration, input file or environment that cannot be honoured; the message says what to do."""
