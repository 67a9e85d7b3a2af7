# The library's layering: imports in kvm_sriov/ run one way, top to bottom,
# with no circle (the order is declared in dev-tools/check_imports.py).

Support.lint('imports', order: 12, desc: 'kvm_sriov/ imports: no upward import, no circle') do |name|
  Support.logged(name, Support::SYSTEM_PYTHON, 'dev-tools/check_imports.py')
end
