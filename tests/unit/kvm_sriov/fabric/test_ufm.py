"""UFM as the partition manager (kvm_sriov/fabric/ufm.py), against the stand-in
tests/support/ufm_standin.py: UFM itself cannot run here, so everything below is
proven against the stand-in only, which answers as these sources say UFM does.

What the client relies on (read, nothing copied):

- Authentication: HTTP basic on /ufmRest/... ("For basic authentication, run: curl -k
  https://<ufm-ip>/ufmRest/resources/systems -u <username>:<password>"), NVIDIA UFM
  Enterprise REST API Guide v6.22.1, REST API Complementary Information,
  https://docs.nvidia.com/networking/display/ufmenterpriserestapiv6221/REST+API+Complementary+Information
  A refusal is taken from the status alone (401 or 403), never from its body (a login
  page, not JSON); it is not tried again.
- GET /ufmRest/resources/pkeys?guids_data=true -> {"0x12": {"partition": ..., "ip_over_ib":
  bool, "guids": [{"guid": "0002c903000e0b72", "membership": "full"|"limited", "index0":
  bool}, ...]}, ...}: the PKeys UFM has. Shape from
  https://github.com/Mellanox/ib-kubernetes pkg/sm/plugins/ufm/ufm.go (ListGuidsInUse: GET
  /ufmRest/resources/pkeys/?guids_data=true, a map of PKey to {"guids": [{"guid": ...}]},
  GUIDs "without any delimiters") and https://github.com/openbce/ufmclient
  client/src/lib.rs list_partition (partition, ip_over_ib, guids with guid/index0/membership).
  GUIDs are read case-insensitively, with or without 0x; PKeys as hex strings, padded or not.
- GET /ufmRest/resources/pkeys/<pkey>?guids_data=true -> that PKey's object; a PKey UFM does
  not have is HTTP 200 with {} (https://github.com/openbce/kperf pkg/ufm/ufm.go GetIBNetwork
  and openbce/ufmclient's get_partition both test `data == "{}"` for "not found"); a 404 is
  taken the same way.
- POST /ufmRest/resources/pkeys/add {"pkey": "0x1000", "index0": false, "ip_over_ib": true}:
  "Allows creating a PKey without GUIDs ... The required parameters are PKey only",
  UFM Enterprise REST API Guide v6.22.1, PKey GUIDs Rest API,
  https://docs.nvidia.com/networking/display/ufmenterpriserestapiv6221/pkey+guids+rest+api
  Used only for a partition without members. What UFM answers for a PKey it has already is
  not documented: a 409, or any refusal after which a GET shows the PKey, is success.
- POST /ufmRest/resources/pkeys {"pkey": "0x1000", "guids": ["02000a0008640001", ...],
  "index0": false, "ip_over_ib": true, "membership": "full"|"limited"}: "adds a list of
  configured GUIDs to PKey"; guids "a hexadecimal string with a minimum length of 16
  characters and maximum length of 20"; pkey "between 0x0-0x7fff exclusive"; index0 default
  False; ip_over_ib default True; membership "full"/"limited", default "full" (same guide,
  https://docs.nvidia.com/networking/display/UFMEnterpriseRESTAPILatest/PKey+GUIDs+Rest+API).
  It makes the PKey when UFM has none (ib-kubernetes' AddGuidsToPKey posts here without
  creating it first). One call per membership, at most 1000 GUIDs each; only GUIDs missing
  or with another membership are sent (adding one already there is never needed).
- DELETE /ufmRest/resources/pkeys/<pkey>/guids/<guid>,<guid>,...: "Remove GUIDs from PKey"
  (the guide's main operations; the path as NVIDIA's config-manager UFM mock serves it and
  https://github.com/vhspace/ufm-mcp ufm_remove_guids_from_pkey calls it). At most 64 GUIDs a call (they are in the URL). Only GUIDs the
  listing shows are removed; a 404 (the PKey is gone) is success, and so is any refusal
  after which a GET shows none of them (one already gone: "One or more GUIDs may not exist
  in this pkey", that MCP tool's hint for such an error). Quirk: "Like real UFM, a partition
  is auto-removed once its last member is removed" (that mock): a partition kvm-sriov keeps
  without members is made again with /pkeys/add.
- DELETE /ufmRest/resources/pkeys/<pkey>: "Delete PKey" (the guide's main operations;
  openbce/kperf's DeleteIBNetwork and openbce/ufmclient's delete_partition use this path); a
  404 is success (it is gone).
- Retries: urllib3's Retry (Debian's python3-urllib3), on connection errors, timeouts and
  HTTP 429/500/502/503/504, fabric.ufm_retries times after the first try, backoff 0.5 s
  doubling, Retry-After not obeyed (a huge one would hold the hook), no redirect followed.
"""

