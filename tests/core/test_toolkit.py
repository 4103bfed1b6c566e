"""The toolkit for hook authors (issue 32): ``hooks/`` is written with public names only — no
private ``supervisor`` module, no name outside its module's ``__all__`` — so a user can write a
hook the way the built-ins are written; every toolkit name is documented with an example that runs."""
from __future__ import annotations

import ast
import doctest
import importlib
import itertools
import pathlib

import pytest

import supervisor.toolkit as toolkit

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _private_imports(path: pathlib.Path) -> list[str]:
    """What ``path`` imports of ``supervisor`` that a user could not: a module with a private part
    (``supervisor._validate``), a private name, or a name its module's ``__all__`` does not list."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("supervisor") and "._" in "." + a.name]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("supervisor"):
            if any(part.startswith("_") for part in node.module.split(".")):
                bad.append(node.module)
                continue
            public = getattr(importlib.import_module(node.module), "__all__", None)
            bad += [f"{node.module}.{a.name}" for a in node.names
                    if a.name.startswith("_") or (public is not None and a.name not in public)]
    return bad


@pytest.mark.parametrize("path", sorted((ROOT / "hooks").glob("*.py")), ids=lambda p: p.name)
def test_hooks_import_no_private_supervisor_module_or_name(path):
    bad = _private_imports(path)
    assert not bad, f"hooks/{path.name} imports {bad}: use supervisor.toolkit (add the name there, documented)"


def test_the_rule_sees_a_private_import(tmp_path):
    hook = tmp_path / "my_hook.py"
    hook.write_text("from supervisor._validate import check_int\nfrom supervisor.hook import Hook, _unused\n"
                    "import supervisor._scalars\nfrom supervisor.toolkit import check_int\n")
    assert _private_imports(hook) == ["supervisor._validate", "supervisor.hook._unused", "supervisor._scalars"]


@pytest.mark.parametrize("name", toolkit.__all__)
def test_every_toolkit_name_is_documented_and_its_examples_run(name):
    value = getattr(toolkit, name)
    if name.isupper():  # a constant: documented in the module docstring
        assert f"`{name}`" in toolkit.__doc__
        return
    assert (value.__doc__ or "").strip(), f"supervisor.toolkit.{name} has no docstring"
    examples = [t for t in doctest.DocTestFinder().find(value, name, globs=dict(vars(toolkit))) if t.examples]
    if name not in ("check_storage", "is_url"):  # the storage seam's own docstrings (shown in the module's example)
        assert examples, f"supervisor.toolkit.{name}'s docstring has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in examples:
        runner.run(test)
    assert runner.failures == 0, f"an example of supervisor.toolkit.{name} does not run as written"


def test_the_module_example_hook_runs():
    from supervisor import MonitoredSession
    from supervisor.testing import InMemorySummaryWriter

    lines = toolkit.__doc__.split("Example::\n")[1].splitlines()
    block = itertools.takewhile(lambda line: not line or line.startswith("    "), lines)
    namespace: dict = {}
    exec(compile("\n".join(line[4:] for line in block), "toolkit-example", "exec"), namespace)
    writer = InMemorySummaryWriter()
    hook = namespace["LossEveryNStepsHook"](every_n_steps=2, summary_writer=writer)
    with MonitoredSession(hooks=[hook]) as session:
        for _ in range(5):
            session.run(lambda: {"loss": 0.5})
    assert writer.scalar_steps("loss") == [2, 4]
    with pytest.raises(ValueError, match="every_n_steps must be a positive integer, got 0"):
        namespace["LossEveryNStepsHook"](every_n_steps=0)
