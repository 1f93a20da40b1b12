"""``key=value`` command lines of the small entry points (``rlx.evaluate``, ``rlx.label``)."""

from __future__ import annotations

from rlx.errors import ConfigError


def parse_key_values(argv: list[str], options: dict, usage: str, required=("run_dir",), integers=(),
                     booleans=()) -> dict:
    """``options`` (name -> default string) updated from ``argv``, with ``integers`` and ``booleans`` converted.

    An unknown key, a missing ``required`` key or a bad value raises one ``ConfigError`` naming it.
    """
    values = dict(options)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in options:
            raise ConfigError(f"{arg!r}: expected key=value with key one of {', '.join(options)}")
        values[key] = value
    for key in required:
        if values[key] is None:
            raise ConfigError(f"{key}: missing; usage: {usage}")
    for key in booleans:
        if values[key].lower() not in ("true", "false"):
            raise ConfigError(f"{key}={values[key]}: must be true or false")
        values[key] = values[key].lower() == "true"
    for key in integers:
        try:
            values[key] = int(values[key])
        except ValueError:
            raise ConfigError(f"{key}={values[key]}: must be an integer") from None
    return values
