"""Errors that the command line reports as one line and exit code 2."""


class ConfigError(ValueError):
    """An invalid configuration value, raised before anything is compiled."""


class UnknownNameError(ConfigError):
    """A name (preset, environment, algorithm, ...) that is not registered."""

    def __init__(self, kind: str, name: str, valid):
        super().__init__(f"unknown {kind} '{name}'; valid: {', '.join(valid)}")
        self.kind, self.name, self.valid = kind, name, list(valid)
