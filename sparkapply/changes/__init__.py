"""Transaction assembly: relation cache, spool, prepared store, committed transactions."""
