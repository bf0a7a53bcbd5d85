"""Every bound on what a caller may ask, declared once, and the argument types every face and bench shares (Parser,
Bound.argument, whole_number, fraction, positive_number): predict.py and serve.py check their arguments against these
before anything loads, the server checks each request against its ServerLimits, the library checks its own calls
(inference/explain.py: ig_steps), and GET /info reports the ServerLimits that hold.

Imports nothing heavy, so `--help` and argument errors answer without loading torch.
"""

import argparse
import ipaddress
from dataclasses import asdict, dataclass


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage is in --help), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class Bound:
    """An inclusive range of numbers; high None: no upper bound."""

    low: float
    high: float | None = None

    def __str__(self) -> str:
        return f">= {number(self.low)}" if self.high is None else f"in {number(self.low)}..{number(self.high)}"

    def check(self, name: str, value) -> None:
        """ValueError (one line naming `name`) when value is outside the range."""
        if value < self.low or (self.high is not None and value > self.high):
            raise ValueError(f"{name} must be {self}, got {number(value)}")

    def argument(self, kind=int):
        """An argparse type: a number of `kind` in this range (argparse names the flag in its message)."""
        def parse(text: str):
            value = kind(text)
            try:
                self.check("the value", value)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e).removeprefix("the value ")) from None
            return value

        parse.__name__ = kind.__name__  # argparse: "invalid int value: 'x'"
        return parse


def fraction(value: str) -> float:
    """An argparse type: a share strictly between 0 and 1, as train.py's --data.val_fraction."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number between 0 and 1, got {value!r}") from None
    if not 0 < number < 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value}")
    return number


def positive_number(text: str) -> float:
    """An argparse type: a finite number of seconds (or any amount) > 0."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def whole_number(least: int = 1, most: int | None = None):
    """An argparse type: a whole number in least..most (argparse's one-line error names the flag)."""
    return Bound(least, most).argument(int)


# Integrated Gradients converges within tens to a few hundred steps; more only costs time.
IG_STEPS = Bound(1, 1024)
IG_STEPS_DEFAULT = 32  # an explanation's steps unless asked otherwise (library, predict.py, serve.py, the bench)
# Texts per forward pass; above this one batch of long texts is gigabytes.
BATCH_SIZE = Bound(1, 65536)
PREDICT_BATCH = 256  # texts per forward pass of a prediction unless asked otherwise (library, predict.py, benches)
POSITIVE = Bound(1)
# The server's own limits. LitServe binds only the ports 1024..65535 and three addresses.
TEXTS_PER_REQUEST = Bound(1, 65536)
REQUEST_BYTES = Bound(1, 1 << 30)
REQUEST_TIMEOUT = Bound(0.001, 24 * 3600)
BATCH_TIMEOUT = Bound(0, 60)
PORT = Bound(1024, 65535)
HOSTS = ("127.0.0.1", "0.0.0.0", "::")


def host(text: str) -> str:
    """An argparse type: one of the addresses the server can listen on."""
    if text not in HOSTS:
        try:
            ipaddress.ip_address(text)
            why = "LitServe listens on one of these three only"
        except ValueError:
            why = "give an address, not a name"
        raise argparse.ArgumentTypeError(f"must be 127.0.0.1 (this machine only), 0.0.0.0 (every IPv4 interface) "
                                          f"or :: (every interface), got {text!r}: {why}")
    return text


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask of serve.py and how long it may take; checked when the server starts (a bad value
    is a ValueError naming its flag) and applied to every request (inference/request.py, inference/answers.py)."""

    max_texts: int = 64  # texts in one request
    max_bytes: int = 1_000_000  # a request body
    request_timeout: float = 120.0  # seconds before a request without an answer gets a 504
    ig_steps: int = IG_STEPS_DEFAULT  # Integrated Gradients steps of an explanation
    max_batch_size: int = 32  # requests one worker answers together
    batch_timeout: float = 0.005  # seconds a worker waits to fill a batch

    BOUNDS = {"max_texts": TEXTS_PER_REQUEST, "max_bytes": REQUEST_BYTES, "request_timeout": REQUEST_TIMEOUT,
              "ig_steps": IG_STEPS, "max_batch_size": BATCH_SIZE, "batch_timeout": BATCH_TIMEOUT}

    def __post_init__(self):
        for name, bound in self.BOUNDS.items():
            bound.check(flag(name), getattr(self, name))
        if self.batch_timeout >= self.request_timeout:
            raise ValueError(f"--batch-timeout ({self.batch_timeout:g}) must be less than --request-timeout "
                             f"({self.request_timeout:g})")

    def to_dict(self) -> dict:
        return asdict(self)


def number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag(name: str) -> str:
    """The command-line flag of a setting: max_texts → --max-texts."""
    return "--" + name.replace("_", "-")
