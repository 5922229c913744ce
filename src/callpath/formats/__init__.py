"""Readers and writers of on-disk formats. Each module handles one format."""
