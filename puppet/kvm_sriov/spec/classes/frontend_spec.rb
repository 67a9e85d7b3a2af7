require 'spec_helper'

describe 'kvm_sriov::frontend' do
  on_supported_os.each do |os, os_facts|
    context "on #{os}" do
      let(:facts) { os_facts }

      context 'from a source tree' do
        let(:params) { { source: '/opt/kvm-sriov' } }

        it { is_expected.to compile.with_all_deps }
        it { is_expected.to contain_kvm_sriov__remotes('frontend').with(remotes_dir: '/var/lib/one/remotes', source: '/opt/kvm-sriov') }
        it { is_expected.to contain_file('/var/lib/one/remotes/vmm/kvm-sriov').with_source('/opt/kvm-sriov/vmm/kvm-sriov') }
        it { is_expected.to contain_file('/usr/share/kvm-sriov/templates').with(source: '/opt/kvm-sriov/templates', recurse: true) }
        it { is_expected.to contain_file('/var/lib/one/remotes/scheduler/kvm-sriov/place').with(source: '/opt/kvm-sriov/sched/kvm-sriov/place', mode: '0755', owner: 'oneadmin') }

        it 'renders the VM_MAD entry of templates/oned/oned.conf.vm_mad' do
          is_expected.to contain_file('/etc/one/kvm-sriov-vm_mad.conf').with_content(<<~MAD)
            VM_MAD = [
                NAME           = "kvm-sriov",
                SUNSTONE_NAME  = "KVM SR-IOV",
                EXECUTABLE     = "one_vmm_exec",
                ARGUMENTS      = "-t 15 -r 0 kvm-sriov -p",
                DEFAULT        = "vmm_exec/vmm_exec_kvm-sriov.conf",
                TYPE           = "kvm",
                KEEP_SNAPSHOTS = "yes",
                LIVE_RESIZE    = "yes" ]
          MAD
        end
        it 'registers it by setup-frontend from the installed library, the placer left alone' do
          lib = '/var/lib/one/remotes/vmm/kvm-sriov/lib'
          opts = '--oned-conf /etc/one/oned.conf --templates /usr/share/kvm-sriov/templates ' \
                 '--remotes /var/lib/one/remotes --vm-mad /etc/one/kvm-sriov-vm_mad.conf --no-placer'
          is_expected.to contain_exec('kvm_sriov-oned-setup').with(
            command: "/usr/bin/python3 -m kvm_sriov.frontend.oned_conf setup #{opts}",
            unless: "test ! -d #{lib}/kvm_sriov || /usr/bin/python3 -m kvm_sriov.frontend.oned_conf check #{opts}",
            environment: ["PYTHONPATH=#{lib}"],
          ).that_requires(['Kvm_sriov::Remotes[frontend]', 'File[/etc/one/kvm-sriov-vm_mad.conf]',
                           'File[/var/lib/one/remotes/scheduler/kvm-sriov/place]', 'File[/usr/share/kvm-sriov/templates]'])
        end
        it { is_expected.to contain_exec('kvm_sriov-oned-notice').with(refreshonly: true, command: %r{restart oned}).that_subscribes_to('Exec[kvm_sriov-oned-setup]') }
        it { is_expected.not_to contain_exec('kvm_sriov-oned-restart') }
        it { is_expected.not_to contain_exec('kvm_sriov-onehost-sync') }
        it 'registers the network hooks as oneadmin after setup-frontend, when check says they differ' do
          lib = '/var/lib/one/remotes/vmm/kvm-sriov/lib'
          opts = '--command /opt/kvm-sriov/bin/kvm-sriov\\ network-hook'
          is_expected.to contain_exec('kvm_sriov-setup-hooks').with(
            command: "/usr/bin/python3 -m kvm_sriov.frontend.network_hook setup #{opts}",
            unless: "test ! -d #{lib}/kvm_sriov || /usr/bin/python3 -m kvm_sriov.frontend.network_hook check #{opts}",
            onlyif: nil,
            user: 'oneadmin',
            environment: ["PYTHONPATH=#{lib}", 'ONE_AUTH=/var/lib/one/.one/one_auth'],
            tries: 20,
          ).that_requires(['Kvm_sriov::Remotes[frontend]', 'Exec[kvm_sriov-oned-setup]'])
        end
      end

      context 'selecting the kvm-sriov placer' do
        let(:params) { { source: '/opt/kvm-sriov', manage_sched_mad: true, oned_service: 'opennebula' } }

        it { is_expected.to compile.with_all_deps }
        it { is_expected.to contain_exec('kvm_sriov-oned-setup').with_command(%r{ --vm-mad /etc/one/kvm-sriov-vm_mad.conf$}) }
        it { is_expected.to contain_exec('kvm_sriov-oned-restart').that_subscribes_to('Exec[kvm_sriov-oned-setup]') }
        it 'registers the hooks only while oned runs, after its restart' do
          is_expected.to contain_exec('kvm_sriov-setup-hooks').with_onlyif('systemctl is-active --quiet opennebula')
                                                             .that_requires('Exec[kvm_sriov-oned-restart]')
        end
      end

      context 'the hooks after a service oned that the catalog manages' do
        let(:pre_condition) { "service { 'opennebula': ensure => running }" }
        let(:params) do
          { source: '/opt/kvm-sriov/', oned_service: 'opennebula', one_xmlrpc: 'http://fe.example.org:2633/RPC2',
            hooks_user: 'one', one_auth: '/srv/one/one_auth', hooks_command: '/usr/local/bin/kvm-sriov network-hook' }
        end

        it { is_expected.to compile.with_all_deps }
        it do
          is_expected.to contain_exec('kvm_sriov-setup-hooks').with(
            command: '/usr/bin/python3 -m kvm_sriov.frontend.network_hook setup --command /usr/local/bin/kvm-sriov\\ network-hook ' \
                     '--endpoint http://fe.example.org:2633/RPC2',
            user: 'one',
            environment: ['PYTHONPATH=/var/lib/one/remotes/vmm/kvm-sriov/lib', 'ONE_AUTH=/srv/one/one_auth'],
          ).that_requires('Service[opennebula]')
        end
      end

      context 'without the hooks' do
        let(:params) { { source: '/opt/kvm-sriov', manage_hooks: false } }

        it { is_expected.to compile.with_all_deps }
        it { is_expected.not_to contain_exec('kvm_sriov-setup-hooks') }
      end

      context 'tuned MAD, restart and sync' do
        let(:params) do
          { source: '/opt/kvm-sriov', threads: 4, retries: 2, parallel: false, local_actions: ['poll'],
            keep_snapshots: false, oned_service: 'opennebula', onehost_sync: true, manage_templates: false }
        end

        it { is_expected.to contain_file('/etc/one/kvm-sriov-vm_mad.conf').with_content(%r{ARGUMENTS      = "-t 4 -r 2 -l poll kvm-sriov",$}).with_content(%r{KEEP_SNAPSHOTS = "no"}) }
        it { is_expected.to contain_exec('kvm_sriov-oned-restart').with(command: ['systemctl', 'try-restart', 'opennebula'], refreshonly: true).that_subscribes_to('Exec[kvm_sriov-oned-setup]') }
        it { is_expected.to contain_exec('kvm_sriov-onehost-sync').with(command: ['su', '-s', '/bin/sh', '-c', 'onehost sync --force', 'oneadmin']) }
        it { is_expected.not_to contain_file('/usr/share/kvm-sriov/templates') }
      end

      context 'from a package, the placer selected' do
        let(:params) { { package: 'opennebula-kvm-sriov', manage_sched_mad: true } }

        it { is_expected.to compile.with_all_deps }
        it { is_expected.to contain_package('opennebula-kvm-sriov') }
        it { is_expected.to contain_exec('kvm_sriov-oned-setup').with_command(%r{--templates /usr/share/kvm-sriov/templates }) }
        it { is_expected.to contain_exec('kvm_sriov-setup-hooks').with_command(%r{ --command /usr/lib/kvm-sriov/bin/kvm-sriov\\ network-hook$}) }
        it { is_expected.not_to contain_file('/usr/share/kvm-sriov/templates') }
      end

      context 'from a package without VM_MAD management' do
        let(:params) { { package: 'opennebula-kvm-sriov', manage_vm_mad: false } }

        it { is_expected.to contain_package('opennebula-kvm-sriov') }
        it { is_expected.not_to contain_exec('kvm_sriov-oned-setup') }
        it { is_expected.not_to contain_exec('kvm_sriov-oned-notice') }
        it { is_expected.to contain_exec('kvm_sriov-setup-hooks').that_requires('Kvm_sriov::Remotes[frontend]') }
        it { is_expected.not_to contain_file('/usr/share/kvm-sriov/templates') }
      end

      context 'error paths' do
        {
          'no source' => {},
          'a quote in the Sunstone name' => { source: '/opt/k', sunstone_name: 'a"b' },
          'zero threads' => { source: '/opt/k', threads: 0 },
          'a MAD name with a space' => { source: '/opt/k', mad_name: 'kvm sriov' },
          'the placer without the VM_MAD' => { source: '/opt/k', manage_sched_mad: true, manage_vm_mad: false },
          'a relative hooks command' => { source: '/opt/k', hooks_command: 'kvm-sriov network-hook' },
          'a quote in the hooks command' => { source: '/opt/k', hooks_command: '/bin/kvm-sriov "network-hook"' },
          'an endpoint that is not a URL' => { source: '/opt/k', one_xmlrpc: 'localhost:2633' },
        }.each do |what, bad|
          context "with #{what}" do
            let(:params) { bad }

            it { is_expected.to compile.and_raise_error(%r{.}) }
          end
        end
      end
    end
  end
end
