require 'spec_helper'

describe 'kvm_sriov::pf' do
  on_supported_os.each do |os, os_facts|
    context "on #{os}" do
      let(:facts) { os_facts }
      let(:pre_condition) { "class { 'kvm_sriov::host': manage_libvirt => false }" }

      context 'mlx5 by PCI address without domain' do
        let(:title) { '03:00.0' }
        let(:params) { { numvfs: 8, drivers_autoprobe: false } }
        dev = '/sys/bus/pci/devices/0000:03:00.0'

        it { is_expected.to compile.with_all_deps }
        it 'leaves a boot file for the unit' do
          is_expected.to contain_file('/etc/kvm-sriov/vfs.d/03_00.0.conf')
            .with_content(%r{^DEVICE=#{dev}\nNUMVFS=8\nAUTOPROBE=0\n\z})
        end
        it 'sets the count now unless already so' do
          is_expected.to contain_exec('kvm_sriov-numvfs-03:00.0').with(
            command: "/usr/local/sbin/kvm-sriov-vfs set #{dev} 8 --autoprobe 0",
            unless: "test ! -x /usr/local/sbin/kvm-sriov-vfs || /usr/local/sbin/kvm-sriov-vfs check #{dev} 8 --autoprobe 0",
            provider: 'shell',
          ).that_requires('File[/usr/local/sbin/kvm-sriov-vfs]')
        end
      end

      context 'mlx5 by IB device, forced' do
        let(:title) { 'mlx5_0' }
        let(:params) { { numvfs: 0, force: true } }

        it { is_expected.to contain_file('/etc/kvm-sriov/vfs.d/mlx5_0.conf').with_content(%r{^DEVICE=/sys/class/infiniband/mlx5_0/device\nNUMVFS=0\n\z}) }
        it do
          is_expected.to contain_exec('kvm_sriov-numvfs-mlx5_0').with(
            command: '/usr/local/sbin/kvm-sriov-vfs set /sys/class/infiniband/mlx5_0/device 0 --force',
            unless: %r{\|\| /usr/local/sbin/kvm-sriov-vfs check /sys/class/infiniband/mlx5_0/device 0\z},
          )
        end
      end

      context 'mlx5 by netdev under a fake sysfs' do
        let(:pre_condition) { "class { 'kvm_sriov::host': manage_libvirt => false, sysfs_root => '/tmp/fake/sys/' }" }
        let(:title) { 'ib0' }
        let(:params) { { numvfs: 2 } }

        it { is_expected.to contain_file('/etc/kvm-sriov/vfs.d/ib0.conf').with_content(%r{^DEVICE=/tmp/fake/sys/class/net/ib0/device$}) }
      end

      context 'mlx4 listed in the host class' do
        let(:pre_condition) { "class { 'kvm_sriov::host': manage_libvirt => false, pfs => { '0000:04:00.0' => { numvfs => 4, driver => 'mlx4' } } }" }
        let(:title) { '0000:04:00.0' }
        let(:params) { { numvfs: 4, driver: 'mlx4' } }

        # The host class already declares it: compiling proves the define accepts it.
        it { is_expected.to compile.and_raise_error(%r{Duplicate declaration}) }
      end

      context 'error paths' do
        context 'without the host class' do
          let(:pre_condition) { '' }
          let(:title) { 'mlx5_0' }
          let(:params) { { numvfs: 2 } }

          it { is_expected.to compile.and_raise_error(%r{declare class kvm_sriov::host before its PFs}) }
        end
        context 'a mlx4 PF not listed in the host class' do
          let(:title) { '0000:04:00.0' }
          let(:params) { { numvfs: 2, driver: 'mlx4' } }

          it { is_expected.to compile.and_raise_error(%r{must be listed in kvm_sriov::host::pfs}) }
        end
        context 'a mlx4 PF by netdev' do
          let(:title) { 'ib1' }
          let(:params) { { numvfs: 2, driver: 'mlx4' } }

          it { is_expected.to compile.and_raise_error(%r{per PCI address}) }
        end
        context 'a title that is no PF name' do
          let(:title) { 'a b' }
          let(:params) { { numvfs: 2 } }

          it { is_expected.to compile.and_raise_error(%r{is not a PCI address, IB device or netdev name}) }
        end
        context 'a negative count' do
          let(:title) { 'mlx5_0' }
          let(:params) { { numvfs: -1 } }

          it { is_expected.to compile.and_raise_error(%r{numvfs}) }
        end
      end
    end
  end
end
