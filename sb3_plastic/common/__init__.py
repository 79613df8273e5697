"""Machinery shared by every plastic algorithm."""