import os
import subprocess
import sys

import pytest

from kvm_sriov import config
from kvm_sriov.errors import ConfigError
from kvm_sriov.fabric import base, manager
from kvm_sriov.frontend import network_hook
from kvm_sriov.ib import partitions
from kvm_sriov.node import doctor
from tests.support.ufm_standin import UFMStandin


def credentials(tmp_path, text="admin:123456\n", mode=0o600):
    path = tmp_path / "ufm-credentials"
    path.write_text(text)
    path.chmod(mode)
    return path


def cfg_for(tmp_path, url, **fabric):
    fabric = {"manager": "ufm", "ufm_url": url, "ufm_credentials": str(credentials(tmp_path)),
              "ufm_retries": 2, "ufm_seconds": 5, **fabric}
    return config.load(files=[], overrides={"pool": {"state_dir": str(tmp_path / "state")}, "fabric": fabric})


def vnet(vid, vlan, mac, size, membership="full", uid=1):
    limited = "<PKEY_MEMBERSHIP>limited</PKEY_MEMBERSHIP>" if membership == "limited" else ""
    ar = f"<AR><AR_ID>0</AR_ID><MAC>{mac}</MAC><SIZE>{size}</SIZE></AR>" if size else ""
    return (f"<VNET><ID>{vid}</ID><UID>{uid}</UID><GID>1</GID><NAME>net{vid}</NAME><BRIDGE>ib-sriov</BRIDGE>"
            f"<VLAN_ID>{vlan}</VLAN_ID><TEMPLATE>{limited}</TEMPLATE><AR_POOL>{ar}</AR_POOL></VNET>")


class Oned:
    """oned's networks, as the hook reads them (every key given: nothing is written)."""

    def __init__(self, *vnets):
        self.vnets = list(vnets)

    def pool_xml(self):
        return "<VNET_POOL>" + "".join(self.vnets) + "</VNET_POOL>"

    def merge(self, vid, template):
        raise AssertionError(f"nothing to write into network {vid}")


def rendered(*vnets):
    return partitions.render(partitions.networks_from_xml("<VNET_POOL>" + "".join(vnets) + "</VNET_POOL>"))


A = vnet(1, "0x1000", "02:00:0a:00:00:01", 2)
B = vnet(2, "0x1001", "02:00:0b:00:00:01", 1, membership="limited")
A_GUIDS = {"02000a0004000001": "full", "02000a0004000002": "full",     # with network 1 in them
           "02000a0000000001": "full", "02000a0000000002": "full"}     # MAC-only (older VMs)
B_GUIDS = {"02000b0006000001": "limited", "02000b0000000001": "limited"}


def test_the_hooks_partitions_reach_ufm_and_follow_the_networks(tmp_path, standin):
    cfg, oned = cfg_for(tmp_path, standin.url), Oned(A, B)
    out = network_hook.run(cfg, None, oned)
    assert out.ok, out.message
    assert standin.members(0x1000) == A_GUIDS and standin.members(0x1001) == B_GUIDS
    assert standin.pkeys[0x1000]["ip_over_ib"] is True and standin.pkeys[0x1000]["index0"] is False
    assert out.message.startswith(f"UFM {standin.url}: PKeys: 2 created, 0 removed; GUIDs: 6 added, 0 removed")
    assert 0x7FFF not in standin.pkeys                      # UFM keeps its own default partition
    assert doctor.check_network_hook(cfg)[0].level == "OK"

    oned.vnets = [vnet(1, "0x1000", "02:00:0a:00:00:01", 1)]   # network 2 deleted, network 1's range shrunk
    out = network_hook.run(cfg, None, oned)
    assert out.ok, out.message
    assert standin.members(0x1000) == {"02000a0004000001": "full", "02000a0000000001": "full"}
    assert 0x1001 not in standin.pkeys
    assert "PKeys: 0 created, 1 removed; GUIDs: 0 added, 2 removed" in out.message

    standin.requests.clear()                              # the same again: nothing to change
    out = network_hook.run(cfg, None, oned)
    assert out.ok and "every PKey up to date" in out.message
    assert [(m, p) for m, p, _, _ in standin.requests] == [("GET", "/ufmRest/resources/pkeys")]


