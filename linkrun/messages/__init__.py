"""Telling the agent's conversation: the told message, its sending through the way in, the stand-in way in."""
