"""Relational operators (sort, groupby/aggregate, join, union, unique, random_shuffle,
repartition, split) as plan sources, their schemas, and the seeded row hash."""

from feedline.plan.relational import (
    AGG_FUNCTIONS,
    JOIN_HOWS,
    OPERATORS,
    Relational,
    RelationalSource,
    plan_lines,
    split_bounds,
)
from feedline.plan.rowhash import ROW_HASH_COLUMN, row_hash

__all__ = [
    "AGG_FUNCTIONS",
    "JOIN_HOWS",
    "OPERATORS",
    "ROW_HASH_COLUMN",
    "Relational",
    "RelationalSource",
    "plan_lines",
    "row_hash",
    "split_bounds",
]
