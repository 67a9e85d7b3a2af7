"""Deployment and checkpoint paths are anchored to the datastores directory
(oned.conf's DATASTORE_LOCATION, the driver's [opennebula] datastore_location):
<datastores>/<ds id>/<vm id>/<file>, nothing else, before anything runs."""

from types import SimpleNamespace

import pytest

from kvm_sriov.actions import paths
from kvm_sriov.errors import InputError

DS = "/var/lib/one/datastores"


@pytest.mark.parametrize("value", ["/0/42/deployment.0", "//0//42/deployment.0"])
def test_a_path_that_names_no_datastores_directory_is_refused(value):
    with pytest.raises(InputError, match="names no datastores directory"):
        paths.check("deploy", {"deployment_file": value}, 42)
    with pytest.raises(InputError, match="not under the datastores directory"):
        paths.check("deploy", {"deployment_file": value}, 42, DS)


@pytest.mark.parametrize("value", ["/var/lib/one//datastores/0/42/deployment.0",
                                   "/var/lib/one/datastores/102/42/deployment.3"])
def test_oned_s_own_paths_pass(value):
    paths.check("deploy", {"deployment_file": value}, 42, DS)
    paths.check("deploy", {"deployment_file": value}, 42, DS + "/")


@pytest.mark.parametrize("action,args", [
    ("deploy", {"deployment_file": "/srv/elsewhere/0/42/deployment.0"}),
    ("deploy", {"deployment_file": "/var/lib/one/datastores/x/0/42/deployment.0"}),
    ("deploy", {"deployment_file": "/var/lib/one/0/42/deployment.0"}),
    ("save", {"checkpoint_file": "/tmp/0/42/checkpoint"}),
    ("restore", {"checkpoint_file": "/var/lib/one/datastores2/0/42/checkpoint"}),
])
def test_a_path_under_another_directory_is_refused(action, args):
    with pytest.raises(InputError, match=f"not under the datastores directory {DS}"):
        paths.check(action, args, 42, DS)


def test_the_configured_directory_else_the_one_oned_names():
    """The configuration's directory wins; without one, the parent of the
    BASE_PATH of the system datastore oned sends with the action (oned's own
    DATASTORE_LOCATION, never a tenant's); with neither, only the shape rule."""
    one = "/opt/one/var/datastores"   # a self-contained install: $ONE_LOCATION/var/datastores
    action = (f"<VMM_DRIVER_ACTION_DATA><DATASTORE><ID>0</ID><BASE_PATH>{one}/0</BASE_PATH>"
              f"</DATASTORE></VMM_DRIVER_ACTION_DATA>").encode()
    assert paths.datastores_of(SimpleNamespace()) is None
    assert paths.datastores_of(SimpleNamespace(datastore_location="")) is None
    assert paths.datastores_of(SimpleNamespace(datastore_location=DS), action) == DS
    assert paths.datastores_of(SimpleNamespace(datastore_location=""), action) == one
    assert paths.datastores_of(SimpleNamespace(), b"<not xml") is None
    paths.check("save", {"checkpoint_file": f"{one}/0/7/checkpoint"}, 7, one)
    with pytest.raises(InputError, match="not under the datastores directory"):
        paths.check("save", {"checkpoint_file": "/var/lib/one/datastores/0/7/checkpoint"}, 7, one)


def test_a_deploy_outside_oned_s_datastores_directory_is_refused_before_anything_runs(tmp_path):
    """main(): a deployment file that has the right shape but lies outside the
    directory oned names is refused, and the stock script never runs."""
    import io
    from kvm_sriov import actions
    remotes = tmp_path / "remotes"
    stock = remotes / "vmm" / "kvm" / "deploy"
    stock.parent.mkdir(parents=True)
    ran = tmp_path / "ran"
    stock.write_text(f"#!/bin/sh\ntouch {ran}\n")
    stock.chmod(0o755)
    action = ("<VMM_DRIVER_ACTION_DATA><DATASTORE><ID>0</ID><BASE_PATH>/var/lib/one/datastores/0"
              "</BASE_PATH></DATASTORE><VM><ID>42</ID></VM></VMM_DRIVER_ACTION_DATA>")
    (tmp_path / "cfg.toml").write_text(f'[pool]\nstate_dir = "{tmp_path / "state"}"\n')
    import os
    os.environ["KVM_SRIOV_CONFIG"] = str(tmp_path / "cfg.toml")
    try:
        code = actions.main("deploy", ["/srv/elsewhere/0/42/deployment.0", "h1", "42", "h1"],
                            remotes_dir=remotes, stdin=io.StringIO(action))
    finally:
        del os.environ["KVM_SRIOV_CONFIG"]
    assert code != 0 and not ran.exists()


def test_a_symlinked_datastore_is_followed_a_symlinked_vm_folder_is_not(tmp_path):
    """A datastore's folder may be a link (oned.conf allows it, the
    administrator's); the VM's folder and its file may not."""
    ds = tmp_path / "datastores"
    (tmp_path / "nfs" / "0" / "42").mkdir(parents=True)
    ds.mkdir()
    (ds / "0").symlink_to(tmp_path / "nfs" / "0")
    paths.check("save", {"checkpoint_file": str(ds / "0" / "42" / "checkpoint")}, 42, str(ds))
    (tmp_path / "nfs" / "0" / "43").symlink_to("/etc")
    with pytest.raises(InputError, match="symbolic link"):
        paths.check("save", {"checkpoint_file": str(ds / "0" / "43" / "checkpoint")}, 43, str(ds))
