"""The composition root: recipes composing the policies, and the clients built from the settings."""
