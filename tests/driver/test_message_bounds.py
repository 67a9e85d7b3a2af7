"""What a failed action says is bounded, whatever a template held: a
10,000-character PF selector is not echoed into the failure reason."""

import io

from kvm_sriov import opennebula
from kvm_sriov.actions import main
from kvm_sriov.node.host import Host
from kvm_sriov.domain.hypervisor import Hypervisor
from tests.support.stock_standin import StockOnTestDriver
from tests.support.actions_in_process import deployment


def test_a_huge_pf_selector_is_not_echoed_into_the_failure_reason(fake_host, make_config, conn, capsys,
                                                                   monkeypatch, tmp_path):
    stock = StockOnTestDriver(conn).install(monkeypatch)
    host = Host(make_config(fake_host["root"]), Hypervisor("test:///default"), remotes_dir=tmp_path / "r")
    dep = tmp_path / "datastores" / "0" / "42" / "deployment.0"
    selector = "mlx5_" + "w" * 10000
    code = main("deploy", [str(dep), "host1", "42", "host1"], host=host,
                stdin=io.StringIO(deployment(bridge=f"ib-sriov:{selector}")))
    err = capsys.readouterr().err
    reason = opennebula.reason_from_stderr(err)
    assert code == 1 and stock.calls == []
    assert "mlx5_www" in reason and "w" * opennebula.MAX_WORD not in err
    assert len(err) < 1000, len(err)
