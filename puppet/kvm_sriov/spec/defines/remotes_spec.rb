require 'spec_helper'

describe 'kvm_sriov::remotes' do
  on_supported_os.each do |os, os_facts|
    context "on #{os}" do
      let(:facts) { os_facts }
      let(:title) { 'fe' }

      context 'from a source tree' do
        let(:params) { { remotes_dir: '/var/lib/one/remotes', source: '/opt/kvm-sriov/' } }
        r = '/var/lib/one/remotes'

        it { is_expected.to compile.with_all_deps }
        it 'copies the actions, the library, the probes, never purging' do
          is_expected.to contain_file("#{r}/vmm/kvm-sriov").with(source: '/opt/kvm-sriov/vmm/kvm-sriov', recurse: true, purge: false, owner: 'oneadmin', ignore: ['__pycache__', '*.pyc', '.git'])
          is_expected.to contain_file("#{r}/vmm/kvm-sriov/kvm_sriov_bootstrap.py").with(source: '/opt/kvm-sriov/kvm_sriov_bootstrap.py', mode: '0644')
          is_expected.to contain_file("#{r}/vmm/kvm-sriov/lib/kvm_sriov").with(source: '/opt/kvm-sriov/kvm_sriov', recurse: true)
          is_expected.to contain_file("#{r}/im").with(source: '/opt/kvm-sriov/im', purge: false)
        end
        it 'creates the cluster-wide config once' do
          is_expected.to contain_file("#{r}/etc/vmm/kvm-sriov/kvm-sriov.toml").with(source: '/opt/kvm-sriov/etc/vmm/kvm-sriov/kvm-sriov.toml', replace: false)
        end
        it 'makes missing parents' do
          is_expected.to contain_exec('kvm_sriov-remotes-parents-fe').with_command(['install', '-d', '-o', 'oneadmin', '-g', 'oneadmin', "#{r}/vmm", "#{r}/im", "#{r}/etc/vmm"])
        end
      end

      context 'with cluster settings' do
        let(:params) { { remotes_dir: '/var/tmp/one', source: 'puppet:///modules/site/kvm-sriov', config_settings: { 'pool' => { 'numa_policy' => 'require' } } } }

        it do
          is_expected.to contain_file('/var/tmp/one/etc/vmm/kvm-sriov/kvm-sriov.toml')
            .with_content(%r{^\[pool\]\nnuma_policy = "require"\n\z})
            .with_content(%r{cluster-wide config})
        end
      end

      context 'from a package' do
        let(:params) { { remotes_dir: '/var/lib/one/remotes', package: 'opennebula-kvm-sriov' } }

        it { is_expected.to contain_package('opennebula-kvm-sriov').with_ensure('installed') }
        it { is_expected.not_to contain_file('/var/lib/one/remotes/vmm/kvm-sriov') }
      end

      context 'error paths' do
        [{}, { source: '/opt/k', package: 'p' }].each do |extra|
          context "with #{extra.keys.join(' and ').then { |s| s.empty? ? 'neither source nor package' : s }}" do
            let(:params) { { remotes_dir: '/var/tmp/one' }.merge(extra) }

            it { is_expected.to compile.and_raise_error(%r{exactly one of source and package}) }
          end
        end
        context 'with a relative source' do
          let(:params) { { remotes_dir: '/var/tmp/one', source: 'opt/k' } }

          it { is_expected.to compile.and_raise_error(%r{source}) }
        end
      end
    end
  end
end
