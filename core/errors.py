"""User-facing errors: one message that names the field, no traceback at the CLI."""


class UserError(Exception):
    """An error caused by the user's input (config, store, arguments), not by a bug."""


class ConfigError(UserError):
    """A config value is wrong. `field` is a dotted path such as ``grid.width``."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"config field '{field}': {message}")


class StoreError(UserError):
    """The store on disk does not fit the request (other experiment, done cells, ...)."""
