"""Optional host components built on the adaptor SDK."""
