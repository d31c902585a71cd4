"""The one exception type of the configuration system."""


class ConfigError(ValueError):
    """A configuration problem; the message names the key(s) and how to fix it."""
