"""UFM as the partition manager: PKeys and their GUID members through UFM's REST API.

On a fabric UFM runs, UFM's opensm ignores a partitions.conf of ours: each
network's partition becomes a PKey on UFM whose members are exactly the port
GUIDs of the file kvm-sriov renders (the same text the opensm backend sends,
read with base.parse). The endpoints, bodies and answers relied on, with
their sources, are in tests/unit/kvm_sriov/fabric/test_ufm.py's docstring:

    GET    /ufmRest/resources/pkeys?guids_data=true      every PKey and its GUIDs
    POST   /ufmRest/resources/pkeys/add                  a PKey without GUIDs
    POST   /ufmRest/resources/pkeys                      GUIDs added (PKey made if absent)
    DELETE /ufmRest/resources/pkeys/<pkey>/guids/<g,...> GUIDs removed
    DELETE /ufmRest/resources/pkeys/<pkey>               a PKey removed

Each run reads UFM's PKeys, then only changes what differs: a GUID already
there is not added again, one already gone is not removed again, so a run
repeated changes nothing. UFM has PKeys that are not kvm-sriov's (storage,
the administrators'): kvm-sriov only ever changes a PKey it made, recorded in
``pool.state_dir/ufm-pkeys.json`` (written before UFM is asked to make one,
so none is ever lost track of). A network whose PKey UFM has already, made
by someone else, is left out with one line: networks never join a partition
they do not own. A PKey kvm-sriov made and no network has any more (a
deleted network) is removed from UFM.

Credentials: ``fabric.ufm_credentials``, one line ``user:password``, in a file
only its owner (oneadmin, or root) can read: a file another user can read,
or a link, is refused in one line. TLS is verified against
``fabric.ufm_ca_file`` (or the system's CAs); it is never turned off. Each
call has ``fabric.ufm_seconds`` to connect and to answer, and is tried again
``fabric.ufm_retries`` times with a growing pause (urllib3's Retry) after a
connection error, a timeout, HTTP 429 or 5xx; what is still failing then is
one line. Redirects are not followed (the credentials go to UFM only).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from typing import Optional

from ..errors import DriverError, InputError
from ..files import atomic_write
from ..vf import state_folder
from .base import DEFAULT_PKEY, Manager, Member, Partition, Reading, Report, managed, one_line, parse

API = "/ufmRest/resources/pkeys"
STATE = "ufm-pkeys.json"
MAX_CREDENTIALS_BYTES = 4096
MAX_ANSWER_BYTES = 64 * 1024 * 1024      # every PKey with its GUIDs, a large fabric with room
MAX_STATE_BYTES = 1024 * 1024
ADD_BATCH = 1000                          # GUIDs per POST
REMOVE_BATCH = 64                         # GUIDs per DELETE (they are in the URL: ~1.1 KB)
BACKOFF_SECONDS = 0.5                     # urllib3 sleeps 0, then 2 x, 4 x this between tries
RETRY_STATUSES = (429, 500, 502, 503, 504)
HEX = set("0123456789abcdef")
MAX_LINE = 1500                           # what one run says
MEMBERSHIPS = ("full", "limited")         # UFM's (opensm's "both" it does not have)
MISSING = "missing python3-urllib3: apt-get install python3-urllib3"


class Refused(DriverError):
    """UFM answered a call with an error of its own (4xx): that PKey alone goes without.
    Any other DriverError (unreachable, too slow, 5xx, credentials) ends the run: the
    next calls would fare no better, and each would take its tries."""


class UFM(Manager):
    name = "ufm"
    own_default = True

    def __init__(self, cfg):
        self.cfg = cfg
        self.where = f"UFM {cfg.ufm_url}"
        self.fix = (f"make UFM at {cfg.ufm_url} reachable and its credentials ({cfg.ufm_credentials}) and CA "
                    f"({cfg.ufm_ca_file or 'the system CAs'}) right (fabric.ufm_*), and give each network a "
                    f"PKey no one else uses on UFM")

    # -- the interface -----------------------------------------------------------------
    def enforce(self, text: str, only: Optional[set[str]] = None) -> list[Report]:
        if only is not None and self.where not in only:
            return []
        try:
            return [Report(self.where, *self._enforce(text))]
        except (DriverError, InputError) as exc:
            return [Report(self.where, False, one_line(exc))]

    def enforced(self) -> list[Reading]:
        try:
            return [Reading(self.where, sorted(self._partitions().values()))]
        except (DriverError, InputError) as exc:
            return [Reading(self.where, None, one_line(exc))]

    def made(self) -> set[int]:
        return self._read_state()

    def missing(self) -> str:
        return MISSING if importlib.util.find_spec("urllib3") is None else ""

    # -- one run -----------------------------------------------------------------------
    def _enforce(self, text: str) -> tuple[bool, str]:
        desired = {p.pkey: p for p in parse(text) if p.pkey != DEFAULT_PKEY}  # UFM keeps its own default
        for p in desired.values():
            bad = sorted(f"{m.guid}={m.membership}" for m in p.members
                         if m.guid not in p.guids() or m.membership not in MEMBERSHIPS)
            if bad:
                raise InputError(f"partition {p.name}: {', '.join(bad[:3])} cannot be a UFM member (a GUID, full "
                                 f"or limited)")
        http = self._http()
        have = self._partitions(http)
        ours = self._read_state()
        problems, done = [], {"created": 0, "removed": 0, "added": 0, "dropped": 0}
        foreign = sorted(k for k in desired if k in have and not managed(ours, k))
        for k in foreign:
            problems.append(f"PKey 0x{k:04x} ({desired[k].name}) is on UFM already and not kvm-sriov's: left out "
                            f"(give the network another VLAN_ID, or delete the PKey on UFM)")
            del desired[k]
        self._write_state(ours | set(desired))      # before any is made: none is ever lost track of
        for k, p in sorted(desired.items()):
            try:
                self._one(http, p, have.get(k), done)
            except Refused as exc:
                problems.append(f"PKey 0x{k:04x}: {one_line(exc, 200)}")
        kept = set()
        for k in sorted(ours - set(desired)):          # its network is gone: so is its PKey
            try:
                if k in have:
                    self._call(http, "DELETE", f"{API}/0x{k:04x}", gone_ok=True)
                    done["removed"] += 1
            except Refused as exc:
                kept.add(k)
                problems.append(f"PKey 0x{k:04x} (no network has it now): {one_line(exc, 200)}")
        self._write_state(set(desired) | kept)
        said = (f"PKeys: {done['created']} created, {done['removed']} removed; GUIDs: {done['added']} added, "
                f"{done['dropped']} removed" if any(done.values()) else
                "nothing else to change" if problems else "every PKey up to date")
        if problems:
            return False, one_line(f"{len(problems)} problem(s): " + "; ".join(problems) + f"; {said}",
                                   MAX_LINE)
        return True, said

    def _one(self, http, want: Partition, have: Optional[Partition], done: dict) -> None:
        """Make one PKey's members what ``want`` lists (nothing when they are)."""
        key = f"0x{want.pkey:04x}"
        wanted = want.guids()
        present = have.guids() if have is not None else {}
        extra = sorted(g for g in present if g not in wanted)
        missing = sorted(g for g, m in wanted.items() if present.get(g) != m)
        for i in range(0, len(extra), REMOVE_BATCH):
            batch = extra[i:i + REMOVE_BATCH]
            try:
                self._call(http, "DELETE", f"{API}/{key}/guids/{','.join(batch)}", gone_ok=True)
            except Refused:   # e.g. one of them left meanwhile: the others, once more
                now = self._pkey_now(http, key)
                left = sorted(set(batch) & set(now.guids() if now is not None else ()))
                if left == batch:
                    raise
                if left:
                    self._call(http, "DELETE", f"{API}/{key}/guids/{','.join(left)}", gone_ok=True)
            done["dropped"] += len(batch)
        for membership in MEMBERSHIPS:
            guids = [g for g in missing if wanted[g] == membership]
            for i in range(0, len(guids), ADD_BATCH):
                self._call(http, "POST", API, {"pkey": key, "guids": guids[i:i + ADD_BATCH], "index0": False,
                                               "ip_over_ib": want.ipoib, "membership": membership})
                done["added"] += len(guids[i:i + ADD_BATCH])
        if have is None and missing:
            done["created"] += 1
        emptied = have is not None and extra and len(extra) == len(present) and not wanted
        if not wanted and (have is None or emptied):   # UFM drops a PKey with its last member
            try:
                self._call(http, "POST", f"{API}/add", {"pkey": key, "index0": False, "ip_over_ib": want.ipoib},
                           exists_ok=True)
            except Refused:   # it has it already (how UFM says so is not documented)
                if self._pkey_now(http, key) is None:
                    raise
            done["created"] += have is None

    def _pkey_now(self, http, key: str) -> Optional[Partition]:
        """One PKey as UFM has it now; None: it has not (UFM answers {} for that)."""
        answer = self._call(http, "GET", f"{API}/{key}?guids_data=true", gone_ok=True)
        found = self._read_partitions({key: answer} if isinstance(answer, dict) and answer else {})
        return found.get(int(key, 16) & 0x7FFF)

    def _partitions(self, http=None) -> dict[int, Partition]:
        """What UFM enforces: PKey -> its partition (UFM's default PKey left out)."""
        answer = self._call(http or self._http(), "GET", f"{API}?guids_data=true")
        if not isinstance(answer, dict):
            raise DriverError(f"{self.where} answered GET {API} with {type(answer).__name__}, not its PKeys")
        return self._read_partitions(answer)

    @staticmethod
    def _read_partitions(answer: dict) -> dict[int, Partition]:
        out = {}
        for text, data in answer.items():
            key = _pkey(text)
            if key is None or key == DEFAULT_PKEY or not isinstance(data, dict):
                continue
            members, listed = [], data.get("guids")
            for item in listed if isinstance(listed, list) else []:
                guid = _guid(item.get("guid") if isinstance(item, dict) else None)
                if guid is not None:
                    membership = item.get("membership")
                    members.append(Member(guid, membership if membership in ("full", "limited") else "full"))
            kinds = {m.membership for m in members}
            name = data.get("partition")
            out[key] = Partition(name if isinstance(name, str) else "", key,
                                 kinds.pop() if len(kinds) == 1 else "full",
                                 data.get("ip_over_ib") is not False, tuple(sorted(members)))
        return out

    # -- what kvm-sriov made ---------------------------------------------------------
    def _read_state(self) -> set[int]:
        try:
            fd = state_folder.open_file(self.cfg.state_dir / STATE, os.O_RDONLY)
        except FileNotFoundError:
            return set()
        except OSError as exc:
            raise DriverError(f"cannot read {self.cfg.state_dir / STATE}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_STATE_BYTES + 1)
        try:
            keys = json.loads(data.decode())["pkeys"]
            found = {_pkey(k) for k in keys}
        except (ValueError, KeyError, TypeError):
            found = {None}
        if len(data) > MAX_STATE_BYTES or None in found:
            raise DriverError(f"{self.cfg.state_dir / STATE} is not the list of PKeys kvm-sriov made on UFM: "
                              f"remove it only after deleting those PKeys on UFM")
        return found

    def _write_state(self, keys: set[int]) -> None:
        state_folder.make(self.cfg.state_dir)
        state_folder.check_files(self.cfg.state_dir / STATE)
        atomic_write(self.cfg.state_dir / STATE, json.dumps({"pkeys": [f"0x{k:04x}" for k in sorted(keys)]}),
                     mode=0o600)

    # -- HTTP ----------------------------------------------------------------------------
    def _http(self):
        try:
            import urllib3
            from urllib3.util.retry import Retry
        except ImportError:
            raise DriverError(MISSING) from None
        user = read_credentials(self.cfg.ufm_credentials)
        ca = str(self.cfg.ufm_ca_file) if self.cfg.ufm_ca_file else None
        if ca and not os.path.isfile(ca):
            raise DriverError(f"fabric.ufm_ca_file {ca} is not a file")
        retries = Retry(total=self.cfg.ufm_retries, connect=self.cfg.ufm_retries, read=self.cfg.ufm_retries,
                        status=self.cfg.ufm_retries, other=0, redirect=0, backoff_factor=BACKOFF_SECONDS,
                        status_forcelist=RETRY_STATUSES, allowed_methods=frozenset(("GET", "POST", "DELETE")),
                        raise_on_status=False, respect_retry_after_header=False)
        pool = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=ca, retries=retries,
                                   timeout=urllib3.Timeout(connect=self.cfg.ufm_seconds, read=self.cfg.ufm_seconds),
                                   headers=urllib3.make_headers(basic_auth=user, user_agent="kvm-sriov"))
        return pool

    def _call(self, http, method: str, path: str, body=None, gone_ok=False, exists_ok=False):
        """One call, its answer's JSON (None when it has none); DriverError (one line)
        once the tries are used up or UFM refuses it."""
        import urllib3
        shown = f"{method} {path.split('/guids/')[0]}{'/guids/...' if '/guids/' in path else ''}"
        tries = self.cfg.ufm_retries + 1
        try:
            answer = http.request(method, self.cfg.ufm_url + path, preload_content=False, redirect=False,
                                  body=None if body is None else json.dumps(body).encode(),
                                  headers=None if body is None else dict(http.headers,
                                                                         **{"Content-Type": "application/json"}))
        except urllib3.exceptions.MaxRetryError as exc:
            raise DriverError(_why(self.where, shown, exc.reason, tries, self.cfg)) from None
        except urllib3.exceptions.HTTPError as exc:
            raise DriverError(_why(self.where, shown, exc, tries, self.cfg)) from None
        try:   # never decompressed: a small answer cannot become a huge one
            data = answer.read(MAX_ANSWER_BYTES + 1, decode_content=False)
        except urllib3.exceptions.HTTPError as exc:
            raise DriverError(_why(self.where, shown, exc, tries, self.cfg)) from None
        finally:
            answer.release_conn()
        status = answer.status
        if status in (401, 403):
            raise DriverError(f"{self.where} refused the credentials in {self.cfg.ufm_credentials} "
                              f"(HTTP {status} to {shown})")
        if status == 404 and gone_ok or status == 409 and exists_ok:
            return None
        if status in RETRY_STATUSES:
            raise DriverError(f"{self.where} answered HTTP {status} to {shown}, {tries} time(s)")
        if not 200 <= status < 300:
            said = one_line(data[:300].decode("utf-8", "replace"), 120)
            raise Refused(f"{self.where} refused {shown}: HTTP {status}" + (f" ({said})" if said else ""))
        if len(data) > MAX_ANSWER_BYTES:
            raise DriverError(f"{self.where} answered {shown} with more than {MAX_ANSWER_BYTES >> 20} MiB")
        if answer.headers.get("Content-Encoding", "identity").lower() not in ("identity", ""):
            raise DriverError(f"{self.where} answered {shown} compressed, which kvm-sriov did not ask for")
        if not data.strip():
            return None
        try:
            return json.loads(data)
        except (ValueError, RecursionError):   # RecursionError: arrays nested past the interpreter's limit
            if method == "GET":
                raise DriverError(f"{self.where} answered {shown} with something that is not JSON") from None
            return None    # a change's answer is not needed


