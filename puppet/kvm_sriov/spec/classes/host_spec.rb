require 'spec_helper'

describe 'kvm_sriov::host' do
  on_supported_os.each do |os, os_facts|
    context "on #{os}" do
      let(:facts) { os_facts.merge(processors: (os_facts[:processors] || {}).merge('models' => ['Intel(R) Xeon(R) Gold 6230'])) }
      redhat = os_facts[:osfamily] == 'RedHat'

      context 'with defaults' do
        it { is_expected.to compile.with_all_deps }
        %w[iommu vfio vfs libvirt config shm].each do |c|
          it { is_expected.to contain_class("kvm_sriov::host::#{c}") }
        end

        it 'puts the Intel IOMMU on the GRUB command line' do
          is_expected.to contain_augeas('kvm_sriov-grub-cmdline').with(
            incl: '/etc/default/grub',
            lens: 'Shellvars_list.lns',
            changes: [
              "rm GRUB_CMDLINE_LINUX/value[. =~ regexp('intel_iommu=.*')][. != 'intel_iommu=on']",
              "set GRUB_CMDLINE_LINUX/value[. = 'intel_iommu=on'] 'intel_iommu=on'",
              "rm GRUB_CMDLINE_LINUX/value[. =~ regexp('iommu=.*')][. != 'iommu=pt']",
              "set GRUB_CMDLINE_LINUX/value[. = 'iommu=pt'] 'iommu=pt'",
            ],
          ).that_notifies('Exec[kvm_sriov-update-grub]')
        end
        it { is_expected.to contain_augeas('kvm_sriov-grub-cmdline-var').with_onlyif('match GRUB_CMDLINE_LINUX size == 0') }
        it 'regenerates the boot loader config with the OS command' do
          cmd = if redhat
                  %r{\A/usr/sbin/grub2-mkconfig -o /boot/grub2/grub.cfg}
                else
                  %r{\A/usr/sbin/update-grub\z}
                end
          is_expected.to contain_exec('kvm_sriov-update-grub').with(refreshonly: true, command: cmd)
        end
        if os_facts[:operatingsystemmajrelease] == '9' && redhat
          it { is_expected.to contain_exec('kvm_sriov-update-grub').with_command(%r{--update-bls-cmdline\z}) }
        end
        it 'says a reboot is needed when the command line changed' do
          is_expected.to contain_exec('kvm_sriov-reboot-notice')
            .with(refreshonly: true, command: %r{reboot to enable the IOMMU' && touch '/run/reboot-required'})
            .that_subscribes_to('Exec[kvm_sriov-update-grub]')
        end

        it 'loads vfio-pci now and at boot' do
          is_expected.to contain_file('/etc/modules-load.d/kvm-sriov.conf')
            .with_content(%r{^vfio\nvfio_iommu_type1\nvfio_pci\n\z})
          is_expected.to contain_exec('kvm_sriov-modprobe-vfio_pci')
            .with(command: 'modprobe vfio_pci', unless: "test -d '/sys/module/vfio_pci'")
        end

        it 'installs the VF helper and its boot unit, enabled, before libvirt' do
          is_expected.to contain_file('/usr/local/sbin/kvm-sriov-vfs')
            .with(mode: '0755', source: 'puppet:///modules/kvm_sriov/kvm-sriov-vfs')
          is_expected.to contain_file('/etc/systemd/system/kvm-sriov-vfs.service')
            .with_content(%r{^ExecStart=/usr/local/sbin/kvm-sriov-vfs boot /etc/kvm-sriov/vfs.d$})
            .with_content(%r{^Before=libvirtd.service })
            .with_content(%r{^Type=oneshot$})
          is_expected.to contain_file('/etc/systemd/system/multi-user.target.wants/kvm-sriov-vfs.service')
            .with(ensure: 'link', target: '/etc/systemd/system/kvm-sriov-vfs.service')
          is_expected.to contain_file('/etc/kvm-sriov/vfs.d').with(purge: true, recurse: true)
          is_expected.to contain_file('/etc/modprobe.d/kvm-sriov-mlx4.conf').with_ensure('absent')
        end

        it 'installs libvirt, QEMU and the Python the driver imports' do
          pkgs = redhat ? %w[libvirt-daemon-kvm qemu-kvm] : %w[libvirt-daemon-system qemu-system-x86]
          (pkgs + %w[python3-libvirt]).each do |p|
            is_expected.to contain_package(p)
          end
          is_expected.to contain_service('libvirtd').with(ensure: 'running', enable: true)
        end

        it 'gives /dev/vfio to the kvm group' do
          is_expected.to contain_file('/etc/udev/rules.d/70-kvm-sriov-vfio.rules')
            .with_content(%r{^SUBSYSTEM=="vfio", GROUP="kvm", MODE="0660"$})
        end

        it 'writes a host config with no keys (the cluster-wide file holds)' do
          is_expected.to contain_file('/etc/kvm-sriov/kvm-sriov.toml').with(owner: 'root', mode: '0644')
          content = catalogue.resource('file', '/etc/kvm-sriov/kvm-sriov.toml')[:content]
          expect(content).not_to match(%r{^\[})
          expect(content).to match(%r{^# Managed by Puppet})
        end

        it { is_expected.not_to contain_kvm_sriov__remotes('host') }
      end

      context 'with typed settings, free settings and PFs' do
        let(:params) do
          {
            pool_pfs: ['0000:03:00.0', 'mlx5_1'],
            numa_policy: 'require',
            state_dir: '/var/lib/one/kvm-sriov',
            reservation_grace_seconds: 120,
            skip_vfs_in_host_use: false,
            bridge: 'ib-sriov',
            lock_seconds: 30,
            partitions_file: '/etc/opensm/partitions.conf',
            settings: { 'pool' => { 'numa_policy' => 'ignore', 'extra' => 'x"y' }, 'sysfs' => { 'root' => '/' } },
            pfs: {
              '0000:03:00.0' => { 'numvfs' => 8, 'drivers_autoprobe' => false },
              'mlx5_1' => { 'numvfs' => 4 },
              '04:00.0' => { 'numvfs' => 7, 'driver' => 'mlx4' },
              '0000:05:00.0' => { 'numvfs' => 2, 'driver' => 'mlx4', 'drivers_autoprobe' => true },
            },
          }
        end

        it { is_expected.to compile.with_all_deps }

        it 'renders the TOML sorted, typed keys winning, strings escaped' do
          is_expected.to contain_file('/etc/kvm-sriov/kvm-sriov.toml').with_content(<<~TOML.chomp.then { |t| %r{#{Regexp.escape(t)}} })
            [infiniband]
            partitions_file = "/etc/opensm/partitions.conf"

            [network]
            bridge = "ib-sriov"

            [pool]
            extra = "x\\"y"
            numa_policy = "require"
            pfs = ["0000:03:00.0", "mlx5_1"]
            reservation_grace_seconds = 120
            skip_vfs_in_host_use = false
            state_dir = "/var/lib/one/kvm-sriov"

            [sysfs]
            root = "/"

            [timeouts]
            lock_seconds = 30
          TOML
        end

        it { is_expected.to contain_file('/var/lib/one/kvm-sriov').with(ensure: 'directory', owner: 'oneadmin', mode: '0750') }

        it 'declares one kvm_sriov::pf per PF' do
          is_expected.to contain_kvm_sriov__pf('0000:03:00.0').with(numvfs: 8, drivers_autoprobe: false)
          is_expected.to contain_kvm_sriov__pf('mlx5_1').with(numvfs: 4)
          is_expected.to contain_kvm_sriov__pf('04:00.0').with(numvfs: 7, driver: 'mlx4')
        end

        it 'writes the mlx4 VF options for every mlx4 PF in one line' do
          is_expected.to contain_file('/etc/modprobe.d/kvm-sriov-mlx4.conf')
            .with_content(%r{^options mlx4_core num_vfs=0000:04:00.0-7,0000:05:00.0-2 probe_vf=0000:04:00.0-0,0000:05:00.0-2 port_type_array=1,1$})
          is_expected.to contain_exec('kvm_sriov-mlx4-notice').that_subscribes_to('File[/etc/modprobe.d/kvm-sriov-mlx4.conf]')
        end

        it 'orders VFs before libvirt' do
          is_expected.to contain_exec('kvm_sriov-numvfs-mlx5_1').that_comes_before('Service[libvirtd]')
        end
      end

      context 'on an AMD host without passthrough, with an extra argument' do
        let(:facts) { os_facts.merge(processors: os_facts[:processors].merge('models' => ['AMD EPYC 7302 16-Core Processor'])) }
        let(:params) { { iommu_passthrough: false, extra_kernel_args: ['pci=realloc', 'nosmt'], reboot_required_file: false } }

        it 'uses amd_iommu and keeps other arguments' do
          is_expected.to contain_augeas('kvm_sriov-grub-cmdline').with_changes([
                                                                               "rm GRUB_CMDLINE_LINUX/value[. =~ regexp('amd_iommu=.*')][. != 'amd_iommu=on']",
                                                                               "set GRUB_CMDLINE_LINUX/value[. = 'amd_iommu=on'] 'amd_iommu=on'",
                                                                               "rm GRUB_CMDLINE_LINUX/value[. =~ regexp('pci=.*')][. != 'pci=realloc']",
                                                                               "set GRUB_CMDLINE_LINUX/value[. = 'pci=realloc'] 'pci=realloc'",
                                                                               "set GRUB_CMDLINE_LINUX/value[. = 'nosmt'] 'nosmt'",
                                                                             ])
          is_expected.to contain_exec('kvm_sriov-reboot-notice').with_command(%r{reboot to enable the IOMMU'\z})
        end
      end

      context 'with everything optional turned off' do
        let(:params) { { manage_iommu: false, manage_vfio: false, manage_libvirt: false, vfio_udev_rule: false } }

        it { is_expected.to compile.with_all_deps }
        it { is_expected.not_to contain_augeas('kvm_sriov-grub-cmdline') }
        it { is_expected.not_to contain_exec('kvm_sriov-update-grub') }
        it { is_expected.not_to contain_file('/etc/modules-load.d/kvm-sriov.conf') }
        it { is_expected.not_to contain_package('python3-libvirt') }
        it { is_expected.not_to contain_service('libvirtd') }
        it { is_expected.to contain_file('/etc/udev/rules.d/70-kvm-sriov-vfio.rules').with_ensure('absent') }
      end

      context 'with remotes from a source tree' do
        let(:params) { { remotes_source: '/opt/kvm-sriov' } }

        it { is_expected.to contain_kvm_sriov__remotes('host').with(remotes_dir: '/var/tmp/one', source: '/opt/kvm-sriov') }
        it { is_expected.to contain_file('/var/tmp/one/vmm/kvm-sriov').with(source: '/opt/kvm-sriov/vmm/kvm-sriov', recurse: true, purge: false) }
        it { is_expected.to contain_file('/var/tmp/one/vmm/kvm-sriov/lib/kvm_sriov').with_source('/opt/kvm-sriov/kvm_sriov') }
      end

      context 'with a /dev/shm size for shared-memory regions' do
        let(:params) { { shm_size: '8G' } }

        it 'puts the size into fstab and remounts /dev/shm when it changed' do
          is_expected.to contain_file_line('kvm_sriov-fstab-dev-shm')
            .with(path: '/etc/fstab', line: 'tmpfs /dev/shm tmpfs defaults,nosuid,nodev,size=8G 0 0',
                  match: '^\s*[^#\s]+\s+/dev/shm\s')
            .that_notifies('Exec[kvm_sriov-remount-dev-shm]')
          is_expected.to contain_exec('kvm_sriov-remount-dev-shm')
            .with(refreshonly: true, command: 'mount -o remount,size=8G /dev/shm')
        end
      end

      context 'without a /dev/shm size (the default)' do
        it { is_expected.not_to contain_file_line('kvm_sriov-fstab-dev-shm') }
        it { is_expected.not_to contain_exec('kvm_sriov-remount-dev-shm') }
      end

      context 'error paths' do
        {
          'a bad IOMMU vendor' => { iommu_vendor: 'arm' },
          'a quoted kernel argument' => { extra_kernel_args: ['a="b c"'] },
          'a bad NUMA policy' => { numa_policy: 'sometimes' },
          'too many VFs' => { pfs: { '0000:03:00.0' => { 'numvfs' => 300 } } },
          'an unknown PF key' => { pfs: { '0000:03:00.0' => { 'numvfs' => 2, 'colour' => 'red' } } },
          'a PF name with a slash' => { pfs: { '../../etc' => { 'numvfs' => 2 } } },
          'a multi-line setting' => { settings: { 'pool' => { 'x' => "a\nb" } } },
          'a relative config path' => { config_file: 'kvm-sriov.toml' },
          'a mlx4 PF by netdev' => { pfs: { 'ib0' => { 'numvfs' => 2, 'driver' => 'mlx4' } } },
          'both remotes source and package' => { remotes_source: '/opt/k', remotes_package: 'kvm-sriov' },
          'a /dev/shm size of 0' => { shm_size: '0' },
          'a /dev/shm size with a space' => { shm_size: '8 G' },
          'a /dev/shm size that is a word' => { shm_size: 'big' },
          'a /dev/shm size with options after it' => { shm_size: '8G,exec' },
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
