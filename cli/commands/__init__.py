"""Commands of the `flywheel` CLI that own enough options to live in their own module."""
