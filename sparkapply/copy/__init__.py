"""The initial copy: published tables read as of one snapshot, in Spark tasks, into Iceberg."""
