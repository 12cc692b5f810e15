"""The one error type for bad user input, so every caller can name the field at fault, and the
CEL rules of the CRD restated as values (meshrun.rules.strategy holds them)."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class Rule:
    """A rule of the CRD's CEL, restated: the field it blames and the CRD's message."""

    field: str
    """The dotted spec field the error names."""
    message: str
    """The CRD's message, word for word."""

    def error(self, detail: str = "") -> SpecError:
        """The SpecError for this rule, with the numbers at hand in ``detail``.

        A message that starts with its own field is not repeated after the ``field:`` prefix,
        nor one that starts with a field inside it (``spec.strategy: dataParallel x ...``).
        """
        rule = self.message.removeprefix(f"{self.field} ").removeprefix(f"{self.field}.")
        return SpecError(self.field, f"{rule}{f' ({detail})' if detail else ''}")
