"""services/worker/verified_files.py: a cached model file passes only with the bytes the repository
published, however it was changed (its modification time put back included); a model's directory
passes only with exactly its files."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from services.worker.verified_files import Verified, tree_problem
from shared.wire.records import ModelFile
from tests.files import rewrite_keeping_times


def write(path: Path, data: bytes) -> ModelFile:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return ModelFile(path.name, len(data), hashlib.sha256(data).hexdigest())


def test_a_file_passes_with_its_digest_and_size_only(tmp_path: Path) -> None:
    file = write(tmp_path / "model.onnx", b"weights" * 100)
    verified = Verified()
    assert verified.check(tmp_path / "model.onnx", file.digest, file.size)
    assert verified.check(tmp_path / "model.onnx", file.digest, file.size)  # known now: same answer
    assert not verified.check(tmp_path / "model.onnx", "0" * 64, file.size)
    assert not verified.check(tmp_path / "model.onnx", file.digest, file.size + 1)
    assert not verified.check(tmp_path / "absent", file.digest, file.size)


def test_a_file_changed_after_its_check_fails_the_next_one(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    file = write(path, b"a" * 4096)
    verified = Verified()
    assert verified.check(path, file.digest, file.size)
    before = path.stat().st_mtime_ns
    rewrite_keeping_times(path, b"b" * 4096)
    assert path.stat().st_mtime_ns == before  # the change hides from the modification time and size
    assert not verified.check(path, file.digest, file.size)
    rewrite_keeping_times(path, b"a" * 4096)  # and back: hashed again, it passes
    assert verified.check(path, file.digest, file.size)


def test_a_remembered_file_linked_elsewhere_still_passes(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    file = write(path, b"c" * 100)
    verified = Verified()
    verified.remember(path, file.digest)
    os.link(path, tmp_path / "linked")  # a link changes the change time: hashed again (and passes)
    assert verified.check(tmp_path / "linked", file.digest, file.size)
    assert verified.check(path, file.digest, file.size)


def test_a_symbolic_link_never_passes_even_to_the_right_bytes(tmp_path: Path) -> None:
    file = write(tmp_path / "real", b"x" * 10)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert not Verified().check(tmp_path / "link", file.digest, file.size)


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "blob")  # opened for reading alone, it would wait for a writer for ever
    assert not Verified().check(tmp_path / "blob", "0" * 64, 0)


def make_tree(tree: Path, contents: dict[str, bytes]) -> list[ModelFile]:
    files = []
    for relative, data in contents.items():
        written = write(tree / relative, data)
        files.append(ModelFile(relative, written.size, written.digest))
    return files


def test_a_tree_is_whole_with_exactly_its_files(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    files = make_tree(tree, {"config.pbtxt": b'name: "m"', "1/model.py": b"print(1)"})
    assert tree_problem(tree, files, Verified()) == ""

    (tree / "1" / "extra.py").write_text("import os")  # a module the model could import
    assert tree_problem(tree, files, Verified()) == "'1/extra.py' is not one of the model's files"
    (tree / "1" / "extra.py").unlink()

    rewrite_keeping_times(tree / "1" / "model.py", b"print(2)")
    assert "'1/model.py' does not match the SHA-256" in tree_problem(tree, files, Verified())
    rewrite_keeping_times(tree / "1" / "model.py", b"print(1)")

    (tree / "config.pbtxt").unlink()
    assert tree_problem(tree, files, Verified()) == "'config.pbtxt' is missing"


def test_a_symlinked_directory_in_a_tree_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    files = make_tree(tree, {"config.pbtxt": b"x"})
    (tmp_path / "elsewhere").mkdir()
    (tree / "1").symlink_to(tmp_path / "elsewhere")
    assert tree_problem(tree, files, Verified()) == "'1' is a symbolic link"


names = st.text("abcdef", min_size=1, max_size=4)


@settings(max_examples=40, deadline=None)
@given(
    contents=st.dictionaries(names, st.binary(max_size=64), min_size=1, max_size=5),
    victim=st.integers(min_value=0),
    flip=st.integers(min_value=0, max_value=255),
)
def test_any_one_byte_changed_anywhere_in_a_tree_is_found(
    tmp_path_factory, contents: dict[str, bytes], victim: int, flip: int
) -> None:
    tree = tmp_path_factory.mktemp("tree")
    files = make_tree(tree, {f"1/{name}": data for name, data in contents.items()})
    verified = Verified()
    assert tree_problem(tree, files, verified) == ""
    target = files[victim % len(files)]
    data = bytearray((tree / target.path).read_bytes())
    if not data:
        data = bytearray(b"\0")  # an empty file given one byte: its size differs
    else:
        data[flip % len(data)] ^= 1 + flip % 255
    rewrite_keeping_times(tree / target.path, bytes(data))
    assert tree_problem(tree, files, verified) != ""