def test_a_network_becoming_limited_moves_its_guids_to_limited(tmp_path, standin):
    cfg = cfg_for(tmp_path, standin.url)
    assert manager.enforce(cfg, rendered(A))
    manager.enforce(cfg, rendered(vnet(1, "0x1000", "02:00:0a:00:00:01", 2, membership="limited")))
    assert set(standin.members(0x1000).values()) == {"limited"} and len(standin.members(0x1000)) == 4


def test_a_pkey_ufm_has_that_kvm_sriov_did_not_make_is_never_touched(tmp_path, standin):
    standin.pkeys[0x1000] = {"partition": "storage", "ip_over_ib": True, "index0": False,
                             "guids": {"0002c903000e0b72": {"membership": "full", "index0": False}}}
    cfg = cfg_for(tmp_path, standin.url)
    with pytest.raises(Exception) as failed:
        manager.enforce(cfg, rendered(A, B))
    message = str(failed.value)
    assert "\n" not in message and "PKey 0x1000 (one_vnet_1) is on UFM already and not kvm-sriov's" in message
    assert standin.members(0x1000) == {"0002c903000e0b72": "full"}       # the storage partition as it was
    assert standin.members(0x1001) == B_GUIDS                            # the other network still goes on
    manager.enforce(cfg, rendered(B))                                   # and 0x1000 is never removed either
    assert standin.members(0x1000) == {"0002c903000e0b72": "full"}


def test_a_guid_gone_meanwhile_and_a_pkey_emptied_by_ufm_are_no_failure(tmp_path, standin):
    cfg = cfg_for(tmp_path, standin.url)
    manager.enforce(cfg, rendered(A))

    def someone_else_removes_it_first(method, path):
        if method == "DELETE" and "/guids/" in path:
            standin.pkeys[0x1000]["guids"].pop("02000a0000000002", None)
    standin.before = someone_else_removes_it_first
    assert manager.enforce(cfg, rendered(vnet(1, "0x1000", "02:00:0a:00:00:01", 1)))
    assert standin.calls("DELETE")[0][3] == 400                       # UFM refused: one was not a member
    assert standin.members(0x1000) == {"02000a0004000001": "full", "02000a0000000001": "full"}
    standin.before = None

    line = manager.enforce(cfg, rendered(vnet(1, "0x1000", "02:00:0a:00:00:01", 0)))   # no address range left
    assert 0x1000 in standin.pkeys and standin.members(0x1000) == {}   # UFM dropped it, made again empty
    assert "GUIDs: 0 added, 2 removed" in line
    assert [(m, p) for m, p, _, _ in standin.calls("POST")][-1] == ("POST", "/ufmRest/resources/pkeys/add")


def test_what_ufm_enforces_is_read_back(tmp_path, standin):
    cfg = cfg_for(tmp_path, standin.url)
    manager.enforce(cfg, rendered(A, B))
    (reading,) = manager.for_config(cfg).enforced()
    assert reading.where == f"UFM {standin.url}" and reading.error == ""
    got = {p.pkey: (p.membership, p.guids()) for p in reading.partitions}
    want = {p.pkey: (p.membership, p.guids()) for p in base.parse(rendered(A, B)) if p.pkey != base.DEFAULT_PKEY}
    assert got == want


def test_a_ufm_that_always_fails_is_tried_a_bounded_number_of_times(tmp_path, standin):
    standin.always = 503
    cfg = cfg_for(tmp_path, standin.url, ufm_retries=2)
    out = network_hook.run(cfg, None, Oned(A))
    assert not out.ok and "\n" not in out.message
    assert f"UFM {standin.url} answered HTTP 503 to GET /ufmRest/resources/pkeys?guids_data=true, 3 time(s)" \
        in out.message, out.message
    assert len(standin.requests) == 3
    assert doctor.check_network_hook(cfg)[0].level == "FAIL"
    assert "fabric.ufm_" in doctor.check_network_hook(cfg)[0].fix


def test_ufm_failing_in_the_middle_ends_the_run_at_the_first_call_that_gives_up(tmp_path, standin):
    def fail_after_the_listing(method, path):
        if method == "POST":
            standin.always = 503
    standin.before = fail_after_the_listing
    with pytest.raises(Exception, match=r"answered HTTP 503 to POST /ufmRest/resources/pkeys, 3 time\(s\)$"):
        manager.enforce(cfg_for(tmp_path, standin.url, ufm_retries=2), rendered(A, B))
    assert [m for m, _, _, _ in standin.requests] == ["GET", "POST", "POST", "POST"]   # not B's tries too


