"""The network's one error type, apart so that the attention kinds (which check their own settings) and the config
(which asks them) can both raise it."""


class ConfigError(ValueError):
    """A setting that cannot work; the message is one line naming the setting and its value."""


def check_whole_number(name: str, value, least: int, most: int | None = None) -> None:
    """ConfigError (one line naming the setting and its value) unless value is an integer in least..most (no upper
    bound when most is None); True/False are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least or (most is not None and value > most):
        bound = f">= {least}" if most is None else f"in {least}..{most}"
        raise ConfigError(f"{name} must be a whole number {bound}, got {value!r}")
