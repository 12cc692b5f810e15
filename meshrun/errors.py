"""The one error type for bad user input, so every caller can name the field at fault."""

from __future__ import annotations


class SpecError(ValueError):
    """A job spec that is impossible or inconsistent.

    ``field`` is the dotted path of the offending field (``spec.strategy.tensorParallel``) and
    ``rule`` a sentence saying what it must satisfy. The CLI prints ``str(e)`` and exits 2; the
    operator puts it in an ``Invalid`` condition.
    """

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule
