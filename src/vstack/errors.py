class VstackError(Exception):
    """A user-facing failure: printed as one line, exit status 1, nothing changed."""
