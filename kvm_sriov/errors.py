"""Errors that end an action with one clear reason for OpenNebula."""


class DriverError(Exception):
    """Base: the message is what the operator sees in the VM log."""


class ConfigError(DriverError):
    """The host configuration is missing, malformed or contradictory."""


class InputError(DriverError):
    """OpenNebula (or a person) handed us arguments or XML we must refuse."""


class PoolExhausted(DriverError):
    """Fewer free VFs than the VM asks for; nothing was allocated."""


class HypervisorError(DriverError):
    """libvirt refused or failed an operation."""
