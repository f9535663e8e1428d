"""The command line, `flywheel`: the roof of the house, calling the same stages as the flows."""