def test_a_few_failed_calls_are_tried_again(tmp_path, standin):
    standin.faults = [503, 502]
    assert "2 created" in manager.enforce(cfg_for(tmp_path, standin.url, ufm_retries=2), rendered(A, B))
    assert [s for _, _, _, s in standin.requests][:3] == [503, 502, 200]


def test_a_ufm_too_slow_to_answer_is_given_up_on(tmp_path, standin):
    standin.faults, standin.slow_seconds = ["slow", "slow"], 4
    cfg = cfg_for(tmp_path, standin.url, ufm_seconds=1, ufm_retries=1)
    with pytest.raises(Exception, match=r"did not answer GET /ufmRest/resources/pkeys\?guids_data=true in 1 s, "
                                        r"2 time\(s\)"):
        manager.enforce(cfg, rendered(A))


def test_ufm_unreachable_is_one_line(tmp_path):
    cfg = cfg_for(tmp_path, "http://127.0.0.1:9", ufm_retries=1)
    reports = manager.for_config(cfg).enforce(rendered(A))
    assert not reports[0].ok and "cannot be reached (GET /ufmRest/resources/pkeys?guids_data=true, 2 time(s))" \
        in reports[0].message and "\n" not in reports[0].message


def test_wrong_credentials_are_said_once_and_not_tried_again(tmp_path, standin):
    cfg = cfg_for(tmp_path, standin.url)
    credentials(tmp_path, "admin:wrong\n")
    (report,) = manager.for_config(cfg).enforce(rendered(A))
    assert not report.ok and report.message == (f"UFM {standin.url} refused the credentials in "
                                                f"{tmp_path / 'ufm-credentials'} (HTTP 401 to GET "
                                                f"/ufmRest/resources/pkeys?guids_data=true)")
    assert len(standin.requests) == 1


@pytest.mark.parametrize("case, why", [
    ("readable by its group", "can be read or changed by others"),
    ("readable by all", "can be read or changed by others"),
    ("another user's", "can be read or changed by others (owner uid 4242"),
    ("a link", "is a link: refused"),
    ("a FIFO", "is not a plain file"),
    ("missing", "No such file"),
    ("empty", "must hold one line, user:password"),
    ("no password", "must hold one line, user:password"),
    ("1 MiB", "must hold one line, user:password"),
])
def test_a_credentials_file_others_could_read_or_swap_is_refused_before_any_call(tmp_path, standin, case, why):
    cfg = cfg_for(tmp_path, standin.url)
    path = tmp_path / "ufm-credentials"
    if case == "readable by its group":
        path.chmod(0o640)
    elif case == "readable by all":
        path.chmod(0o644)
    elif case == "another user's":
        os.chown(path, 4242, 4242)
    elif case == "a link":
        path.rename(tmp_path / "real")
        path.symlink_to(tmp_path / "real")
    elif case == "a FIFO":
        path.unlink()
        os.mkfifo(path, 0o600)
    elif case == "missing":
        path.unlink()
    else:
        path.write_text({"empty": "", "no password": "admin\n", "1 MiB": "a:b" * 400000}[case])
    (report,) = manager.for_config(cfg).enforce(rendered(A))
    assert not report.ok and why in report.message and str(path) in report.message and "\n" not in report.message
    assert standin.requests == []


# -- TLS --------------------------------------------------------------------------------
def self_signed(folder, name="localhost"):
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", f"/CN={name}", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_standin(tmp_path):
    server = UFMStandin(tls=self_signed(tmp_path))
    yield server
    server.close()


def test_tls_is_checked_against_the_configured_ca(tmp_path, tls_standin):
    assert tls_standin.url.startswith("https://")
    cfg = cfg_for(tmp_path, tls_standin.url, ufm_ca_file=str(tmp_path / "localhost.pem"))
    assert "1 created" in manager.enforce(cfg, rendered(A))
    assert tls_standin.members(0x1000) == A_GUIDS


