# @summary A value the host config TOML may hold (see kvm_sriov::toml_value).
#   Strings are single-line: control characters are refused.
type Kvm_sriov::Tomlvalue = Variant[
  Pattern[/\A[^\x00-\x1f\x7f]*\z/],
  Integer,
  Boolean,
  Array[Variant[Pattern[/\A[^\x00-\x1f\x7f]*\z/], Integer, Boolean]],
]
