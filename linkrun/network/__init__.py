"""The agent's internet: its proxy, and what the rest needs of it."""
