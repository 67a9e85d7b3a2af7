# @summary Merge free-form TOML settings with typed ones, dropping unset keys.
#
# Keys whose value is `undef` in `typed` are left out; set typed keys win
# over `settings`; sections left empty are dropped. Sections and keys come
# out sorted so the rendered file is stable.
#
# @param settings Free-form settings by section.
# @param typed Typed settings by section (values may be `undef`).
# @return [Hash] Sorted sections of set keys.
function kvm_sriov::merge_settings(
  Kvm_sriov::Settings $settings,
  Hash[String, Hash[String, Optional[Kvm_sriov::Tomlvalue]]] $typed,
) >> Hash {
  $set = $typed.map |$section, $keys| {
    [$section, $keys.filter |$k, $v| { $v =~ NotUndef }]
  }.convert_to(Hash)
  $names = ($settings.keys + $set.keys).unique.sort
  $merged = $names.map |$section| {
    $free = $settings[$section] ? { undef => {}, default => $settings[$section] }
    $typed_keys = $set[$section] ? { undef => {}, default => $set[$section] }
    $keys = $free + $typed_keys
    [$section, $keys.keys.sort.map |$k| { [$k, $keys[$k]] }.convert_to(Hash)]
  }
  $merged.filter |$pair| { !$pair[1].empty }.convert_to(Hash)
}
