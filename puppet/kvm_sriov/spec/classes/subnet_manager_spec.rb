require 'spec_helper'

describe 'kvm_sriov::subnet_manager' do
  on_supported_os.each do |os, os_facts|
    context "on #{os}" do
      let(:facts) { os_facts.merge(networking: { 'fqdn' => 'sm2.example.org', 'hostname' => 'sm2' }) }
      redhat = os_facts[:osfamily] == 'RedHat'
      conf = redhat ? '/etc/rdma/opensm.conf' : '/etc/opensm/opensm.conf'
      parts = redhat ? '/etc/rdma/partitions.conf' : '/etc/opensm/partitions.conf'

      context 'with defaults (this host is the SM)' do
        it { is_expected.to compile.with_all_deps }
        it { is_expected.to contain_package('opensm') }
        it 'enables virtualization, top priority, the partitions file' do
          is_expected.to contain_file(conf)
            .with_content(%r{^virt_enabled 2$})
            .with_content(%r{^sm_priority 15$})
            .with_content(%r{^partition_config_file #{parts}$})
        end
        it 'creates the partitions file only when absent, with the driver\'s Default line, and reloads opensm then' do
          is_expected.to contain_file(parts)
            .with(ensure: 'file', replace: false)
            .with_content(%r{^Default=0x7fff, ipoib : SELF=full, ALL_SWITCHES=full ;\n\z})
            .that_notifies('Exec[kvm_sriov-opensm-reload]')
        end
        it 'never makes every port a full member of the Default partition' do
          is_expected.not_to contain_file(parts).with_content(%r{ALL=full})
        end
        it 'leaves an existing file\'s owner and mode alone (the network hook wrote it)' do
          is_expected.to contain_file(parts).without_owner.without_group.without_mode
        end
        it { is_expected.not_to contain_exec('kvm_sriov-partitions') }
        it { is_expected.to contain_service('opensm').that_requires("File[#{parts}]") }
        it { is_expected.to contain_service('opensm').with(ensure: true, enable: true).that_subscribes_to("File[#{conf}]") }
        if redhat
          it { is_expected.not_to contain_file('/etc/default/opensm') }
          it { is_expected.to contain_exec('kvm_sriov-opensm-reload').with_command('systemctl kill --signal=HUP opensm.service') }
        else
          it { is_expected.to contain_file('/etc/default/opensm').with_content(%r{^PORTS="ALL"$}) }
          it { is_expected.to contain_exec('kvm_sriov-opensm-reload').with_command("systemctl kill --signal=HUP 'opensm@*.service'") }
        end
      end

      context 'second of three designated SMs, partitions from the driver' do
        let(:params) do
          { sm_hosts: ['sm1.example.org', 'sm2', 'sm3.example.org'], partitions_command: '/usr/bin/kvm-sriov partitions',
            ports: ['0x0002c9030002fce9'], options: { 'log_max_size' => 100, 'sweep_on_trap' => false } }
        end

        it { is_expected.to contain_file(conf).with_content(%r{^sm_priority 14$}).with_content(%r{^log_max_size 100\nsweep_on_trap FALSE\n\z}) }
        it 'keeps a default file until the generator works' do
          is_expected.to contain_file(parts).with(replace: false).with_content(%r{^Default=0x7fff, ipoib : SELF=full, ALL_SWITCHES=full ;$})
        end
        it 'regenerates the partitions when the output differs, moves them in place only once opensm accepted them, then reloads opensm' do
          is_expected.to contain_exec('kvm_sriov-partitions').with(
            command: "umask 022 && /usr/bin/kvm-sriov partitions > '#{parts}.new' && test -s '#{parts}.new' && " \
                     "/usr/bin/kvm-sriov partitions --validate '#{parts}.new' && mv -f '#{parts}.new' '#{parts}' || " \
                     "{ rm -f '#{parts}.new'; exit 1; }",
            unless: "/usr/bin/kvm-sriov partitions | cmp -s - '#{parts}'",
          ).that_notifies('Exec[kvm_sriov-opensm-reload]')
        end
        it { is_expected.to contain_package(redhat ? 'ibsim' : 'libumad2sim0').that_comes_before('Exec[kvm_sriov-partitions]') }
        it { is_expected.to contain_service('opensm').with(ensure: true) }
        it { is_expected.to contain_file('/etc/default/opensm').with_content(%r{^PORTS="0x0002c9030002fce9"$}) } unless redhat
      end

      context 'an own validator, service left alone' do
        let(:params) { { partitions_command: 'gen', validate_command: 'check-it', manage_service: false } }

        it { is_expected.to contain_exec('kvm_sriov-partitions').with_command(%r{ && check-it '#{parts}.new' && }) }
        it { is_expected.not_to contain_service('opensm') }
      end

      context 'a partitions_command that runs the local CLI directly' do
        ['kvm-sriov partitions', '/opt/kvm-sriov/bin/kvm-sriov --config /etc/x.toml partitions --from-xml /x.xml'].each do |cmd|
          context cmd do
            let(:params) { { partitions_command: cmd } }

            it { is_expected.to contain_exec('kvm_sriov-partitions').with_command(%r{ && #{Regexp.escape(cmd)} --validate '#{parts}.new' && }) }
          end
        end
      end

      context 'a wrapper around the CLI (ssh, a script) without its own validator' do
        [
          'ssh sm-fe kvm-sriov partitions',
          '/usr/local/bin/partitions-from-fe',
          'sudo /usr/bin/kvm-sriov partitions',
          '/usr/bin/kvm-sriov status',
          '/usr/bin/kvm-sriov partitions | tee /var/log/p',
          '/usr/bin/kvm-sriov partitions; true',
          '/usr/bin/kvm-sriov partitions --from-xml $(mktemp)',
        ].each do |cmd|
          context cmd do
            let(:params) { { partitions_command: cmd } }

            it { is_expected.to compile.and_raise_error(%r{is not the local kvm-sriov CLI.*set validate_command}) }
          end
        end
      end

      context 'a wrapper with its own validator' do
        let(:params) { { partitions_command: 'ssh sm-fe kvm-sriov partitions', validate_command: '/opt/kvm-sriov/bin/kvm-sriov partitions --validate' } }

        it { is_expected.to contain_exec('kvm_sriov-partitions').with_command(%r{ && /opt/kvm-sriov/bin/kvm-sriov partitions --validate '#{parts}.new' && }) }
      end

      context 'the Default partition\'s members as in the driver\'s config' do
        let(:params) { { default_partition_members: ['SELF=full', 'ALL_SWITCHES=full', '0x0002c9030002fce9=full', 'ALL_CAS=limited'] } }

        it { is_expected.to contain_file(parts).with_content(%r{^Default=0x7fff, ipoib : SELF=full, ALL_SWITCHES=full, 0x0002c9030002fce9=full, ALL_CAS=limited ;$}) }
      end

      context 'an operator who opts out of the partitions file' do
        let(:params) { { create_partitions_file: false } }

        it { is_expected.to compile.with_all_deps }
        it { is_expected.not_to contain_file(parts) }
        it { is_expected.to contain_service('opensm').with(ensure: true, require: []) }

        context 'with a partitions_command' do
          let(:params) { { create_partitions_file: false, partitions_command: '/usr/bin/kvm-sriov partitions' } }

          it { is_expected.to compile.with_all_deps }
          it { is_expected.not_to contain_file(parts) }
          it { is_expected.to contain_exec('kvm_sriov-partitions').that_notifies('Exec[kvm_sriov-opensm-reload]') }
        end
      end

      context 'the former partitions parameter set in Hiera' do
        let(:hiera_config) { File.join(__dir__, '..', 'fixtures', 'hiera', 'former_partitions.yaml') }

        it { is_expected.to compile.and_raise_error(%r{partitions is no longer read: .*set default_partition_members instead}) }
      end

      context 'not a designated SM' do
        let(:params) { { sm_hosts: ['sm1.example.org'] } }

        it { is_expected.to contain_service('opensm').with(ensure: false, enable: false) }
      end

      context 'explicit priority' do
        let(:params) { { sm_hosts: ['sm2.example.org'], priority: 3, virt_enabled: 0 } }

        it { is_expected.to contain_file(conf).with_content(%r{^sm_priority 3$}).with_content(%r{^virt_enabled 0$}) }
      end

      context 'error paths' do
        {
          'priority 16' => { priority: 16 },
          'virt_enabled 3' => { virt_enabled: 3 },
          'sm_priority in options' => { options: { 'sm_priority' => 1 } },
          'a bad port GUID' => { ports: ['0x12'] },
          'the former partitions parameter' => { partitions: ['Default=0x7fff, ipoib : ALL=full ;'] },
        }.each do |what, bad|
          context "with #{what}" do
            let(:params) { bad }

            it { is_expected.to compile.and_raise_error(%r{.}) }
          end
        end
        {
          'no Default partition members' => [],
          'every port a full member of the Default partition' => ['ALL=full'],
          'every CA a full member of the Default partition' => ['SELF=full', 'ALL_CAS=full'],
          'a member that ends the line' => ['SELF=full ; evil=0x8001 : ALL=full'],
          'a member on two lines' => ["SELF=full\nevil=0x8001 : ALL=full ;"],
        }.each do |what, members|
          context "with #{what}" do
            let(:params) { { default_partition_members: members } }

            it { is_expected.to compile.and_raise_error(%r{default_partition_members}) }
          end
        end
      end
    end
  end
end
