"""sparkapply: a PostgreSQL logical-replication subscriber applying with Spark into Iceberg."""

from sparkapply import allocator

allocator.configure()  # before any module of the package loads pyarrow

__version__ = "0.1.0"
