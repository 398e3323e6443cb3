"""Errors that reach users. Each says what was wrong and where (file, column, row)."""


class DpsynthError(Exception):
    """Base class: the CLI prints these as one clear line and exits non-zero."""


class ConfigError(DpsynthError):
    """A config file or value is invalid."""


class DataError(DpsynthError):
    """Input data is missing, malformed or out of bounds."""


class BudgetExceededError(DpsynthError):
    """A mechanism would take the ledger's total (epsilon, delta) over its budget."""
