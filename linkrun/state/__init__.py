"""The state folder's contract, below every process that shares it: its layout, the record, the whole write and the locks."""
