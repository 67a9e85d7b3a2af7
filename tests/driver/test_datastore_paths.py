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


def test_the_configured_directory_with_the_default_as_fallback(tmp_path):
    assert paths.datastores_of(SimpleNamespace()) == DS
    assert paths.datastores_of(SimpleNamespace(datastore_location="")) == DS
    assert paths.datastores_of(SimpleNamespace(datastore_location=tmp_path)) == str(tmp_path)
    one = "/opt/one/var/datastores"   # a self-contained install: $ONE_LOCATION/var/datastores
    paths.check("save", {"checkpoint_file": f"{one}/0/7/checkpoint"}, 7, one)


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
