"""Files named in argv (deployment file, checkpoint) are written or moved by
the actions as root's peer oneadmin: they must lie in this VM's folder of a
system datastore, <datastores>/<ds id>/<vm id>/<file>, checked before anything
runs. OpenNebula sends absolute paths, sometimes with a doubled slash
(/var/lib/one//datastores/...), never with '.' or '..'."""

from __future__ import annotations

import os
import stat

from ..errors import InputError

# action -> the argv names that are paths into the VM's folder
PATH_ARGS = {"deploy": ("deployment_file",), "save": ("checkpoint_file",),
             "restore": ("checkpoint_file",)}


def _refuse(action: str, name: str, value: str, why: str):
    raise InputError(f"{action}: <{name}> {value!r} {why}; OpenNebula names a file in the VM's "
                     f"folder of a system datastore, <datastores>/<ds id>/<vm id>/<file>")


def check_vm_file(action: str, name: str, value: str, vm_id: int) -> None:
    if not value.startswith("/"):
        _refuse(action, name, value, "is not an absolute path")
    parts = [p for p in value.split("/") if p]  # a doubled slash is harmless
    if any(p in (".", "..") for p in parts) or "\x00" in value:
        _refuse(action, name, value, "is not a normalised path")
    if len(parts) < 3 or parts[-2] != str(vm_id) or not (parts[-3].isascii() and parts[-3].isdigit()):
        _refuse(action, name, value, f"is not in VM {vm_id}'s folder of a datastore")
    vm_dir = "/" + "/".join(parts[:-1])
    for path in (vm_dir, vm_dir + "/" + parts[-1]):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue  # created by the action, inside the checked folder
        except OSError as exc:
            _refuse(action, name, value, f"cannot be checked ({exc.strerror})")
        if stat.S_ISLNK(mode):  # it could lead anywhere
            _refuse(action, name, value, f"goes through the symbolic link {path}")


def check(action: str, args: dict, vm_id: int) -> None:
    for name in PATH_ARGS.get(action, ()):
        check_vm_file(action, name, args[name], vm_id)
