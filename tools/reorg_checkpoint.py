"""Reorganise ``supervisor/checkpoint/`` into subpackages by concept (issue 32), mechanically.

Run it from the repository root on a clean tree, once::

    python tools/reorg_checkpoint.py --dry-run   # what it would do; changes nothing
    python tools/reorg_checkpoint.py             # does it (git mv, rewrites), prints what it did

What it does, in this order, all computed in memory before anything is touched:

1. refuses when the layout is applied already (a target folder exists), and FAILS listing every
   module of ``supervisor/checkpoint/`` that `MOVES` does not name (a module someone added since:
   add it to `MOVES` by hand, with the subpackage whose rules it follows, and run again);
2. ``git mv`` of each module to its new place (`MOVES`), the re-export shims (`FOLDED`) removed;
3. every import of an old dotted name rewritten across supervisor/, hooks/, tests/, benchmarks/,
   examples/, docs/, tools/ and the top-level files (README, mkdocs.yml, pyproject.toml, .ci/):
   ``from supervisor.checkpoint.old import x`` statements (a shim's names go to the module that
   defines them, `REDIRECTS`; a module imported through the package, ``from supervisor.checkpoint
   import old``, comes from its subpackage), then every other mention of a dotted name
   (``import ... as``, ``monkeypatch`` and logger strings, ``::: `` reference entries, docstrings)
   and of a path (``supervisor/checkpoint/old.py``), and the module-name strings of the rule
   tests listed in `STEM_FILES`;
4. the subpackages' ``__init__.py`` (`PACKAGE_DOCS`) and the hand-written edits of `EDITS`
   (what no rename can do: a constant moved down to the floor that needs it, the architecture
   page's map of the package, a test's skip guard); an edit whose anchor is not found fails the
   run before anything is changed, naming the file and the anchor.

It prints the post-steps that stay by hand (run the tests; files near the size limits).
"""
from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "supervisor/checkpoint"
DOTTED = "supervisor.checkpoint"