def _why(where: str, shown: str, reason, tries: int, cfg) -> str:
    import urllib3
    text = one_line(reason, 200)
    if isinstance(reason, urllib3.exceptions.SSLError) or "CERTIFICATE_VERIFY_FAILED" in text:
        trusted = f"fabric.ufm_ca_file {cfg.ufm_ca_file}" if cfg.ufm_ca_file else "the system CAs: set fabric.ufm_ca_file"
        return f"{where}: its TLS certificate is not trusted ({trusted}): {text}"
    if isinstance(reason, urllib3.exceptions.TimeoutError) and not isinstance(
            reason, urllib3.exceptions.NewConnectionError):   # urllib3 1.26 counts a refusal as a timeout
        return f"{where} did not answer {shown} in {cfg.ufm_seconds:.0f} s, {tries} time(s)"
    return f"{where} cannot be reached ({shown}, {tries} time(s)): {text}"


def read_credentials(path) -> str:
    """``user:password`` from the first line of a file only its owner (the running user or
    root) can read; a link, another kind of file, one others can read or change is refused."""
    if path is None:
        raise DriverError("fabric.ufm_credentials is not set: a file only oneadmin can read, holding user:password")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise DriverError(f"UFM credentials {path} is a link: refused (name the file itself)") from None
        raise DriverError(f"cannot read the UFM credentials {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise DriverError(f"UFM credentials {path} is not a plain file: refused")
        if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o077:
            raise DriverError(f"UFM credentials {path} can be read or changed by others (owner uid {st.st_uid}, "
                              f"mode {stat.S_IMODE(st.st_mode):04o}): refused; chown oneadmin and chmod 600 it")
        data = fh.read(MAX_CREDENTIALS_BYTES + 1)
    lines = data[:MAX_CREDENTIALS_BYTES].decode("utf-8", "replace").splitlines()
    user = lines[0].strip() if lines else ""
    if len(data) > MAX_CREDENTIALS_BYTES or ":" not in user or user.startswith(":"):
        raise DriverError(f"UFM credentials {path} must hold one line, user:password")
    return user


def _pkey(text) -> Optional[int]:
    if not isinstance(text, str) or not text.lower().startswith("0x"):
        return None
    try:
        value = int(text, 16) & 0x7FFF
    except ValueError:
        return None
    return value or None


def _guid(text) -> Optional[str]:
    """UFM's GUID ('0002c903000e0b72', maybe 0x or upper case) as base.Member has it."""
    if not isinstance(text, str):
        return None
    t = text.lower().removeprefix("0x").replace(":", "")
    return t.rjust(16, "0") if 0 < len(t) <= 16 and set(t) <= HEX else None

