"""Argument checks shared by every constructor: the message names the argument, the value and
the fix, e.g. ``max_to_keep must be a positive integer or None, got 0``."""
from __future__ import annotations

import math
import os
import numbers
from typing import Any, Callable, Iterable

__all__ = [
    "check_bool",
    "check_path",
    "check_watched_directory",
    "check_callable",
    "check_choice",
    "check_int",
    "check_number",
    "check_hooks",
    "check_positive_or_none",
    "check_seconds",
    "as_tuple",
    "check_lock",
    "LOCK_KINDS",
    "MIN_LEASE_SECS",
]

#: The values of ``lock=`` (SPEC §16): ``"auto"`` (``"flock"`` on a local path, ``"lease"`` on
#: an object store), ``"flock"`` (an OS file lock), ``"lease"`` (exclusive lease files).
LOCK_KINDS = ("auto", "flock", "lease")
#: The shortest ``lease_secs``: renewed every third of it, it must outlast a storage round trip.
MIN_LEASE_SECS = 1.0


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, minimum: int | None = None, allow_none: bool = False) -> int | None:
    """Validates an integer argument, ``value >= minimum`` when a minimum is given.

    Examples:
        >>> check_int("every_n_steps", 100, minimum=1)
        100
        >>> check_int("every_n_steps", 0, minimum=1)
        Traceback (most recent call last):
        ValueError: every_n_steps must be a positive integer, got 0
    """
    if value is None and allow_none:
        return None
    if not _is_int(value) or (minimum is not None and value < minimum):
        kind = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise _error(value, f"{name} must be {kind}{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    strictly_positive: bool = False,
    allow_none: bool = False,
    allow_inf: bool = False,
) -> float | None:
    """Validates a real number (not bool, not NaN), optionally ``>= minimum`` or ``> 0``.

    Infinity is refused unless ``allow_inf`` (an interval or timeout of ``inf`` would fail
    later, in a thread, with ``OverflowError``); pass None or a large number instead.

    Examples:
        >>> check_number("every_n_secs", 30, strictly_positive=True)
        30.0
        >>> check_number("every_n_secs", None, strictly_positive=True, allow_none=True) is None
        True
        >>> check_number("every_n_secs", "30", strictly_positive=True)
        Traceback (most recent call last):
        TypeError: every_n_secs must be a positive number, got '30'
    """
    if value is None and allow_none:
        return None
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and value == value
    if ok and strictly_positive and not value > 0:
        ok = False
    if ok and minimum is not None and value < minimum:
        ok = False
    finite = ok and (allow_inf or math.isfinite(value))
    if not finite:
        kind = "a positive number" if strictly_positive else (
            "a non-negative number" if minimum == 0 else
            f"a number >= {minimum}" if minimum is not None else "a number")
        if ok:
            kind = kind.replace("number", "finite number")
        raise _error(value, f"{name} must be {kind}{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is True or False (not 0/1, not None), else `TypeError` naming ``name``.

    Examples:
        >>> check_bool("at_end", 1)
        Traceback (most recent call last):
        TypeError: at_end must be True or False, got 1
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_callable(name: str, value: Any, *, allow_none: bool = True, signature: str = "") -> Callable | None:
    """``value`` if it is callable (or None, with ``allow_none``), else `TypeError` naming
    ``name`` and, when given, the expected ``signature``.

    Examples:
        >>> check_callable("formatter", "{loss}", signature="formatter(values) -> str")
        Traceback (most recent call last):
        TypeError: formatter must be a callable such as formatter(values) -> str or None, got '{loss}'
    """
    if value is None and allow_none:
        return None
    if not callable(value):
        hint = f" such as {signature}" if signature else ""
        raise TypeError(f"{name} must be a callable{hint}{' or None' if allow_none else ''}, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices``, else `ValueError` listing them.

    Examples:
        >>> check_choice("mode", "max", ("min", "max"))
        'max'
        >>> check_choice("mode", "maximum", ("min", "max"))
        Traceback (most recent call last):
        ValueError: mode must be one of 'min', 'max', got 'maximum'
    """
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def check_hooks(name: str, hooks: Any) -> list:
    """Validates a sequence of `supervisor.Hook` instances and returns it as a list."""
    from supervisor.hook import Hook, warn_misspelled_methods

    if hooks is None:
        return []
    if isinstance(hooks, Hook) or not isinstance(hooks, Iterable) or isinstance(hooks, (str, bytes)):
        raise TypeError(f"{name} must be a list of supervisor.Hook instances, got {hooks!r}; wrap a single hook in a list")
    hooks = list(hooks)
    for i, hook in enumerate(hooks):
        if isinstance(hook, type) and issubclass(hook, Hook):
            raise TypeError(f"{name}[{i}] is the class {hook.__name__}, not an instance; write {hook.__name__}(...)")
        if not isinstance(hook, Hook):
            raise TypeError(f"{name}[{i}] must be a supervisor.Hook instance, got {hook!r}; subclass supervisor.Hook")
    warn_misspelled_methods(hooks)  # issue 10: after_runs() would never be called
    return hooks


def check_positive_or_none(name: str, value: Any) -> None:
    """TensorFlow's rule and message for a count (``steps``, ``max_steps``): an integer > 0 or
    None (``Must specify max_steps > 0, given: 0``)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer > 0 or None, given: {value!r}")
    if value <= 0:
        raise ValueError(f"Must specify {name} > 0, given: {value}")


def check_seconds(name: str, value: Any) -> None:
    """TensorFlow's rule and message for a delay (``throttle_secs``): a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
        raise TypeError(f"`{name}` must be a number of seconds >= 0, given: {value!r}")
    if value < 0:
        raise ValueError(f"Must specify {name} >= 0, given: {value}")
    if math.isinf(value):
        raise ValueError(f"`{name}` must be a finite number of seconds, given: {value}; pass a large number "
                         "of seconds instead")


def check_lock(lock: Any, lease_secs: Any, logdir: str | None = None, *,
               object_store: bool = False) -> tuple[str, float | None]:
    """Validates ``lock=`` and ``lease_secs=`` together, for the ``logdir`` when it is known
    (``object_store``: whether it is an object-store URL); returns them (``lease_secs`` as a
    float or None for the default). ``lease_secs`` where a flock is taken (``lock="flock"``, or
    ``"auto"`` on a local logdir) is refused: a flock has no expiry, so the value would be
    silently ignored; so is ``lock="flock"`` on an object store, which has no file locks."""
    if not isinstance(lock, str) or lock not in LOCK_KINDS:
        raise ValueError(f"lock must be one of {', '.join(map(repr, LOCK_KINDS))}, got {lock!r}; use 'lease' on "
                         "shared filesystems (NFS, Lustre) and object stores, 'flock' on a local disk, or 'auto' "
                         "(default) to choose by the logdir")
    if object_store and lock == "flock":
        raise ValueError(f"lock='flock' needs a local path, but the logdir {logdir} is on an object store, which "
                         "has no file locks; use lock='lease' (or 'auto', which chooses it there)")
    if lease_secs is None:
        return lock, None
    if isinstance(lease_secs, bool) or not isinstance(lease_secs, numbers.Real) or not math.isfinite(lease_secs) \
            or lease_secs < MIN_LEASE_SECS:
        raise _error(lease_secs, f"lease_secs must be a finite number of seconds >= {MIN_LEASE_SECS:g} or None "
                                 f"(the default, 60 s), got {lease_secs!r}; the lease is renewed every third of it")
    if lock == "flock":
        raise ValueError(f"lease_secs={lease_secs!r} was given with lock='flock', which has no expiry; pass "
                         "lock='lease' (or 'auto') to use a lease, or drop lease_secs")
    if lock == "auto" and logdir is not None and not object_store:
        raise ValueError(f"lease_secs={lease_secs!r} was given, but lock='auto' takes a flock on the local logdir "
                         f"{logdir!r}, which has no expiry (lease_secs would be ignored); pass lock='lease' to use a "
                         "lease there (the safe choice on NFS/Lustre), or drop lease_secs")
    return lock, float(lease_secs)


def as_tuple(name: str, values: Any) -> tuple[Any, ...]:
    """A list-like argument (``hooks``, ``saving_listeners``) as a tuple (None: empty); a string
    or a single non-iterable value is refused, naming ``name``.

    Examples:
        >>> as_tuple("listeners", None)
        ()
        >>> as_tuple("listeners", "saver")
        Traceback (most recent call last):
        TypeError: `listeners` must be a list of instances (or None), given: 'saver'; wrap a single one in a list
    """
    if values is None:
        return ()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"`{name}` must be a list of instances (or None), given: {values!r}; "
                        "wrap a single one in a list")
    return tuple(values)


def _error(value: Any, message: str) -> Exception:
    # A value of the wrong type is a TypeError; the right type out of range is a ValueError.
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return ValueError(message)
    return TypeError(message)


# ---------------------------------------------------------------- local directory paths
def check_path(name: str, value: Any, *, allow_none: bool = False, hint: str = "") -> str | None:
    """``value`` as a ``str`` path; `TypeError` unless it is a non-empty ``str``/``os.PathLike``
    (or None, with ``allow_none``). ``hint`` is appended to the message, e.g. what None means.

    Examples:
        >>> import pathlib
        >>> check_path("output_dir", pathlib.Path("runs/x"))
        'runs/x'
        >>> check_path("output_dir", "")
        Traceback (most recent call last):
        TypeError: output_dir must be a directory path, got ''
    """
    if value is None and allow_none:
        return None
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str) or not path:
        raise TypeError(f"{name} must be a directory path{' or None' if allow_none else ''}{hint}, got {value!r}")
    return path


def check_watched_directory(name: str, value: Any) -> str:
    """`check_path` for a directory a reader waits on (it need not exist yet): `ValueError` for a
    file, or a path under a file (which could never appear)."""
    path = check_path(name, value)
    ancestor = os.path.abspath(path)
    while not os.path.exists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if os.path.exists(ancestor) and not os.path.isdir(ancestor):
        where = "is a file" if ancestor == os.path.abspath(path) else f"is under {ancestor!r}, which is a file"
        raise ValueError(f"{name} {path!r} {where}, not a directory; pass the trainer's log directory "
                         "(the one holding the checkpoint index)")
    return path