#: old module (a file of supervisor/checkpoint/) -> its new place, relative to the package.
#: ``x/__init__`` makes the module the face of the subpackage ``x`` (its dotted name stays ``x``).
MOVES: dict[str, str] = {
    # storage/: the seam (Storage, storage_for, register_scheme), its local backend, its s3:// backend
    "storage": "storage/__init__",
    "storage_base": "storage/base",
    "local_storage": "storage/local",
    "local_snapshot": "storage/local_snapshot",
    "fileio": "storage/fileio",
    "records": "storage/records",
    "object_store": "storage/s3/store",
    "object_io": "storage/s3/objects",
    "object_errors": "storage/s3/errors",
    "object_options": "storage/s3/config",
    "object_uploads": "storage/s3/uploads",
    # ownership/: who may write a logdir (knows nothing of checkpoints)
    "holder": "ownership/holder",
    "lease_record": "ownership/lease_record",
    "lease": "ownership/lease",
    "lock": "ownership/lock",
    # layout/: what a logdir holds and what its names mean
    "format": "layout/format",
    "index": "layout/index",
    "fencing": "layout/fencing",
    "finished": "layout/finished",
    "retention": "layout/retention",
    "verify": "layout/verify",
    # formats/: how a checkpoint's payload is encoded and decoded (state.pt, DCP shards)
    "serialize": "formats/serialize",
    "safe_globals": "formats/safe_globals",
    "dangerous_globals": "formats/dangerous_globals",
    "memory_file": "formats/memory_file",
    "dcp_ranges": "formats/dcp_ranges",
    "dcp_storage": "formats/dcp_storage",
    "dcp_reading": "formats/dcp_reading",
    # load/: one verified read, the choice of a checkpoint, applying it; TF's reading API
    "loader": "load/loader",
    "choose": "load/choose",
    "apply": "load/apply",
    "private_copy": "load/private_copy",
    "shared_copy": "load/shared_copy",
    "reader": "load/variables",
    "ranged": "load/ranged",
    "helpers": "load/checkpoint_utils",
    # save/: capture, the background write, the commit, publishing, a save's failure
    "staging": "save/staging",
    "overlap": "save/overlap",
    "copiers": "save/copiers",
    "fingerprint": "save/fingerprint",
    "writer": "save/background",
    "temp": "save/temp",
    "commit": "save/commit",
    "publish": "save/publish",
    "save_failures": "save/failure_policy",
    "manager_common": "save/in_flight",
    # the package's own floor: the manager that composes the subpackages, its argument checks
    "manager": "manager",
    "options": "arguments",
    # sharded/: checkpoint_format="dcp" in a job (every rank saves; the chief chooses)
    "dcp": "sharded/__init__",
    "dcp_commit": "sharded/commit",
    "dcp_io": "sharded/state_dict",
    "dcp_manager": "sharded/manager",
    "dcp_restore": "sharded/restore",
    # added after the script was written (issue 32's format registry and memory backend, issue 34's
    # keep-best, issue 33's tiers, issue 31's replicated items): placed, not yet applied — the
    # layout rules (tests/checkpoint/test_layout_rules.py) need a "tiers" row, and verify (layout)
    # asks the format registry (formats), which the table must settle before the move
    "best": "layout/best",
    "format_registry": "layout/format_registry",
    "format_torch": "load/torch_format",
    "format_dcp": "load/dcp_format",
    "dcp_replicated": "formats/dcp_replicated",
    "memory_storage": "storage/memory",
    "tier_options": "tiers/options",
    "tier_copy": "tiers/copy",
    "tier_restore": "tiers/restore",
    "persist": "tiers/persist",
    "tiered": "tiers/manager",
}
#: Re-export shims removed: their importers import each name from the module that defines it.
FOLDED = ("reading", "restore")
#: (old module, name) -> (module that defines it, its name there) besides the shims' own
#: (read from their import statements): a name re-exported by a module of a higher floor.
REDIRECTS: dict[tuple[str, str], tuple[str, str]] = {
    ("private_copy", "MemoryFile"): (f"{DOTTED}.formats.memory_file", "MemoryFile"),
}
#: What a dotted mention of a shim without a name becomes (a docstring's "see supervisor.checkpoint.reading").
FOLDED_TEXT = {"reading": f"{DOTTED}.load.loader", "restore": f"{DOTTED}.load"}
#: Files whose string literals name modules by their path relative to the package ("local_storage").
STEM_FILES = ("tests/checkpoint/test_storage_rule.py",)
#: Where mentions are rewritten (tracked and untracked files, not ignored ones).
TEXT_ROOTS = ("supervisor", "hooks", "tests", "benchmarks", "examples", "docs", "tools", ".ci")
TOP_FILES = ("README.md", "mkdocs.yml", "pyproject.toml", "setup.cfg", "setup.py")
TEXT_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml", ".txt", ".cfg", ".ini", ".sh", "")

PACKAGE_DOCS = {
    "storage/s3": '"""The ``s3://`` backend of the storage seam, on fsspec\'s ``s3fs`` (SPEC §16): `store`\n'
                  "(`ObjectStoreStorage`), `objects` (multipart writes, ranged reads), `errors` (how a request runs\n"
                  "and fails), `config` (the client's options), `uploads` (unfinished multipart uploads). Imported\n"
                  'only by `supervisor.checkpoint.storage` when an ``s3://`` logdir is opened (the ``[s3]`` extra)."""\n',
    "ownership": '"""Who may write a logdir (SPEC §5.6, §16): `lock` (``lock="flock"|"lease"|"auto"``), `lease`\n'
                 "(exclusive generations on any `Storage`), `lease_record`, `holder` (is a holder on this host gone).\n"
                 'Imports only the storage seam: ownership knows nothing of checkpoints."""\n',
    "layout": '"""What a logdir holds and what its names mean (SPEC §2, §5.1, §5.3, §5.5, §10.2, §16): `format`\n'
              "(names, the manifest), `index` (the ``checkpoint`` file), `finished` (the training-finished mark),\n"
              "`retention` (pure keep/delete rules), `verify` (a checkpoint against its manifest), `fencing`\n"
              "(per-save data roots and generation-conditional writes). Imports the storage seam and\n"
              '`ownership` (a fenced write that lost the lease raises its `LeaseLostError`)."""\n',
    "formats": '"""How a checkpoint\'s payload is encoded and decoded: `serialize` (``state.pt``: torch.save\'s zip\n'
               "format), `safe_globals` / `dangerous_globals` (what ``torch.load(weights_only=True)`` may build),\n"
               "`memory_file` (a file over bytes in memory), and the DCP format: `dcp_storage` (DCP's reader and\n"
               "writer over the storage seam), `dcp_ranges` (item checksums), `dcp_reading` (a sharded checkpoint\n"
               'loaded from verified bytes). Imports the storage seam and `layout`."""\n',
    "load": '"""Reading checkpoints (SPEC §5.4, §10.4, §13): `loader` (the ONE verified loader: read once into a\n'
            "private copy, checksummed while reading), `choose` (the newest good checkpoint, falling back),\n"
            "`apply` (onto a live training state), `private_copy` / `shared_copy` (the bytes read once, per\n"
            "process or per job), `variables` + `ranged` (TensorFlow's reader API: ``list_variables``,\n"
            "``load_variable``, `CheckpointReader`), `checkpoint_utils` (``load_checkpoint``, ``restore_partial``,\n"
            '``checkpoints_iterator``). Imports `storage`, `layout`, `formats`; never `save` or `sharded`."""\n',
    "save": '"""Writing checkpoints (SPEC §5.1, §5.2, §5.9): capture (`staging`, `overlap`, `copiers`,\n'
            "`fingerprint`) -> `background` (the writer thread) -> `temp` (one staged checkpoint) -> `commit`\n"
            "(manifest last) -> `publish` (the index, then retention); `in_flight` (a save in flight and its\n"
            "failure, shared by both managers) and `failure_policy` (SPEC §5.2 as a pure function). Imports\n"
            '`storage`, `ownership`, `layout`, `formats` and the package\'s `arguments`; never `load`."""\n',
}

