"""adaptord: the local spool daemon around the adaptor SDK."""