@pytest.mark.parametrize("ca", ["", "another"])
def test_a_certificate_the_ca_did_not_sign_is_refused(tmp_path, tls_standin, ca):
    if ca:
        self_signed(tmp_path, ca)
    cfg = cfg_for(tmp_path, tls_standin.url, ufm_retries=0,
                  ufm_ca_file=str(tmp_path / f"{ca}.pem") if ca else "")
    (report,) = manager.for_config(cfg).enforce(rendered(A))
    assert not report.ok and "its TLS certificate is not trusted" in report.message
    assert ("set fabric.ufm_ca_file" in report.message) == (not ca)
    assert tls_standin.requests == [] and "\n" not in report.message


# -- the rest -------------------------------------------------------------------------------
@pytest.mark.parametrize("fabric, why", [
    ({"manager": "ufm", "ufm_url": "http://ufm.example.org", "ufm_credentials": "/x"}, "must be https://"),
    ({"manager": "ufm", "ufm_url": "https://ufm.example.org/path?x", "ufm_credentials": "/x"}, "is not https://"),
    ({"manager": "ufm", "ufm_url": "https://ufm.example.org"}, "set fabric.ufm_credentials"),
    ({"manager": "ufm", "ufm_url": "https://u", "ufm_credentials": "relative"}, "absolute path"),
    ({"ufm_retries": 50}, "from 0 to 10"),
    ({"ufm_seconds": 0}, "from 1 to 600"),
])
def test_a_bad_ufm_config_is_one_line(fabric, why):
    with pytest.raises(ConfigError, match=why):
        config.load(files=[], overrides={"fabric": fabric})


def test_without_urllib3_it_says_what_to_install(tmp_path, standin, monkeypatch):
    monkeypatch.setitem(sys.modules, "urllib3", None)
    (report,) = manager.for_config(cfg_for(tmp_path, standin.url)).enforce(rendered(A))
    assert not report.ok and report.message == "missing python3-urllib3: apt-get install python3-urllib3"


def test_a_state_file_that_is_not_kvm_sriovs_list_stops_the_run(tmp_path, standin):
    cfg = cfg_for(tmp_path, standin.url)
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "ufm-pkeys.json").write_text("[1, 2")
    (report,) = manager.for_config(cfg).enforce(rendered(A))
    assert not report.ok and "is not the list of PKeys kvm-sriov made on UFM" in report.message
    assert standin.pkeys == {}


@pytest.mark.parametrize("body, why", [
    (b"<html>502 Bad Gateway", "with something that is not JSON"),
    (b"[" * 100000 + b"]" * 100000, "with something that is not JSON"),
    (b'["a list"]', "with list, not its PKeys"),
    (b"{}", "compressed, which kvm-sriov did not ask for"),
], ids=["HTML", "nested 100,000 deep", "a list", "gzip"])
def test_an_answer_that_is_not_ufms_is_one_line(tmp_path, standin, body, why):
    standin.raw = body
    if why.startswith("compressed"):
        standin.headers = {"Content-Encoding": "gzip"}
    (report,) = manager.for_config(cfg_for(tmp_path, standin.url)).enforce(rendered(A))
    assert not report.ok and why in report.message and "\n" not in report.message


def test_odd_members_in_ufms_listing_are_read_without_a_traceback(tmp_path, standin):
    standin.raw = (b'{"0x1000": {"partition": 5, "guids": 7}, "0x1001": {"guids": [1, {"guid": "zz"}, '
                   b'{"guid": "0x0002C903000E0B72", "membership": "both"}]}, "junk": 3, "0x7fff": {}}')
    (reading,) = manager.for_config(cfg_for(tmp_path, standin.url)).enforced()
    assert reading.partitions == [base.Partition("", 0x1000, "full", True, ()),
                                  base.Partition("", 0x1001, "full", True,
                                                 (base.Member("0002c903000e0b72", "full"),))]


def test_many_guids_go_in_bounded_calls(tmp_path, standin):
    big = vnet(1, "0x1000", "02:00:0a:00:00:01", 700)           # 1400 GUIDs with the MAC-only ones
    cfg = cfg_for(tmp_path, standin.url)
    manager.enforce(cfg, rendered(big))
    assert len(standin.members(0x1000)) == 1400
    assert [len(b["guids"]) for _, p, b, _ in standin.calls("POST")] == [1000, 400]
    manager.enforce(cfg, rendered(vnet(1, "0x1000", "02:00:0a:00:00:01", 100)))
    assert len(standin.calls("DELETE")) == 19 and all(len(p) < 1200 for _, p, _, _ in standin.calls("DELETE")) and len(standin.members(0x1000)) == 200
