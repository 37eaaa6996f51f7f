"""Versioned SQL migrations for PostgreSQL and SQLite, applied by `onward db migrate`.

The runner lives in the storage layer; these are its public names. The SQL lives in
``schemas/sql/NNNN_name.sql`` (PostgreSQL) and ``schemas/sqlite/NNNN_name.sql`` (SQLite), and
applied versions are recorded in ``onward_schema_migrations``.
"""

from onward._storage import (
    Dialect,
    Migration,
    expected_version,
    migrate_postgres,
    migrate_sqlite,
    migrations,
    schema_version_postgres,
    verify_postgres,
    verify_sqlite,
)

__all__ = [
    "Dialect",
    "Migration",
    "expected_version",
    "migrate_postgres",
    "migrate_sqlite",
    "migrations",
    "schema_version_postgres",
    "verify_postgres",
    "verify_sqlite",
]
