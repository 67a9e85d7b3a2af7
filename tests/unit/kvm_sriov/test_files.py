"""files.atomic_write, the file replaced whole under every writer of the library."""

import os
import stat

import pytest

from kvm_sriov import files


# -- files.atomic_write -------------------------------------------------------------------
def _names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_the_file_is_replaced_whole_through_a_new_hidden_name_each_time(tmp_path, monkeypatch):
    path = tmp_path / "partitions.conf"
    path.write_text("old\n")
    renamed = []
    replace = os.replace

    def seen(src, dst):
        renamed.append((src, os.fspath(dst)))
        replace(src, dst)
    monkeypatch.setattr(os, "replace", seen)
    files.atomic_write(path, "new\n")
    files.atomic_write(path, b"newer\n")
    assert path.read_text() == "newer\n" and _names(tmp_path) == ["partitions.conf"]
    (first, _), (second, _) = renamed
    assert first != second and all(dst == str(path) for _, dst in renamed)
    for tmp in (first, second):
        assert os.path.dirname(tmp) == str(tmp_path) and os.path.basename(tmp).startswith(".partitions.conf.")


def test_a_str_is_written_as_utf8(tmp_path):
    files.atomic_write(tmp_path / "f", "Zürich\n")
    assert (tmp_path / "f").read_bytes() == "Zürich\n".encode()


@pytest.mark.parametrize("where", ["write", "rename"])
def test_a_failure_leaves_the_old_file_and_nothing_else(tmp_path, monkeypatch, where):
    import errno
    path = tmp_path / "status.json"
    path.write_text("old")
    if where == "write":
        fdopen = os.fdopen

        def onto_a_full_disk(fd, *args, **kwargs):
            os.close(fd)
            return fdopen(os.open("/dev/full", os.O_WRONLY), *args, **kwargs)
        monkeypatch.setattr(os, "fdopen", onto_a_full_disk)
    else:
        def refused(src, dst):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(OSError):
        files.atomic_write(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old" and _names(tmp_path) == ["status.json"]


def test_an_interrupt_during_the_write_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.atomic_write(tmp_path / "oned.conf", b"x", fsync=True)
    monkeypatch.undo()
    assert _names(tmp_path) == []


def test_a_link_planted_at_the_temporary_name_is_neither_followed_nor_removed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("victim's\n")
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "guessed")
    planted = tmp_path / ".ledger.json.kvm-sriov.guessed"
    planted.symlink_to(victim)
    with pytest.raises(FileExistsError):
        files.atomic_write(tmp_path / "ledger.json", "{}")
    assert victim.read_text() == "victim's\n" and planted.is_symlink() and not (tmp_path / "ledger.json").exists()
    planted.unlink()
    planted.mkdir()   # nor a folder: O_EXCL refuses any name that is there
    with pytest.raises(FileExistsError):
        files.atomic_write(tmp_path / "ledger.json", "{}")


def test_a_link_at_the_path_itself_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("victim's\n")
    path = tmp_path / "partitions.conf"
    path.symlink_to(victim)
    files.atomic_write(path, "new\n", mode=0o644)
    assert victim.read_text() == "victim's\n" and not path.is_symlink() and path.read_text() == "new\n"


def test_mode_is_exact_and_none_is_as_open_makes_it(tmp_path):
    old = os.umask(0o077)
    try:
        files.atomic_write(tmp_path / "exact", "x", mode=0o644)
        files.atomic_write(tmp_path / "private", "x", mode=0o600)
        files.atomic_write(tmp_path / "as-open", "x")
        with open(tmp_path / "by-open", "w"):
            pass
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"exact": 0o644, "private": 0o600, "as-open": modes["by-open"], "by-open": 0o600}


def test_like_gives_the_new_file_the_old_ones_mode_and_as_root_its_owner(tmp_path):
    path = tmp_path / "oned.conf"
    path.write_text("old\n")
    path.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(path, 65534, 65533)
    files.atomic_write(path, b"new\n", like=path.stat(), fsync=True)
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o640 and path.read_text() == "new\n"
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (65534, 65533)


def test_fsync_is_asked_for(tmp_path, monkeypatch):
    synced = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd)))
    files.atomic_write(tmp_path / "a", "x")
    assert synced == []
    files.atomic_write(tmp_path / "b", "x", fsync=True)
    assert len(synced) == 1
