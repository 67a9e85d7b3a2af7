# @summary TOML settings by section: `{ 'pool' => { 'numa_policy' => 'require' } }`.
type Kvm_sriov::Settings = Hash[Pattern[/\A[a-z][a-z0-9_]*\z/], Hash[Pattern[/\A[a-z][a-z0-9_]*\z/], Kvm_sriov::Tomlvalue]]
