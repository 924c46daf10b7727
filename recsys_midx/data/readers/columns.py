"""Which raw columns hold the user, item, time and rating of an interaction."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The fields of an interaction, in order; ``user`` and ``item`` need a column, ``time`` must be
#: given but may be None, ``rating`` is optional.
FIELDS = ("user", "item", "time", "rating")


@dataclass(frozen=True)
class ColumnMap:
    """Which raw column holds each field of an interaction.

    A field may name several columns: the first non-empty one of each row is taken (e.g. a track
    id, or the artist id where the track id is missing).

    Attributes:
        user: column(s) of the user id.
        item: column(s) of the item id.
        time: column(s) of the time: seconds since the epoch (integer or decimal) or an ISO 8601
            date or date-time (``2010-10-19``, ``2010-10-19 23:55:27``, ``2010-10-19T23:55:27Z``,
            with or without a zone offset; without one it is taken as UTC). None when the data
            has no time: the order of the rows then stands for it.
        rating: column(s) of the rating, or None when there is none.

    Example:
        >>> ColumnMap(user="uid", item="sku", time="ts").wanted()
        ['uid', 'sku', 'ts']
    """

    user: str | tuple[str, ...]
    item: str | tuple[str, ...]
    time: str | tuple[str, ...] | None
    rating: str | tuple[str, ...] | None = None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> ColumnMap:
        """Build from a mapping such as a Hydra ``DictConfig`` (lists become tuples).

        Args:
            mapping: ``user``, ``item``, ``time`` (None: the data has no time) and optionally
                ``rating``.

        Returns:
            The column map.

        Raises:
            ValueError: a field is unknown, ``user`` or ``item`` is empty, or ``time`` is not
                given (a missing time column must be said explicitly, with None).
        """
        fields = dict(mapping)
        unknown = sorted(set(fields) - set(FIELDS))
        missing = [name for name in FIELDS[:2] if not fields.get(name)]
        if "time" not in fields or (fields["time"] is not None and not fields["time"]):
            missing.append("time")
        if unknown or missing:
            raise ValueError(
                f"columns must map user, item, time (null when there is none) and optionally "
                f"rating; unknown: {unknown}, missing: {missing}"
            )
        return cls(
            **{
                name: value if isinstance(value, str) or value is None else tuple(value)
                for name, value in fields.items()
            }
        )

    def sources(self) -> dict[str, tuple[str, ...]]:
        """The raw columns of each mapped field, in order of preference."""
        out = {}
        for name in FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = (value,) if isinstance(value, str) else tuple(value)
        return out

    def wanted(self) -> list[str]:
        """Every raw column the map reads, each once, in field order."""
        return list(dict.fromkeys(c for columns in self.sources().values() for c in columns))

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form (part of a source's fingerprint)."""
        return {name: list(columns) for name, columns in self.sources().items()}
