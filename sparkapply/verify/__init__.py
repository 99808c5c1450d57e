"""``sparkapply verify``: the mirror against the publisher at one exact LSN."""
