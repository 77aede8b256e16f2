import os
import stat

import pytest

from mdboost._io import atomic_path, atomic_write_text


def test_atomic_write_replaces_and_uses_umask_permissions(tmp_path):
    target = tmp_path / "sub" / "out.csv"
    atomic_write_text(target, "a,b\r\n1,2\n")
    assert target.read_bytes() == b"a,b\r\n1,2\n"  # no newline translation
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.csv"]


def test_atomic_path_failure_leaves_old_file_and_no_temp(tmp_path):
    target = tmp_path / "plot.png"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            assert tmp.suffix == ".png" and tmp.parent == tmp_path
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png"]


def test_checked_reads_name_the_file(tmp_path):
    from mdboost._io import read_json_object, read_yaml_mapping

    assert read_json_object(tmp_path / "none.json") is None
    (tmp_path / "a.json").write_text('{"x": 1}')
    assert read_json_object(tmp_path / "a.json") == {"x": 1}
    (tmp_path / "b.json").write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match=r"b\.json is not valid JSON"):
        read_json_object(tmp_path / "b.json")
    (tmp_path / "empty.yaml").write_text("")
    assert read_yaml_mapping(tmp_path / "empty.yaml") == {}
    (tmp_path / "c.yaml").write_text("a: 1\n")
    assert read_yaml_mapping(tmp_path / "c.yaml") == {"a": 1}
    (tmp_path / "d.yaml").write_text("a: [1\n")
    with pytest.raises(ValueError, match=r"d\.yaml is not valid YAML"):
        read_yaml_mapping(tmp_path / "d.yaml")
