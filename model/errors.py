"""The network's one error type, apart so that the attention kinds (which check their own settings) and the config
(which asks them) can both raise it."""


class ConfigError(ValueError):
    """A setting that cannot work; the message is one line naming the setting and its value."""
