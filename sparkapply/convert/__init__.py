"""PostgreSQL types and values to Arrow/Iceberg, and schema evolution rules."""