LAYOUT_GUARD = re.compile(r"\n# --- applied by tools/reorg_checkpoint\.py: from here.*?# --- to here\n", re.S)


# ---------------------------------------------------------------- the table, checked
def new_dotted(old: str) -> str:
    rel = MOVES[old].removesuffix("/__init__")
    return f"{DOTTED}.{rel.replace('/', '.')}"


def new_path(old: str) -> str:
    return f"{PACKAGE}/{MOVES[old]}.py"


def check_table(modules: set[str]) -> list[str]:
    """The modules of the package that no table names (to be added by hand)."""
    return sorted(modules - set(MOVES) - set(FOLDED) - {"__init__"})


def shim_redirects(root: Path, present: set[str]) -> dict[tuple[str, str], tuple[str, str]]:
    """(shim, name) -> (defining module's new dotted name, its name there), from the shims' imports."""
    found = dict(REDIRECTS)
    for shim in FOLDED:
        if shim not in present:
            continue
        tree = ast.parse((root / PACKAGE / f"{shim}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    found[(shim, alias.asname or alias.name)] = (mapped_module(node.module), alias.name)
    return found


def mapped_module(module: str) -> str:
    """A dotted module name after the moves (unchanged when it is none of the package's)."""
    if module.startswith(DOTTED + "."):
        head, _, tail = module[len(DOTTED) + 1:].partition(".")
        if head in MOVES:
            return new_dotted(head) + (f".{tail}" if tail else "")
    return module


# ---------------------------------------------------------------- rewriting a Python file's imports
class Rewriter:
    def __init__(self, redirects: dict[tuple[str, str], tuple[str, str]]):
        self.redirects = redirects
        olds = sorted([*MOVES, *FOLDED], key=len, reverse=True)
        self.dotted = re.compile(rf"\b{re.escape(DOTTED)}\.({'|'.join(olds)})(?:\.(\w+))?(?![\w])")
        self.path = re.compile(rf"(?<![\w/.])((?:supervisor/)?checkpoint/)({'|'.join(olds)})\.py(?!\w)")
        self.stem = re.compile(rf"([\"'])({'|'.join(olds)})\1")
        self.one_line = re.compile(rf"^([ \t]*)(from {re.escape(DOTTED)}(?:\.\w+)? import [\w ,]+?)([ \t]*(?:#.*)?)$", re.M)

    def imports(self, text: str, where: str) -> tuple[str, list[str]]:
        """The import statements that name a shim, a redirected name or a moved module through the
        package, rewritten; also returns the lines it generated (for `compact`)."""
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return text, []
        lines = text.splitlines(keepends=True)
        generated: list[str] = []
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module]
        for node in sorted(nodes, key=lambda n: n.lineno, reverse=True):
            groups = self._groups(node, where)
            if groups is None:
                continue
            first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
            indent = first[:node.col_offset]
            tail = last[node.end_col_offset:].rstrip("\n")
            if indent.strip() or (tail.strip() and not tail.strip().startswith("#")):
                raise SystemExit(f"{where}:{node.lineno}: an import statement shares its line; rewrite it by hand")
            new = [indent + _statement(module, names).replace("\n", "\n" + indent) + f"{tail}\n"
                   for module, names in groups.items()]
            generated += new
            lines[node.lineno - 1:node.end_lineno] = new
        return "".join(lines), generated

    def import_lines(self, text: str, where: str) -> str:
        """One-line imports the parse did not see: in the source of a subprocess (a string)."""
        def line(match: re.Match) -> str:
            try:
                node = ast.parse(match.group(2)).body[0]
            except SyntaxError:
                return match.group(0)
            groups = self._groups(node, where) if isinstance(node, ast.ImportFrom) else None
            if groups is None:
                return match.group(0)
            return "\n".join(f"{match.group(1)}from {module} import {', '.join(names)}{match.group(3)}"
                             for module, names in groups.items())

        return self.one_line.sub(line, text)

    def _groups(self, node: ast.ImportFrom, where: str) -> OrderedDict[str, list[str]] | None:
        groups: OrderedDict[str, list[str]] = OrderedDict()
        changed = False
        for alias in node.names:
            local = alias.asname or alias.name
            module, name = node.module, alias.name
            if node.module == DOTTED and alias.name in FOLDED:
                raise SystemExit(f"{where}:{node.lineno}: imports the shim {alias.name!r} as a module; add an EDIT")
            if node.module == DOTTED and alias.name in MOVES and new_dotted(alias.name) != f"{DOTTED}.{alias.name}":
                module, _, name = new_dotted(alias.name).rpartition(".")
                changed = True
            elif node.module.startswith(DOTTED + "."):
                old = node.module[len(DOTTED) + 1:]
                if (old, alias.name) in self.redirects:
                    module, name = self.redirects[(old, alias.name)]
                    changed = True
                elif old in FOLDED:
                    raise SystemExit(f"{where}:{node.lineno}: {alias.name!r} is not among what the shim {old!r} "
                                     "re-exports; add it to REDIRECTS")
                else:
                    module = mapped_module(node.module)
            groups.setdefault(module, []).append(name if name == local else f"{name} as {local}")
        return groups if changed else None

    def text(self, text: str, stems: bool = False) -> str:
        """Every other mention: dotted names, paths, and (``stems``) quoted module names."""
        def dotted(match: re.Match) -> str:
            old, attr = match.group(1), match.group(2)
            if old in FOLDED:
                if attr and (old, attr) in self.redirects:
                    module, name = self.redirects[(old, attr)]
                    return f"{module}.{name}"
                return FOLDED_TEXT[old] + (f".{attr}" if attr else "")
            return new_dotted(old) + (f".{attr}" if attr else "")

        text = self.dotted.sub(dotted, text)
        text = self.path.sub(lambda m: f"{m.group(1)}{MOVES[m.group(2)]}.py" if m.group(2) in MOVES
                             else m.group(0), text)
        if stems:
            text = self.stem.sub(lambda m: m.group(1) + new_dotted(m.group(2))[len(DOTTED) + 1:] + m.group(1)
                                 if m.group(2) in MOVES else m.group(0), text)
        return text


def _statement(module: str, names: list[str]) -> str:
    line = f"from {module} import {', '.join(names)}"
    if len(line) <= 120:
        return line
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")"


def compact(text: str, generated: list[str]) -> str:
    """Merges a generated one-line module-level import into another one-line import of the same
    module in the file (a shim's import split in two must not push a file over its size limit)."""
    for line in generated:
        match = re.fullmatch(r"from (\S+) import ([^()#\n]+)\n", line)
        if not match or line not in text:
            continue
        module, names = match.group(1), match.group(2)
        other = re.search(rf"^from {re.escape(module)} import ([^()#\n]+)\n", text.replace(line, "", 1), re.M)
        if other is None:
            continue
        merged = f"from {module} import {other.group(1).rstrip()}, {names.strip()}\n"
        if len(merged) > 121:
            continue
        text = text.replace(line, "", 1)
        text = text.replace(other.group(0), merged, 1)
    return text


# ---------------------------------------------------------------- the edits no rename can make
def _all_span(text: str) -> tuple[int, int]:
    """The character span of the module's ``__all__ = [...]`` statement."""
    lines = text.splitlines(keepends=True)
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            start = sum(map(len, lines[:node.lineno - 1])) + node.col_offset
            return start, sum(map(len, lines[:node.end_lineno - 1])) + node.end_col_offset
    raise ValueError("no __all__")


def _all_plus(name: str, after: str = ""):
    """An edit: ``name`` added to ``__all__``, and ``after`` written after that statement."""
    def edit(text: str) -> str:
        start, end = _all_span(text)
        body = text[start:end].rstrip()
        return text[:start] + body[:-1].rstrip().rstrip(",") + f', "{name}"]' + after + text[end:]
    return edit


def _all_minus(name: str):
    """An edit: ``name`` taken out of ``__all__``."""
    def edit(text: str) -> str:
        start, end = _all_span(text)
        body = re.sub(rf'\s*"{name}",|,\s*"{name}"(?=\s*\])', "", text[start:end], count=1)
        return text[:start] + body + text[end:]
    return edit


def _lock_constant(text: str) -> str:
    return text.replace('OWNER_FILE = LOCK_FILE + ".owner"',
                        '#: The flock file of a local logdir (``lock="flock"``).\nLOCK_FILE = ".supervisor.lock"\n'
                        'OWNER_FILE = LOCK_FILE + ".owner"', 1)


#: (new path, anchor, new text or an edit of the whole text): applied after the rewrite; an anchor
#: not found fails the run before anything is changed.
EDITS: list[tuple[str, object, object]] = [
    # ownership/ stands below layout/: the lock owns its file's name (format.py only listed it).
    (f"{PACKAGE}/layout/format.py", 'LOCK_FILE = ".supervisor.lock"\n', ""),
    (f"{PACKAGE}/layout/format.py", '"LOCK_FILE"', _all_minus("LOCK_FILE")),
    (f"{PACKAGE}/ownership/lock.py", f"from {DOTTED}.layout.format import LOCK_FILE\n", ""),
    (f"{PACKAGE}/ownership/lock.py", "__all__ = [", _all_plus("LOCK_FILE")),
    (f"{PACKAGE}/ownership/lock.py", 'OWNER_FILE = LOCK_FILE + ".owner"', _lock_constant),
    # storage/ stands below layout/: the commit marker's name belongs to the seam's commit protocol.
    (f"{PACKAGE}/layout/format.py", 'MANIFEST_FILE = "MANIFEST.json"\n', ""),
    (f"{PACKAGE}/layout/format.py", f"from {DOTTED}.storage.base import Storage\n",
     f"from {DOTTED}.storage.base import MANIFEST_FILE, Storage\n"),
    (f"{PACKAGE}/storage/base.py", "__all__ = [", _all_plus(
        "MANIFEST_FILE", "\n\n#: The manifest of a committed checkpoint (`Storage.commit` writes it last): on an object\n"
        "#: store a checkpoint exists if and only if it holds this object. The layout's name too (layout/format.py).\n"
        'MANIFEST_FILE = "MANIFEST.json"')),
    (f"{PACKAGE}/storage/s3/store.py", f"from {DOTTED}.layout.format import MANIFEST_FILE\n",
     f"from {DOTTED}.storage.base import MANIFEST_FILE\n"),
    (f"{PACKAGE}/storage/memory.py", f"from {DOTTED}.layout.format import MANIFEST_FILE\n",
     f"from {DOTTED}.storage.base import MANIFEST_FILE\n"),
    # the rule tests of the subpackages run from now on
    ("tests/checkpoint/test_layout_rules.py", LAYOUT_GUARD, "\n"),
]


#: The same, applied to a file before its imports are rewritten (what the rewrite itself refuses).
PRE_EDITS: list[tuple[str, str, str]] = [
    # a stale skip guard that imports the removed shim as a module (its names are in layout/verify.py)
    ("tests/checkpoint/test_checkpoint_reader.py",
     "    from supervisor.checkpoint import restore\n\n    if not hasattr(restore, \"DCP_METADATA\"):\n"
     "        pytest.skip(\"needs the dcp checkpoint format's verification (issue 13) in supervisor.checkpoint.restore\")\n",
     ""),
]


def _architecture(text: str) -> str:
    start = text.index("## `supervisor/checkpoint/`")
    end = text.index("\n## ", start + 1)
    section = (ROOT / "tools" / "reorg_checkpoint_map.md").read_text(encoding="utf-8")
    return text[:start] + section.rstrip("\n") + "\n" + text[end:]


def _facade(text: str) -> str:
    start = text.index("Where each concern lives:")
    end = text.index("\n\n", start)
    return text[:start] + (
        "Where each concern lives (docs/architecture.md has the map and the import rules):\n"
        "``storage/`` (the seam, local, ``s3/``), ``ownership/`` (lock, lease), ``layout/`` (format,\n"
        "index, finished mark, retention, verify, fencing), ``formats/`` (``state.pt``, DCP, safe\n"
        "unpickling), ``load/`` (the one verified loader, choose, apply, TF's reader API), ``save/``\n"
        "(capture, the writer thread, temp, commit, publish), ``manager.py`` (`CheckpointManager`),\n"
        "``arguments.py`` (argument checks), ``sharded/`` (``checkpoint_format=\"dcp\"``).") + text[end:]


def _manager(text: str) -> str:
    """The manager's docstring named the flat modules; said by subpackage it is a line shorter (the
    shim's import became three lines, and the file stands at the size limit)."""
    start = text.index("The one object the session, the front doors and the checkpoint hook talk to.")
    end = text.index('\n"""', start)
    return text[:start] + (
        "The one object the session, the front doors and the checkpoint hook talk to. It composes the subpackages\n"
        "(docs/architecture.md): the ownership lock (``ownership/``), the capture into reused staging buffers (``save/``,\n"
        "on the caller's thread — the only part that blocks training), the background writer running the commit\n"
        "protocol and publishing the index and retention (``save/``), verify-then-fall-back restore (``load/``). Every\n"
        "file goes through the logdir's `Storage` (``self.storage``): a local path or an ``s3://bucket/prefix`` URL.") \
        + text[end:]


CALLABLE_EDITS = [(f"{PACKAGE}/manager.py", "The one object the session, the front doors and the checkpoint", _manager),
                  ("docs/architecture.md", "## `supervisor/checkpoint/`", _architecture),
                  (f"{PACKAGE}/__init__.py", "Where each concern lives:", _facade)]


def apply_edits(contents: dict[str, str]) -> list[str]:
    """Applies `EDITS` to ``contents`` (new path -> text); returns the anchors not found."""
    missing = []
    for path in {e[0] for e in EDITS} | {e[0] for e in CALLABLE_EDITS}:
        if path not in contents and (ROOT / path).is_file():
            contents[path] = (ROOT / path).read_text(encoding="utf-8")
    for path, old, new in EDITS:
        text = contents.get(path)
        if isinstance(old, re.Pattern):
            found = text is not None and old.search(text) is not None
            if found:
                contents[path] = old.sub(new, text, count=1)
        else:
            found = text is not None and old in text
            if found:
                contents[path] = new(text) if callable(new) else text.replace(old, new, 1)
        if not found:
            missing.append(f"{path}: {getattr(old, 'pattern', old)!r}")
    for path, anchor, edit in CALLABLE_EDITS:
        text = contents.get(path)
        if text is None or anchor not in text:
            missing.append(f"{path}: {anchor!r}")
        else:
            contents[path] = edit(text)
    return missing


# ---------------------------------------------------------------- the run
def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def text_files() -> list[str]:
    listed = git("ls-files", "-co", "--exclude-standard", "--", *TEXT_ROOTS, *TOP_FILES).splitlines()
    own = {"tools/reorg_checkpoint.py", "tools/reorg_checkpoint_map.md", "tests/core/test_reorg_script.py"}
    return sorted(p for p in listed if p not in own and (ROOT / p).is_file() and Path(p).suffix in TEXT_SUFFIXES)


def plan(present: set[str]) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(old path -> new path, new path -> new text, problems): nothing touched yet."""
    rewriter = Rewriter(shim_redirects(ROOT, present))
    moves = {f"{PACKAGE}/{old}.py": new_path(old) for old in MOVES if old in present and new_path(old) != f"{PACKAGE}/{old}.py"}
    contents: dict[str, str] = {}
    problems: list[str] = []
    for path in text_files():
        if path in (f"{PACKAGE}/{shim}.py" for shim in FOLDED):
            continue
        try:
            before = (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        original = before
        for where, old, new in PRE_EDITS:
            if where == path:
                if old not in before:
                    problems.append(f"{path}: {old!r}")
                before = before.replace(old, new, 1)
        after, generated = rewriter.imports(before, path) if path.endswith(".py") else (before, [])
        after = rewriter.import_lines(after, path) if path.endswith(".py") else after
        after = rewriter.text(after, stems=path in STEM_FILES)
        after = compact(after, generated)
        target = moves.get(path, path)
        if after != original or target != path:
            contents[target] = after
    for package, doc in PACKAGE_DOCS.items():
        contents[f"{PACKAGE}/{package}/__init__.py"] = doc
    for folder in {str(Path(p).parent) for p in moves.values()} - {PACKAGE}:
        contents.setdefault(f"{folder}/__init__.py", PACKAGE_DOCS.get(folder[len(PACKAGE) + 1:], '"""(package)"""\n'))
    return moves, contents, problems + apply_edits(contents)


def run(dry_run: bool) -> int:
    folder = ROOT / PACKAGE
    present = {p.stem for p in folder.glob("*.py")}
    done = [d for d in {MOVES[o].split("/")[0] for o in MOVES if "/" in MOVES[o]} if (folder / d).is_dir()]
    if done:
        print(f"refusing: {', '.join(sorted(done))} exist under {PACKAGE}/: the layout is applied already",
              file=sys.stderr)
        return 2
    unknown = check_table(present)
    if unknown:
        print(f"FAILED: {len(unknown)} module(s) of {PACKAGE}/ are in no table of tools/reorg_checkpoint.py; add each "
              "to MOVES (its subpackage) and run again:\n" + "\n".join(f"  {PACKAGE}/{m}.py" for m in unknown),
              file=sys.stderr)
        return 1
    gone = sorted(set(MOVES) - present)
    moves, contents, missing = plan(present)
    if missing:
        print("FAILED: these edits found no anchor (the file changed since the script was written); fix EDITS:\n"
              + "\n".join(f"  {m}" for m in missing), file=sys.stderr)
        return 1
    for old, new in sorted(moves.items()):
        print(f"{'would move' if dry_run else 'moved'} {old} -> {new}")
    for shim in FOLDED:
        if shim in present:
            print(f"{'would remove' if dry_run else 'removed'} {PACKAGE}/{shim}.py (its importers import from the "
                  "modules that define its names)")
    for name in gone:
        print(f"note: {PACKAGE}/{name}.py named in MOVES is not there (removed since?)")
    rewritten = sorted(p for p in contents if p not in moves.values() and (ROOT / p).exists())
    created = sorted(p for p in contents if not (ROOT / p).exists() and p not in moves.values())
    print(f"{'would rewrite' if dry_run else 'rewrote'} {len(rewritten)} files; "
          f"{'would create' if dry_run else 'created'}: {', '.join(created)}")
    if dry_run:
        return 0
    for old, new in moves.items():
        (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
        git("mv", old, new)
    for shim in FOLDED:
        if shim in present:
            git("rm", "-q", f"{PACKAGE}/{shim}.py")
    for path, text in contents.items():
        (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / path).write_text(text, encoding="utf-8")
    git("add", "--", *contents)
    post_steps(contents)
    return 0


def post_steps(contents: dict[str, str]) -> None:
    long = [p for p, t in contents.items() if p.endswith(".py") and p.startswith(("supervisor/", "hooks/"))
            and len(t.splitlines()) > 400]
    print("\npost-steps (by hand):")
    print("  - run: python -m pytest -q tests/checkpoint tests/storage tests/cli tests/core tests/docs tests/*/s3")
    print("  - read the package's picture again: docs/architecture.md's map against tests/checkpoint/test_layout_rules.py")
    if long:
        print("  - over 400 lines now (merge or trim the imports by hand): " + ", ".join(sorted(long)))
    print("  - prose that names a module by its bare file name (e.g. `fencing.py`) is left as written: "
          "git grep -n '[a-z_]*\\.py' supervisor/checkpoint docs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print what would be done; change nothing")
    return run(parser.parse_args(argv).dry_run)


if __name__ == "__main__":
    sys.exit(main())
