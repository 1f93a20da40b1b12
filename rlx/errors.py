"""Errors that the command line reports as one line and exit code 2."""


class InputError(ValueError):
    """Bad input from the user, a configuration value or a data file: command lines print its message (which
    names the field, or the file and line) as one line, exit code 2."""


class ConfigError(InputError):
    """An invalid configuration value, raised before anything is compiled."""


class UnknownNameError(ConfigError):
    """A name (preset, environment, algorithm, ...) that is not registered."""

    def __init__(self, kind: str, name: str, valid):
        super().__init__(f"unknown {kind} '{name}'; valid: {', '.join(valid)}")
        self.kind, self.name, self.valid = kind, name, list(valid)
