"""The driver's rung-2 fixtures (a private libvirtd, the installed remotes, a
configured driver caller), shared rather than copied."""

from tests.driver import test_actions_libvirtd as _rung2

lvhost = _rung2.lvhost
remotes = _rung2.remotes
driver = _rung2.driver
