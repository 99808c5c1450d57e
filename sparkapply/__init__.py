"""sparkapply: a PostgreSQL logical-replication subscriber applying with Spark into Iceberg."""

__version__ = "0.1.0"
