"""The package's layers: data flows one way, and so do imports (read with ast, lazy imports too).

    core (errors, dirs, redact, atomic) -> storage -> formats -> index -> view -> fuse | pack
    -> service -> cli -> the package's front doors (shardfs.mounted, python -m shardfs)

A module may import its own subpackage and any layer to its left; fuse (serving) and pack
(the data owners' tools) never import each other, and nothing imports service or cli from below.
"""

import ast
import builtins
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "shardfs"
RANK = {
    "errors": 0, "dirs": 0, "redact": 0, "atomic": 0, "processes": 0,
    "storage": 1, "formats": 2, "index": 3, "view": 4, "fuse": 5, "pack": 5, "service": 6,
    "cli": 7, "__init__": 8, "__main__": 8,  # shardfs.mounted and `python -m shardfs`: the front doors
}


def layer_of(module: str) -> str:
    """'shardfs.storage.remote.client' -> 'storage'; 'shardfs' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every shardfs import in the file, wherever it stands."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # "from shardfs import view" names a subpackage: that is what is imported.
            found += [(node.lineno, f"{target}.{alias.name}" if target == "shardfs" else target)
                      for alias in node.names]
    return [(line, mod) for line, mod in found if mod == "shardfs" or mod.startswith("shardfs.")]


def modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_layer():
    unplaced = [str(p) for p in modules() if layer_of(module_name(p)) not in RANK]
    assert not unplaced, f"modules outside every layer (add them to RANK or move them): {unplaced}"


def allowed(importer: str, target: str) -> bool:
    mine, theirs = layer_of(importer), layer_of(target)
    if theirs not in RANK:  # a name of the root package, such as shardfs.__version__
        return True
    return mine == theirs or RANK[theirs] < RANK[mine]


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_point_down_the_layers(path):
    me = module_name(path)
    wrong = [f"line {line}: {target}" for line, target in imported(path) if not allowed(me, target)]
    assert not wrong, f"{me} ({layer_of(me)}) imports against the direction: {wrong}"


def test_the_check_catches_an_upward_import(tmp_path):
    """The rule itself: a cache asking the FUSE layer, or serving importing packing, is refused."""
    assert not allowed("shardfs.storage.ram", "shardfs.fuse.ops")
    assert not allowed("shardfs.fuse.ops", "shardfs.pack.writers")
    assert not allowed("shardfs.pack.verify", "shardfs.service.mount")
    assert allowed("shardfs.pack.verify", "shardfs.view.sources")
    assert allowed("shardfs.view.dataset", "shardfs.storage.local")
    assert allowed("shardfs.cli", "shardfs.pack.packer")


BUILTIN_ERRORS = {name for name in dir(builtins)
                  if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), BaseException)}


def errors_off_the_base(source: str) -> list[str]:
    """Classes that derive from a built-in exception without ShardfsError beside it (a class
    deriving from one of shardfs's own errors has the base through it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name != "ShardfsError":
            bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", None) for b in node.bases}
            if bases & BUILTIN_ERRORS and "ShardfsError" not in bases:
                found.append(f"line {node.lineno}: {node.name}")
    return found


def test_every_error_class_has_the_one_base():
    """``except shardfs.ShardfsError`` catches whatever shardfs raises on purpose (errors.py)."""
    wrong = {str(p.relative_to(PACKAGE.parent)): found for p in modules() if (found := errors_off_the_base(p.read_text()))}
    assert not wrong, f"error classes without ShardfsError among their bases: {wrong}"


def test_the_base_check_catches_a_plain_exception():
    assert errors_off_the_base("class Gone(ConnectionError):\n    pass\n") == ["line 1: Gone"]
    assert not errors_off_the_base("class Gone(ShardfsError, ConnectionError):\n    pass\n")
    assert not errors_off_the_base("class Worse(ShardIOError):\n    pass\n")
