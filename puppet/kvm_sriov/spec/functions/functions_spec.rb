require 'spec_helper'

describe 'kvm_sriov::toml_value' do
  it { is_expected.to run.with_params('a"b\\c').and_return('"a\\"b\\\\c"') }
  it { is_expected.to run.with_params('a$b').and_return('"a$b"') }
  it { is_expected.to run.with_params(true).and_return('true') }
  it { is_expected.to run.with_params(300).and_return('300') }
  it { is_expected.to run.with_params(['0000:03:00.0', 'ib1']).and_return('["0000:03:00.0", "ib1"]') }
  it { is_expected.to run.with_params([]).and_return('[]') }
  it { is_expected.to run.with_params("a\nb").and_raise_error(%r{expects a Kvm_sriov::Tomlvalue}) }
end

describe 'kvm_sriov::pf_device_path' do
  it { is_expected.to run.with_params('03:00.0').and_return('/sys/bus/pci/devices/0000:03:00.0') }
  it { is_expected.to run.with_params('0000:AF:00.1', '/x/sys/').and_return('/x/sys/bus/pci/devices/0000:af:00.1') }
  it { is_expected.to run.with_params('mlx4_1').and_return('/sys/class/infiniband/mlx4_1/device') }
  it { is_expected.to run.with_params('ib0').and_return('/sys/class/net/ib0/device') }
  it { is_expected.to run.with_params('../etc').and_raise_error(%r{Kvm_sriov::Pfname}) }
end

describe 'kvm_sriov::merge_settings' do
  it 'drops unset keys and empty sections, typed keys win, sorted' do
    is_expected.to run.with_params(
      { 'pool' => { 'numa_policy' => 'ignore', 'b' => 1 }, 'x' => {} },
      { 'pool' => { 'numa_policy' => 'require', 'pfs' => nil }, 'network' => { 'bridge' => nil } },
    ).and_return('pool' => { 'b' => 1, 'numa_policy' => 'require' })
  end
end
