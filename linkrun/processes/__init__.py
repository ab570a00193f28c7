"""A process group run and watched to its end, for a call and a supervisor alike."""
