"""``x-launch migrate``: rewriting a script's imports from Accelerate to x, merging the imports it
writes, rewriting its PEP 723 metadata, flagging uses of removed Accelerate names, and the names each
x package exports.
"""

from x_launch.migrate.rewrite import MigrateError, migrate_file

__all__ = ["MigrateError", "migrate_file"]
