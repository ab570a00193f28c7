"""Serve's calls below the tool layer: what they are made with (setup.py) and their one owner (caller.py)."""
