"""Clients of remote agents."""
