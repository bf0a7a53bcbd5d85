"""The data's one error type, apart so that every module of data/ can raise it."""


class DataError(ValueError):
    """Bad input data; its message is one line naming the file and what is wrong."""
