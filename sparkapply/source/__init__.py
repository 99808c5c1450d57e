"""The replication source: connection, slot, START_REPLICATION, feedback."""
