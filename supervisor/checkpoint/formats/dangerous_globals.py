"""Globals no checkpoint legitimately holds (SPEC §5.4; issue 30 item 5).

A ``state_dict()`` holds tensors, numbers, strings, containers and, at most, a user's own
classes. A pickle that needs a global which spawns processes (``os.system``, ``subprocess.*``,
``os.exec*``, ``os.spawn*``, ``pty``), runs or compiles code (``exec``, ``eval``, ``compile``,
``types.CodeType``), reaches any attribute or module (``getattr``, ``__import__``,
``importlib``, ``operator.attrgetter``/``methodcaller``, ``sys``), or touches files, sockets,
signals or native code (``open``, ``shutil``, ``socket``, ``ctypes``, ``pickle`` itself…) was
crafted to run code when loaded. `is_dangerous` names such a global, so a refusal says the file
may be malicious instead of advising to trust it (``trusted_globals=[posix.system]`` would run
the attacker's command on the next restore).

Names are ``module.qualname`` as the pickle spells them, also in Python 2's spelling
(``__builtin__``, ``commands``) which ``torch.save``'s protocol 2 may produce.

Example::

    is_dangerous("posix.system")              # True
    is_dangerous("mypackage.model.Config")    # False: a user class, trusted_globals may allow it
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["is_dangerous", "dangerous_names"]

#: Every global of these modules (and their submodules): none rebuilds a saved value. Modules whose
#: names a user's own package may well have (``code``, ``profile``, ``trace``) are not listed
#: whole: only their dangerous globals are, in `_NAMES`.
_MODULES = frozenset({
    "os", "posix", "nt", "posixpath", "ntpath", "subprocess", "_posixsubprocess", "commands", "popen2", "pty",
    "importlib", "imp", "zipimport", "pkgutil", "runpy", "sys",
    "socket", "_socket", "ssl", "_ssl", "select", "selectors", "asyncio", "http", "urllib", "urllib2", "ftplib",
    "smtplib", "telnetlib", "xmlrpc", "webbrowser",
    "shutil", "tempfile", "fileinput", "pathlib", "zipfile", "tarfile", "mmap", "fcntl",
    "ctypes", "_ctypes", "cffi", "multiprocessing", "_multiprocessing", "concurrent", "threading", "_thread",
    "signal", "_signal", "resource", "pickle", "_pickle", "cPickle", "marshal", "shelve", "dill", "cloudpickle",
    "joblib",
    "torch.hub", "torch.utils.cpp_extension", "torch.package", "torch.serialization",
    "numpy.ctypeslib", "numpy.lib.npyio",
})
#: Single globals of otherwise harmless modules.
_NAMES = frozenset({
    "builtins.exec", "builtins.eval", "builtins.compile", "builtins.getattr", "builtins.setattr",
    "builtins.delattr", "builtins.__import__", "builtins.open", "builtins.input", "builtins.breakpoint",
    "builtins.globals", "builtins.locals", "builtins.vars", "builtins.exit", "builtins.quit", "builtins.help",
    "builtins.execfile", "builtins.file", "builtins.reload", "builtins.__build_class__",
    "io.open", "io.open_code", "io.FileIO", "_io.open", "_io.open_code", "_io.FileIO", "codecs.open",
    "operator.attrgetter", "operator.methodcaller", "_operator.attrgetter", "_operator.methodcaller",
    "types.CodeType", "types.FunctionType", "types.LambdaType", "types.ModuleType", "types.MethodType",
    "torch.load", "torch.jit.load", "numpy.load", "numpy.fromfile", "numpy.memmap",
    "inspect.getattr_static", "code.interact", "code.InteractiveInterpreter", "code.InteractiveConsole",
    "code.compile_command", "codeop.compile_command", "codeop.Compile", "codeop.CommandCompiler", "pdb.run",
    "pdb.runeval", "pdb.runcall", "pdb.Pdb", "bdb.Bdb", "trace.Trace", "timeit.timeit", "timeit.repeat",
    "timeit.Timer", "cProfile.run", "cProfile.runctx", "profile.run", "profile.runctx",
})


def is_dangerous(name: str) -> bool:
    """Whether the global ``name`` (``module.qualname``) is one no checkpoint legitimately holds."""
    if name.startswith("__builtin__."):
        name = "builtins." + name[len("__builtin__."):]
    if "." not in name:  # the refusal of a builtin may name it bare
        name = "builtins." + name
    if name in _NAMES:
        return True
    parts = name.split(".")
    return any(".".join(parts[:i]) in _MODULES for i in range(1, len(parts)))


def dangerous_names(names: Iterable[str]) -> list[str]:
    """The names in ``names`` that `is_dangerous`, in order."""
    return [n for n in names if is_dangerous(n)]
