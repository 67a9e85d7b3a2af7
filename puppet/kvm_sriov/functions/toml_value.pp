# @summary Render one value for the kvm-sriov host config TOML.
#
# Strings become TOML basic strings (backslash and double quote escaped;
# control characters are refused by the type), arrays become inline arrays;
# integers, floats and booleans are written as TOML literals.
#
# @param value The value to render.
# @return [String] The TOML text of the value.
# @example
#   kvm_sriov::toml_value(['0000:03:00.0', 'ib1']) # => '["0000:03:00.0", "ib1"]'
function kvm_sriov::toml_value(Kvm_sriov::Tomlvalue $value) >> String {
  $value ? {
    String  => sprintf('"%s"', regsubst($value, '(["\\\\])', '\\\\\1', 'G')),
    Array   => sprintf('[%s]', $value.map |$v| { kvm_sriov::toml_value($v) }.join(', ')),
    default => String($value),
  }
}
