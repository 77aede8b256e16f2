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


def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_output_folder_replaces_the_folder_whole(tmp_path):
    """The new run's files only: a file the old run wrote and this one did not is gone."""
    from mdboost._io import output_folder

    out = tmp_path / "out"
    with output_folder(out, ["a.csv", "b.csv", "plots"]) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.tmp-")
        (tmp / "a.csv").write_text("1")
        (tmp / "b.csv").write_text("1")
    with output_folder(out, ["a.csv", "b.csv", "plots"]) as tmp:
        (tmp / "a.csv").write_text("2")
        assert (out / "b.csv").read_text() == "1"  # the old outputs stay whole until the swap
    assert _names(out) == ["a.csv"] and (out / "a.csv").read_text() == "2"
    assert _names(tmp_path) == [".out.lock", "out"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask


def test_output_folder_failure_leaves_the_old_outputs(tmp_path):
    from mdboost._io import output_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / "a.csv").write_text("old")
    with pytest.raises(OSError, match="disk full"):
        with output_folder(out, ["a.csv"]) as tmp:
            (tmp / "a.csv").write_text("half")
            raise OSError("disk full")
    assert _names(out) == ["a.csv"] and (out / "a.csv").read_text() == "old"
    assert _names(tmp_path) == ["out"]


def test_output_folder_refuses_a_folder_with_files_no_run_writes(tmp_path):
    """Nothing of the user's is removed with an old output folder: refused before anything is written."""
    from mdboost._io import check_output_folder, output_folder

    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "a.csv").write_text("old")
    with pytest.raises(FileExistsError, match=r"holds files no run writes \(notes\.txt\)"):
        with output_folder(tmp_path, ["a.csv"]):
            pytest.fail("entered")
    assert _names(tmp_path) == ["a.csv", "notes.txt"]
    with pytest.raises(FileExistsError, match="is a file"):
        check_output_folder(tmp_path / "a.csv", ["a.csv"])
    with pytest.raises(FileExistsError, match="root"):
        check_output_folder("/", ["a.csv"])


def test_a_folder_that_gains_foreign_files_meanwhile_is_not_replaced(tmp_path):
    from mdboost._io import output_folder

    out = tmp_path / "out"
    with pytest.raises(FileExistsError, match="notes.txt"):
        with output_folder(out, ["a.csv"]) as tmp:
            (tmp / "a.csv").write_text("new")
            out.mkdir()
            (out / "notes.txt").write_text("mine")  # written while the run ran
    assert _names(out) == ["notes.txt"] and not any(p.name.startswith(".out.tmp") for p in tmp_path.iterdir())


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # exited and reaped: no process has it (until the OS hands it out again)


def test_temporary_folders_of_dead_runs_are_removed_and_others_kept(tmp_path):
    from mdboost._io import _host, remove_dead_runs_temps

    dead, host = _dead_pid(), _host()
    mine = tmp_path / f".out.tmp-{host}-{os.getpid()}-abc_12"  # a live run's (this process)
    gone = tmp_path / f".out.tmp-{host}-{dead}-x1y2z3"
    remote = tmp_path / f".out.tmp-otherhost-{dead}-x1y2z3"  # another machine's pid: not ours to judge
    other = tmp_path / f".other.tmp-{host}-{dead}-x1y2z3"  # another folder's
    for folder in (mine, gone, remote, other):
        (folder / "old").mkdir(parents=True)
    assert remove_dead_runs_temps(tmp_path / "out") == [gone.name]
    assert _names(tmp_path) == sorted(p.name for p in (mine, remote, other))


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_a_process_killed_between_the_two_renames_leaves_no_folder_then_the_next_run_cleans(tmp_path):
    """Killed after the old folder went aside and before the new one came in: no folder at all
    (never a mix); the next run removes both temporary folders and writes its own."""
    import subprocess
    import sys

    from mdboost._io import output_folder

    out = tmp_path / "out"
    with output_folder(out, ["a.csv"]) as tmp:
        (tmp / "a.csv").write_text("old")
    script = ("import os, signal, sys\n"
              "from mdboost import _io\n"
              "renames = []\n"
              "real = os.rename\n"
              "def rename(src, dst):\n"
              "    renames.append(dst)\n"
              "    if len(renames) == 2:\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n"
              "    real(src, dst)\n"
              "_io.os.rename = rename\n"
              f"with _io.output_folder({str(out)!r}, ['a.csv']) as tmp:\n"
              "    (tmp / 'a.csv').write_text('new')\n")
    done = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, PYTHONPATH=os.getcwd()))
    assert done.returncode == -9
    assert not out.exists() and len([p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp-")]) == 2
    with output_folder(out, ["a.csv"]) as tmp:
        (tmp / "a.csv").write_text("next")
    assert _names(tmp_path) == [".out.lock", "out"] and (out / "a.csv").read_text() == "next"
