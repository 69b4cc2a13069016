"""Does not parse."""

def broken(:
    pass
