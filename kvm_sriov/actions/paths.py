"""Files named in argv (deployment file, checkpoint) are written or moved by
the actions as root's peer oneadmin: they must lie in this VM's folder of a
system datastore, <datastores>/<ds id>/<vm id>/<file>, checked before anything
runs. OpenNebula sends absolute paths, sometimes with a doubled slash
(/var/lib/one//datastores/...), never with '.' or '..'.

<datastores> is oned.conf's DATASTORE_LOCATION (default
/var/lib/one/datastores; $ONE_LOCATION/var/datastores when self-contained),
the same on every host. The driver's configuration may say it ([opennebula]
datastore_location); otherwise it is the one oned itself names in the action
(the system datastore's BASE_PATH is <datastores>/<ds id>): a tenant never
writes either. A path anywhere else is refused.

Symbolic links: the datastores directory and a datastore's folder
(<datastores>/<ds id>) may be links (oned.conf allows it: a datastore on
another file system); they are the administrator's, and whoever can change
them (root, oneadmin) decides where every VM's files go anyway. A VM's own
folder and the file in it are refused as links: they could lead the action
anywhere. The check is textual plus lstat of those two: it does not resolve
the links above them.
"""

from __future__ import annotations

import os
import stat
from typing import Optional

from ..domain import domain_xml
from ..errors import InputError

# action -> the argv names that are paths into the VM's folder
PATH_ARGS = {"deploy": ("deployment_file",), "save": ("checkpoint_file",),
             "restore": ("checkpoint_file",)}
DEFAULT_DATASTORES = "/var/lib/one/datastores"   # oned.conf's DATASTORE_LOCATION default


def datastores_of(config, raw: Optional[bytes] = None, sent=None) -> Optional[str]:
    """The datastores directory: the configuration's (opennebula.datastore_location),
    else the parent of the BASE_PATH of the system datastore oned sends with
    the action (raw, or sent: delegate.Sent, whose parsed stdin the action
    then reads again without parsing it twice); None when neither says (the
    path must still name one)."""
    value = getattr(config, "datastore_location", None)
    if value:
        return str(value)
    raw = sent.raw if sent is not None else raw
    if not raw:
        return None
    try:
        root = (sent.document("action XML") if sent is not None and sent.raw_is_text()
                else domain_xml.parse(raw, "action XML"))
        base = root.findtext("DATASTORE/BASE_PATH") or ""
    except Exception:  # not ours to judge here: the action's own reader says what is wrong
        return None
    parts = _parts(base.strip())
    return "/" + "/".join(parts[:-1]) if base.strip().startswith("/") and len(parts) >= 2 else None


def _refuse(action: str, name: str, value: str, why: str):
    raise InputError(f"{action}: <{name}> {value!r} {why}; OpenNebula names a file in the VM's "
                     f"folder of a system datastore, <datastores>/<ds id>/<vm id>/<file>")


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p]  # a doubled slash is harmless


def check_vm_file(action: str, name: str, value: str, vm_id: int, datastores: Optional[str] = None) -> None:
    """datastores: the datastores directory the path must be under (None: not
    known here; the path must still name one)."""
    if not value.startswith("/"):
        _refuse(action, name, value, "is not an absolute path")
    parts = _parts(value)
    if any(p in (".", "..") for p in parts) or "\x00" in value:
        _refuse(action, name, value, "is not a normalised path")
    if len(parts) < 3 or parts[-2] != str(vm_id) or not (parts[-3].isascii() and parts[-3].isdigit()):
        _refuse(action, name, value, f"is not in VM {vm_id}'s folder of a datastore")
    if datastores is not None and parts[:-3] != _parts(datastores):
        _refuse(action, name, value, f"is not under the datastores directory {datastores}")
    if len(parts) < 4:  # '/0/42/deployment.0': no datastores directory at all
        _refuse(action, name, value, "names no datastores directory")
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


def check(action: str, args: dict, vm_id: int, datastores: Optional[str] = None) -> None:
    for name in PATH_ARGS.get(action, ()):
        check_vm_file(action, name, args[name], vm_id, datastores)
