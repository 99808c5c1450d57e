"""The Spark side: session, executor tasks, and the driver half of an apply."""
