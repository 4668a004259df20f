"""Parameter checks for schemes (messages name the constraint and a valid alternative)."""

from __future__ import annotations

from pgc_hvd.codes.validation import check_n_s


def check_scheme_n_s(name: str, n, s):
    return check_n_s(name, n, s)


def check_choice(scheme: str, option: str, value, choices):
    if value not in choices:
        raise ValueError(
            f"{scheme}: option {option}={value!r} is not one of {list(choices)}; e.g. {option}={choices[0]!r}"
        )
    return value


def check_positive_int(scheme: str, option: str, value, minimum: int = 1, maximum=None, hint: str = ""):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
        maximum is not None and value > maximum
    ):
        rng = f"[{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(
            f"{scheme}: option {option} must be an integer {rng}, got {value!r}"
            + (f"; {hint}" if hint else f"; e.g. {option}={minimum}")
        )
    return value
