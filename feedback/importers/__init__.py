"""Importers that turn other feedback formats into flywheel events."""
